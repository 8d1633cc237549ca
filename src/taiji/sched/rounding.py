"""PCRR's rounding: from the LP's fractions to one configuration (or none) per job for the next slot.

Steps (docs/reference/scheduler-model.md#rounding, docs/reference/scheduler-model.md#pcrr): α-point order →
randomized rounding of the first slot → waiting jobs the scheduler cannot tell apart served first come, first
served (:func:`first_come_among_equals`) → hysteresis (keep a running job's configuration unless the change is
worth more than its resize cost) → greedy placement in that order with repair (capacity is never exceeded; a
running job the repair would change is kept instead when its whole resize costs the first slot more) →
work-conserving fill of leftover GPUs. Everything is a pure function of (problem, LP solution, seed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .lp import Config, Job, LPSolution, Placement, Problem, predicted_completion_s, solve_lp

WORK_TOLERANCE = 0.05  # waiting jobs with this much the same remaining work are identical requests ...
SPEED_NOISE = 2.0  # ... unless their speeds differ by this factor: more than noise (first_come_among_equals)


@dataclass(frozen=True)
class Assignment:
    """What ``job`` runs in the next slot: ``config`` indexes its configurations (``None``: nothing),
    on ``placement``; ``how`` says which step chose it: "lp" (rounded), "kept" (hysteresis or the
    rounding kept the current one), "repaired" (downgraded to fit), "filled" (leftover GPUs), "none"."""

    job: str
    config: int | None
    placement: Placement
    changed: bool
    how: str


@dataclass(frozen=True, eq=False)
class Schedule:
    assignments: tuple[Assignment, ...]
    order: tuple[str, ...]  # α-point order (placement priority)
    free_gpus: tuple[int, ...]  # per host, after these assignments
    repaired: int  # rounded choices that did not fit and were downgraded or dropped
    kept_by_hysteresis: int  # rounded changes undone because they were not worth the resize
    lp: LPSolution
    decide_s: float  # LP + rounding, seconds

    def by_job(self) -> dict[str, Assignment]:
        return {d.job: d for d in self.assignments}


def alpha_point_times(problem: Problem, solution: LPSolution, alphas: np.ndarray) -> np.ndarray:
    """Seconds from now at which the LP has done an ``alphas[j]`` fraction of job j's remaining work
    (interpolated inside the slot); past the horizon, extrapolated at the job's best rate."""
    starts = np.concatenate([[0.0], problem.horizon.ends_s])
    slots = np.asarray(problem.horizon.slots_s)
    times = np.empty(len(problem.jobs))
    for j, job in enumerate(problem.jobs):
        done = np.concatenate([[0.0], solution.done[j]])
        reached = np.flatnonzero(done[1:] >= alphas[j] - 1e-9)
        if reached.size:
            t = int(reached[0])
            gained = done[t + 1] - done[t]
            within = (alphas[j] - done[t]) / gained if gained > 0 else 0.0
            times[j] = starts[t] + slots[t] * min(1.0, max(0.0, within))
        else:
            times[j] = starts[-1] + (alphas[j] - done[-1]) * job.remaining / job.best_rate
    return times


def round_first_slot(
    solution: LPSolution, jobs: tuple[Job, ...], uniforms: np.ndarray, conditional: bool = False
) -> list[int | None]:
    """Job j runs config k with probability ``x[j,k,0]`` and nothing with the rest, one uniform draw
    per job. Not normalised, so expected GPU use per host equals the LP's (the Chernoff argument).
    ``conditional``: every job the LP runs at all in the first slot runs, config k with probability
    ``x[j,k,0] / Σ_k x[j,k,0]`` (α-point list scheduling: the placement order, not a coin, decides
    who runs, so a job the LP finishes in part of the slot is not left waiting by the draw)."""
    choices: list[int | None] = []
    for j, job in enumerate(jobs):
        cumulative = np.cumsum(solution.x[j, : len(job.configs), 0])
        if conditional:
            if cumulative[-1] <= 1e-6:
                choices.append(None)
                continue
            cumulative = cumulative / cumulative[-1]
        k = int(np.searchsorted(cumulative, uniforms[j], side="right"))
        choices.append(k if k < len(job.configs) else None)
    return choices


def first_come_among_equals(
    jobs: tuple[Job, ...],
    order: list[int],
    rounded: list[int | None],
    work_tolerance: float = WORK_TOLERANCE,
    speed_noise: float = SPEED_NOISE,
) -> tuple[list[int], list[int | None]]:
    """Identical waiting jobs are served first come, first served.

    Two jobs are identical requests here when neither runs, they have the same weight and the same
    candidate shapes, the same remaining work (within ``work_tolerance``, relative) and best-case
    remaining times (``remaining / best_rate``) less than ``speed_noise`` times apart. The LP would
    order them by their speeds alone, and those do not tell such jobs apart: a waiting job that never
    ran has a guessed one (live: a typical job's), and identical jobs measured on shared hosts differ
    by their neighbours' interference (two identical jobs of ``benchmarks/sched_live.py`` measured
    40% apart). So which of two identical jobs ran first followed noise and the order the jobs were
    listed in, and a replay of a live run, with speeds measured afterwards, ran them the other way.
    Groups are chained from the least work; within each, the places the group holds in ``order``
    and the configurations rounded for those places go to its members in arrival order (then name):
    the same use of the cluster, deterministic and fair. Pure: returns the new order and rounded
    configurations."""

    def shapes(job: Job) -> tuple:
        return tuple((c.gpus, c.placement) for c in job.configs)

    def seconds(j: int) -> float:
        return jobs[j].remaining / max(jobs[j].best_rate, 1e-12)

    def identical(first: int, j: int) -> bool:
        longer, shorter = max(seconds(first), seconds(j)), min(seconds(first), seconds(j))
        return (
            jobs[j].remaining <= jobs[first].remaining * (1.0 + work_tolerance)
            and longer < speed_noise * shorter
        )

    order, rounded = list(order), list(rounded)
    kinds: dict[tuple, list[int]] = {}
    for j in order:
        if jobs[j].current is None:
            kinds.setdefault((jobs[j].weight, shapes(jobs[j])), []).append(j)
    for members in kinds.values():
        groups: list[list[int]] = []
        for j in sorted(members, key=lambda j: (jobs[j].remaining, seconds(j))):
            if groups and identical(groups[-1][0], j):
                groups[-1].append(j)
            else:
                groups.append([j])
        for group in (g for g in groups if len(g) > 1):
            places = sorted(order.index(j) for j in group)
            roles = [rounded[order[p]] for p in places]
            for place, role, j in zip(
                places, roles, sorted(group, key=lambda j: (jobs[j].arrival, jobs[j].name))
            ):
                order[place], rounded[j] = j, role
    return order, rounded


def _rate(job: Job, config: int | None) -> float:
    return 0.0 if config is None else job.configs[config].rate


def _gpus_by_host(config: Config | None, n_hosts: int) -> np.ndarray:
    gpus = np.zeros(n_hosts)
    for h, g in config.placement if config is not None else ():
        gpus[h] = g
    return gpus


def change_gain(problem: Problem, solution: LPSolution, job: Job, new: int | None) -> float:
    """Weighted seconds a change from ``job.current`` to ``new`` is predicted to save over the horizon:
    the job's own completion gain plus the LP's price of the GPUs the change frees (negative when it
    takes GPUs), so a shrink that lets others run can be worth it. Hysteresis compares it with the
    resize cost."""
    horizon = problem.horizon
    own = job.weight * (
        predicted_completion_s(job, _rate(job, job.current), horizon)
        - predicted_completion_s(job, _rate(job, new), horizon)
    )
    old_cfg = job.configs[job.current] if job.current is not None else None
    new_cfg = job.configs[new] if new is not None else None
    n_hosts = len(problem.hosts)
    freed_total = (old_cfg.gpus if old_cfg else 0) - (new_cfg.gpus if new_cfg else 0)
    # An external configuration has no hosts yet: like in the LP, it is priced on aggregate capacity only.
    freed = _gpus_by_host(old_cfg, n_hosts) - _gpus_by_host(new_cfg, n_hosts)
    prices = (
        float(solution.host_price.sum(axis=1) @ freed) + float(solution.aggregate_price.sum()) * freed_total
    )
    return own + prices


class _Placer:
    """Free GPUs per host; places configurations without ever going below zero."""

    def __init__(self, problem: Problem):
        self.free = np.array([h.gpus for h in problem.hosts], dtype=int)

    def place(self, config: Config) -> Placement | None:
        """Claim GPUs for ``config`` and return where; ``None`` (nothing claimed) if it does not fit.
        Flexible configurations go on one host if any fits (the fullest that does), otherwise on the
        hosts with most free GPUs first, so they span as few hosts as possible."""
        if config.placement:
            if any(self.free[h] < g for h, g in config.placement):
                return None
            placement = config.placement
        else:
            if self.free.sum() < config.gpus:
                return None
            single = np.flatnonzero(self.free >= config.gpus)
            if single.size:
                host = int(single[np.argmin(self.free[single])])
                placement = ((host, config.gpus),)
            else:
                needed, taken = config.gpus, []
                for h in sorted(range(len(self.free)), key=lambda h: (-self.free[h], h)):
                    take = int(min(needed, self.free[h]))
                    if take:
                        taken.append((h, take))
                        needed -= take
                    if needed == 0:
                        break
                placement = tuple(sorted(taken))
        for h, g in placement:
            self.free[h] -= g
        return placement

    def release(self, placement: Placement) -> None:
        for h, g in placement:
            self.free[h] += g

    def reclaim(self, placement: Placement) -> None:
        """Undo ``release`` right after it: those GPUs were free a moment ago, so this cannot overdraw."""
        for h, g in placement:
            self.free[h] -= g


def _downgrade(placer: _Placer, job: Job, wanted: int) -> tuple[int, Placement] | None:
    """The fastest of the job's configurations, no faster than ``wanted``, that still fits."""
    limit = job.configs[wanted].rate
    for k in sorted(range(len(job.configs)), key=lambda k: (-job.configs[k].rate, job.configs[k].gpus, k)):
        if k != wanted and job.configs[k].rate <= limit:
            placement = placer.place(job.configs[k])
            if placement is not None:
                return k, placement
    return None


def _fill(
    problem: Problem,
    placer: _Placer,
    chosen: list[int | None],
    where: list[Placement],
    how: list[str],
    order: list[int],
    hysteresis: float,
) -> None:
    """Work-conserving fill: while leftover GPUs can speed a job up, move the job to the faster
    configuration with the largest weighted completion gain per extra GPU, net of the resize cost
    when it changes a running job's configuration (the Optimus marginal-gain rule)."""
    horizon = problem.horizon
    rank = {j: i for i, j in enumerate(order)}

    def resize_charge(job: Job, config: int | None) -> float:
        return hysteresis * job.weight * job.change_cost_s(config)

    while True:
        options = []
        for j, job in enumerate(problem.jobs):
            now = chosen[j]
            now_s = predicted_completion_s(job, _rate(job, now), horizon)
            now_gpus = job.configs[now].gpus if now is not None else 0
            for k, config in enumerate(job.configs):
                if config.rate <= _rate(job, now):
                    continue
                gain = (
                    job.weight * (now_s - predicted_completion_s(job, config.rate, horizon))
                    - resize_charge(job, k)
                    + resize_charge(job, now)
                )
                if gain > 0:
                    options.append((-gain / max(1, config.gpus - now_gpus), rank[j], k, j))
        options.sort()
        moved: set[int] = set()
        for _, _, k, j in options:
            if j in moved:
                continue
            placer.release(where[j])
            placement = placer.place(problem.jobs[j].configs[k])
            if placement is None:
                placer.reclaim(where[j])
                continue
            chosen[j], where[j], how[j] = k, placement, "filled"
            moved.add(j)
        if not moved:
            return


_Placed = tuple[_Placer, list, list, list, int]  # placer, chosen config, placement, how, repaired count


def _place(problem: Problem, sequence: list[int], target: list[int | None]) -> _Placed:
    """Place every job's ``target`` in ``sequence``; one that does not fit is downgraded or dropped."""
    jobs = problem.jobs
    placer = _Placer(problem)
    chosen: list[int | None] = [None] * len(jobs)
    where: list[Placement] = [()] * len(jobs)
    how = ["none"] * len(jobs)
    repaired = 0
    for j in (j for j in sequence if target[j] is not None):
        k = target[j]
        assert k is not None
        placement = placer.place(jobs[j].configs[k])
        if placement is not None:
            chosen[j], where[j] = k, placement
            how[j] = "kept" if k == jobs[j].current else "lp"
            continue
        repaired += 1
        fallback = _downgrade(placer, jobs[j], k)
        if fallback is not None:
            (chosen[j], where[j]), how[j] = fallback, "repaired"
    return placer, chosen, where, how, repaired


def slot_loss(problem: Problem, chosen: list[int | None]) -> float:
    """Weighted seconds by which ``chosen`` delays the jobs in the first slot: a running job that
    changes pauses its whole resize time (one left without GPUs: its suspend + resume); every job
    loses the part of the slot its configuration trains slower than its best one (at the best rate
    afterwards, that is how much later it ends)."""
    slot = problem.horizon.slots_s[0]
    loss = 0.0
    for job, k in zip(problem.jobs, chosen):
        loss += job.weight * (job.change_cost_s(k) + slot * (1.0 - _rate(job, k) / job.best_rate))
    return loss


def _keep_displaced(
    problem: Problem, sequence: list[int], target: list[int | None], placed: _Placed
) -> _Placed:
    """Charge a displacement what it costs. The LP prices a running job's change at the part of the
    first slot it time-shares (``z ≥ 1 − v[cur,0] − u[0]``), but when the rounding keeps its current
    configuration and a job earlier in α-point order takes its GPUs, the repair changes it in full: it
    pays its whole resize. So each running job displaced that way is placed first instead — kept —
    whenever that costs the first slot less (:func:`slot_loss`) than the repair; the jobs it then
    keeps out wait or are downgraded."""
    jobs = problem.jobs
    for j in sequence:
        chosen = placed[1]
        if jobs[j].current is None or target[j] != jobs[j].current or chosen[j] == jobs[j].current:
            continue
        keeping = _place(problem, [j] + [i for i in sequence if i != j], target)
        if slot_loss(problem, keeping[1]) < slot_loss(problem, chosen):
            placed = keeping
            sequence = [j] + [i for i in sequence if i != j]
    return placed


def decide(
    problem: Problem,
    solution: LPSolution | None = None,
    *,
    seed: int,
    alpha: float | None = 0.5,
    hysteresis: float | None = 1.0,
    time_limit_s: float | None = None,
    method: str = "highs",
    keep_first: bool = True,
    conditional: bool = False,
    keep_share: float | None = None,
) -> Schedule:
    """PCRR's decision for the next slot. Solves the LP unless ``solution`` is given. ``alpha``: the
    α of the α-points (``None``: one uniform in (0, 1] per job, the randomized variant). ``hysteresis``
    κ: a running job changes only if the predicted gain exceeds κ·weight·resize cost. ``keep_first``:
    place the jobs that keep their configuration before the others; ``False`` places everyone in
    α-point order (list scheduling), so a kept job later in that order is repaired when an earlier
    job took its GPUs. ``conditional``: see :func:`round_first_slot`. ``hysteresis=None`` skips that
    gain test (the LP's objective already charges a change its resize cost; the fill still charges it
    once) and ``keep_share`` makes the rounding sticky instead: a running job keeps its configuration,
    without a draw, when the LP gives it at least that share of the job's first-slot mass. Same
    inputs and seed → same schedule."""
    started = time.perf_counter()
    if solution is None:
        solution = solve_lp(problem, time_limit_s=time_limit_s, method=method)
    jobs = problem.jobs
    rng = np.random.default_rng(seed)
    alphas = np.full(len(jobs), alpha) if alpha is not None else 1.0 - rng.random(len(jobs))
    uniforms = rng.random(len(jobs))
    if solution.optimal:
        times = alpha_point_times(problem, solution, alphas)
        rounded = round_first_slot(solution, jobs, uniforms, conditional)
    else:
        # No LP: order by weighted shortest processing time and let the fill hand out GPUs.
        times = np.array([job.remaining / job.best_rate / job.weight for job in jobs])
        rounded = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda j: (times[j], -jobs[j].weight, jobs[j].arrival, jobs[j].name))
    order, rounded = first_come_among_equals(jobs, order, rounded)

    # Hysteresis: a running job keeps its configuration unless the change pays for its resize
    # (gain test), or unless the LP itself moved most of its first slot elsewhere (keep_share).
    target, kept = list(rounded), 0
    for j, job in enumerate(jobs):
        if job.current is None or rounded[j] == job.current:
            continue
        mass = solution.x[j, : len(job.configs), 0]
        sticky = (
            keep_share is not None
            and solution.optimal
            and mass.sum() > 1e-6
            and mass[job.current] >= keep_share * mass.sum()
        )
        if sticky or (
            hysteresis is not None
            and change_gain(problem, solution, job, rounded[j])
            <= hysteresis * job.weight * job.change_cost_s(rounded[j])
        ):
            target[j] = job.current
            kept += 1

    # Placement: by default jobs keeping their configuration first (they held it, so it fits unless
    # capacity shrank), then the rest in α-point order; what does not fit is downgraded or dropped.
    # sorted() is stable: with keep_first, kept jobs first and both groups still in α-point order
    sequence = sorted(order, key=lambda j: target[j] != jobs[j].current) if keep_first else order
    placed = _place(problem, sequence, target)
    if not keep_first:
        placed = _keep_displaced(problem, sequence, target, placed)
    placer, chosen, where, how, repaired = placed

    _fill(problem, placer, chosen, where, how, order, 1.0 if hysteresis is None else hysteresis)
    assignments = tuple(
        Assignment(job.name, chosen[j], where[j], chosen[j] != job.current, how[j])
        for j, job in enumerate(jobs)
    )
    return Schedule(
        assignments,
        tuple(jobs[j].name for j in order),
        tuple(int(f) for f in placer.free),
        repaired,
        kept,
        solution,
        time.perf_counter() - started,
    )
