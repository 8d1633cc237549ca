"""PCRR's LP: the time-indexed packing/covering relaxation of weighted completion time
(docs/reference/scheduler-model.md#packing-covering, docs/reference/scheduler-model.md#pcrr).

Plain frozen inputs (hosts, jobs with a few candidate configurations, a horizon of slots), one sparse LP
solved by HiGHS through SciPy, and a frozen solution: the fraction of each slot each job runs each
configuration, the work fraction done by the end of each slot, a completion estimate per job and the
capacity prices (duals) that ``rounding`` uses to weigh a change against its resize cost.

Variables per job j: ``v[j,k,t]`` ∈ [0,1], the fraction of slot t that j runs configuration k, and
``u[j,t]`` ∈ [0,1], the probability mass of "j completes in slot t" for t < T, with ``u[j,T]`` the mass
of "j completes after the horizon". With ``a[j,k,t]`` the work one full slot of k does:

    min  Σ_j ω_j ( Σ_{t<T} end_t u[j,t] + L u[j,T] + (D_j − W_j) / r_j^best )      W_j = Σ a v
    s.t. Σ_t u[j,t] = 1                                                    (covering: j completes)
         Σ_k v[j,k,t] ≤ Σ_{t'≥t} u[j,t']                                  (runs only until it completes)
         D_j Σ_{t'≤t} u[j,t'] ≤ Σ_{t'≤t} Σ_k a[j,k,t'] v[j,k,t']         (covering: work done by completion)
         W_j ≤ D_j                                                         (no credit for surplus work)
         Σ_{j,k} g[j,k,h] v[j,k,t] ≤ (1−ε) C_h           ∀h,t               (packing: fixed placements)
         Σ_{j,k} g[j,k] v[j,k,t] ≤ (1−ε) Σ_h C_h        ∀t                 (packing: all, incl. external)

For a job that completes in the horizon W_j = D_j, so the last term vanishes; for one that does not, it
is an optimistic estimate of the time after the horizon, which gives long jobs credit for progress (a
fixed tail cost would let the LP starve them).

A running job's change (another configuration in any slot, or not its current one in the first slot,
which includes a preemption) delays it by its resize time δ_j: one more variable ``z[j]`` ∈ [0,1] with
``z[j] ≥ 1 − v[j,cur,0] − u[j,0]`` and ``z[j] ≥ Σ_{k≠cur} v[j,k,t]`` adds ``ω_j δ_j z[j]`` to the
objective. The ``u[j,0]`` term credits completion: a job that finishes inside the first slot on its
current configuration leaves the rest of the slot without changing anything.
Charging only the first slot would let the LP plan every change one slot later, for free, forever
(only the first slot is executed). Starts are not charged: a start costs the same whenever it happens.

A suspension (a running job given nothing) costs far more than an in-place resize: the checkpoint
stall, a new process's boot and the load (``Job.suspend_cost_s``, measured per job live). One more
variable ``s[j]`` ∈ [0,1] with ``s[j] ≥ 1 − Σ_k v[j,k,0] − u[j,0]`` — the part of the first slot j
neither runs nor has completed by — adds ``ω_j (σ_j − δ_j)⁺ s[j]``, so that a full suspension costs
``max(σ_j, δ_j)`` in all (``z`` already charges δ_j for it). The LP then leaves a running job
without GPUs only when what that frees gains the others more than the job's suspend + resume.
Only the first slot is charged, as for ``z``: a suspension planned later costs the others that
wait a slot, and is weighed again, in full, when its slot comes.

As solved, the LP uses cumulative variables so that each row stays short (nonzeros O(K·T) per job, not
O(K·T²)): ``U[j,t] = Σ_{t'≤t} u[j,t']`` (monotone) and ``F[j,t]`` ∈ [0,1], the fraction of D_j done by
the end of slot t. Then the covering rows read ``U ≤ F``, the cap ``W ≤ D`` is F's upper bound, "runs
only until it completes" is ``Σ_k v[j,k,t] + U[j,t−1] ≤ 1``, and the objective per job is
``ω_j (L + D_j/r_j^best − Σ_{t<T−1} Δ_{t+1} U[j,t] − (D_j/r_j^best) F[j,T−1] + δ_j z[j])``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from ..errors import ConfigError

Placement = tuple[tuple[int, int], ...]  # ((host index, GPUs), ...), sorted by host, GPUs > 0


@dataclass(frozen=True)
class Host:
    name: str
    gpus: int


@dataclass(frozen=True)
class Config:
    """One way to run a job: ``gpus`` workers doing ``rate`` work units per second.

    ``placement`` fixes the GPUs per host (internal on one host, or a given spread); empty means an
    external configuration whose hosts are chosen when placing (it counts against aggregate capacity
    in the LP, and its rate must not depend on the spread)."""

    gpus: int
    rate: float
    placement: Placement = ()
    label: str = ""

    @staticmethod
    def internal(host: int, gpus: int, rate: float, label: str = "") -> Config:
        return Config(gpus, rate, ((host, gpus),), label or f"{gpus}@h{host}")

    @staticmethod
    def spread(per_host: dict[int, int], rate: float, label: str = "") -> Config:
        placement = tuple(sorted((h, g) for h, g in per_host.items() if g > 0))
        return Config(
            sum(g for _, g in placement), rate, placement, label or f"{sum(per_host.values())}@spread"
        )

    @staticmethod
    def external(gpus: int, rate: float, label: str = "") -> Config:
        return Config(gpus, rate, (), label or f"{gpus}@ext")

    @property
    def flexible(self) -> bool:
        return not self.placement


@dataclass(frozen=True)
class Job:
    """An active job: ``remaining`` work units, its candidate configurations, and (for hysteresis) the
    index of the configuration it runs now (``None``: not running), the seconds a change costs it and
    the seconds a suspension (no configuration at all) costs it: suspend + resume, at least a change;
    ``arrival`` (its submission time) breaks ties between otherwise equal jobs (first come, first served)."""

    name: str
    remaining: float
    configs: tuple[Config, ...]
    weight: float = 1.0
    current: int | None = None
    resize_cost_s: float = 0.0
    suspend_cost_s: float = 0.0
    arrival: float = 0.0

    def change_cost_s(self, config: int | None) -> float:
        """Seconds of progress a running job loses going to ``config`` (None: suspended)."""
        if self.current is None or config == self.current:
            return 0.0
        return max(self.resize_cost_s, self.suspend_cost_s) if config is None else self.resize_cost_s

    @property
    def suspend_surcharge_s(self) -> float:
        """What a suspension costs beyond a change (the LP's ``s[j]`` charge)."""
        return max(0.0, self.suspend_cost_s - self.resize_cost_s) if self.current is not None else 0.0

    @property
    def best_rate(self) -> float:
        return max(c.rate for c in self.configs)


@dataclass(frozen=True)
class Horizon:
    """Slot lengths in seconds; only the first slot is executed (rolling horizon)."""

    slots_s: tuple[float, ...]

    @staticmethod
    def uniform(slots: int, slot_s: float) -> Horizon:
        return Horizon((float(slot_s),) * slots)

    @staticmethod
    def geometric(slots: int, first_s: float, growth: float = 2.0, flat: int = 2) -> Horizon:
        """``flat`` slots of ``first_s``, then each ``growth`` times longer: long jobs fit in few slots."""
        return Horizon(tuple(first_s * growth ** max(0, i - flat + 1) for i in range(slots)))

    @property
    def ends_s(self) -> np.ndarray:
        return np.cumsum(self.slots_s)

    @property
    def total_s(self) -> float:
        return float(sum(self.slots_s))


@dataclass(frozen=True)
class Problem:
    hosts: tuple[Host, ...]
    jobs: tuple[Job, ...]
    horizon: Horizon
    capacity_slack: float = 0.0  # ε: the LP packs into (1−ε)·capacity, headroom for rounding

    def __post_init__(self) -> None:
        validate(self)


def validate(problem: Problem) -> None:
    """Raise ConfigError naming the job and configuration for any input the LP cannot take."""
    n_hosts = len(problem.hosts)
    if not problem.horizon.slots_s or min(problem.horizon.slots_s) <= 0:
        raise ConfigError(
            f"the horizon needs at least one slot of positive length, got {problem.horizon.slots_s}"
        )
    if not 0 <= problem.capacity_slack < 1:
        raise ConfigError(f"capacity_slack must be in [0, 1), got {problem.capacity_slack}")
    if any(h.gpus < 0 for h in problem.hosts):
        raise ConfigError(f"host capacities must be >= 0: {problem.hosts}")
    names = [j.name for j in problem.jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"job names must be unique, got {names}")
    for job in problem.jobs:
        if (
            not job.remaining > 0
            or not job.weight > 0
            or job.resize_cost_s < 0
            or not job.suspend_cost_s >= 0
        ):
            raise ConfigError(
                f"job {job.name!r}: remaining work and weight must be > 0 and the resize and "
                f"suspend costs >= 0 (got {job.remaining}, {job.weight}, {job.resize_cost_s}, "
                f"{job.suspend_cost_s})"
            )
        if not job.configs or job.best_rate <= 0:
            raise ConfigError(f"job {job.name!r} has no configuration with a positive rate; leave it out")
        for k, c in enumerate(job.configs):
            hosts = [h for h, _ in c.placement]
            if (
                c.gpus < 1
                or c.rate < 0
                or any(g < 1 or not 0 <= h < n_hosts for h, g in c.placement)
                or len(set(hosts)) != len(hosts)
                or (c.placement and sum(g for _, g in c.placement) != c.gpus)
            ):
                raise ConfigError(
                    f"job {job.name!r} config {k} ({c.label}): needs gpus >= 1, rate >= 0 and a "
                    f"placement on distinct hosts 0..{n_hosts - 1} summing to gpus, got {c}"
                )
        if job.current is not None:
            if not 0 <= job.current < len(job.configs) or job.configs[job.current].flexible:
                raise ConfigError(
                    f"job {job.name!r}: current={job.current} must index one of its configurations "
                    "with a fixed placement (the placement it holds now)"
                )


@dataclass(frozen=True, eq=False)
class LPSolution:
    """``x[j, k, t]``: fraction of slot t job j runs config k (zero-padded past a job's configs);
    ``done[j, t]``: fraction of j's remaining work done by the end of slot t; ``completion_s[j]``: the
    LP's completion estimate from now; ``host_price[h, t]`` / ``aggregate_price[t]``: weighted seconds
    of objective one more GPU on host h / anywhere in slot t would save (≥ 0)."""

    status: str
    optimal: bool
    objective: float
    x: np.ndarray
    done: np.ndarray
    completion_s: np.ndarray
    host_price: np.ndarray
    aggregate_price: np.ndarray
    solve_s: float
    size: dict[str, int] = field(default_factory=dict)


def predicted_completion_s(job: Job, rate: float, horizon: Horizon) -> float:
    """Completion from now if ``job`` ran at ``rate`` for the whole horizon, estimated past the horizon
    at its best rate, as the LP's objective does (so the two agree on what a change is worth)."""
    horizon_s = horizon.total_s
    if rate * horizon_s >= job.remaining:
        return job.remaining / rate
    return horizon_s + (job.remaining - rate * horizon_s) / job.best_rate


class _Rows:
    """COO triplets of ``A_ub`` (or ``A_eq``) with their right-hand sides."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.rhs: list[float] = []

    def add(self, cols: np.ndarray, vals: np.ndarray, rhs: float) -> int:
        row = len(self.rhs)
        self.rows.append(np.full(len(cols), row))
        self.cols.append(np.asarray(cols))
        self.vals.append(np.asarray(vals, dtype=float))
        self.rhs.append(rhs)
        return row

    def matrix(self, n_vars: int) -> sparse.csr_matrix:
        if not self.rhs:
            return sparse.csr_matrix((0, n_vars))
        return sparse.csr_matrix(
            (np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
            shape=(len(self.rhs), n_vars),
        )


def solve_lp(problem: Problem, *, time_limit_s: float | None = None, method: str = "highs") -> LPSolution:
    """Build and solve the relaxation above; a failed or timed-out solve returns ``optimal=False`` and
    all-zero fractions (``rounding`` then falls back to a greedy order). ``method`` is SciPy's HiGHS
    variant: "highs" lets HiGHS choose, "highs-ipm" (interior point) is faster on the largest LPs."""
    started = time.perf_counter()
    jobs, hosts, horizon = problem.jobs, problem.hosts, problem.horizon
    n_slots, n_hosts = len(horizon.slots_s), len(hosts)
    scale = 1.0 - problem.capacity_slack

    # Variable layout per job: v[k, t] row-major, then U[0..T-1], F[0..T-1], then z if it is running and
    # s if a suspension costs it more than a change (without, the LP is exactly the one without s)
    base, offset = [], 0
    for job in jobs:
        base.append(offset)
        offset += (len(job.configs) + 2) * n_slots + (job.current is not None) + (job.suspend_surcharge_s > 0)
    n_vars = offset
    cost = np.zeros(n_vars)
    ub, eq = _Rows(), _Rows()
    host_terms: list[list[tuple[np.ndarray, np.ndarray]]] = [
        [] for _ in range(n_hosts)
    ]  # per host: (v columns over slots, GPUs)
    aggregate_terms: list[tuple[np.ndarray, np.ndarray]] = []
    slots = np.asarray(horizon.slots_s)

    for j, job in enumerate(jobs):
        n_cfg = len(job.configs)
        v = base[j] + np.arange(n_cfg * n_slots).reshape(n_cfg, n_slots)
        done_by = base[j] + n_cfg * n_slots + np.arange(n_slots)  # U: completed by the end of slot t
        fraction = done_by + n_slots  # F: work fraction done by then
        tail_s = job.remaining / job.best_rate
        cost[done_by[:-1]] = -job.weight * slots[1:]
        cost[fraction[-1]] = -job.weight * tail_s
        share = np.outer([c.rate for c in job.configs], slots) / job.remaining  # of D_j per full slot
        ones = np.ones(n_cfg)
        for t in range(n_slots):
            before = fraction[t - 1 : t] if t else np.empty(0, dtype=int)
            eq.add(
                np.concatenate([[fraction[t]], before, v[:, t]]),
                np.concatenate([[1.0], -np.ones(len(before)), -share[:, t]]),
                0.0,
            )
            ub.add(np.array([done_by[t], fraction[t]]), np.array([1.0, -1.0]), 0.0)
            if t:
                ub.add(np.array([done_by[t - 1], done_by[t]]), np.array([1.0, -1.0]), 0.0)
                ub.add(np.append(v[:, t], done_by[t - 1]), np.append(ones, 1.0), 1.0)
            else:
                ub.add(v[:, 0], ones, 1.0)
        if job.current is not None:
            z, others = base[j] + (n_cfg + 2) * n_slots, np.delete(v, job.current, axis=0)
            cost[z] = job.weight * job.resize_cost_s
            # z ≥ 1 − v[cur,0] − U[0]: the part of the first slot it neither runs nor has completed by
            ub.add(np.array([v[job.current, 0], done_by[0], z]), np.array([-1.0, -1.0, -1.0]), -1.0)
            for t in range(n_slots):
                ub.add(np.append(others[:, t], z), np.append(np.ones(len(others)), -1.0), 0.0)
            if (
                job.suspend_surcharge_s > 0
            ):  # s ≥ 1 − Σ_k v[k,0] − U[0]: the part of the first slot it runs nothing
                cost[z + 1] = job.weight * job.suspend_surcharge_s
                ub.add(np.concatenate([v[:, 0], [done_by[0], z + 1]]), -np.ones(n_cfg + 2), -1.0)
        gpus = np.array([c.gpus for c in job.configs], dtype=float)
        aggregate_terms.append((v, gpus))
        for k, c in enumerate(job.configs):
            for h, g in c.placement:
                host_terms[h].append((v[k], np.full(n_slots, float(g))))

    host_rows = np.full((n_hosts, n_slots), -1)
    for h in range(n_hosts):
        if host_terms[h]:
            cols = np.stack([c for c, _ in host_terms[h]])  # (terms, T)
            vals = np.stack([g for _, g in host_terms[h]])
            for t in range(n_slots):
                host_rows[h, t] = ub.add(cols[:, t], vals[:, t], scale * hosts[h].gpus)
    total_gpus = scale * sum(h.gpus for h in hosts)
    aggregate_rows = np.full(n_slots, -1)
    if jobs:
        for t in range(n_slots):
            cols = np.concatenate([cfg_vars[:, t] for cfg_vars, _ in aggregate_terms])
            vals = np.concatenate([g for _, g in aggregate_terms])
            aggregate_rows[t] = ub.add(cols, vals, total_gpus)

    a_ub, a_eq = ub.matrix(n_vars), eq.matrix(n_vars)
    size = {"variables": n_vars, "rows": a_ub.shape[0] + a_eq.shape[0], "nonzeros": a_ub.nnz + a_eq.nnz}
    k_max = max((len(job.configs) for job in jobs), default=0)
    x = np.zeros((len(jobs), k_max, n_slots))
    done = np.zeros((len(jobs), n_slots))
    completion = np.array([predicted_completion_s(job, 0.0, horizon) for job in jobs])
    host_price, aggregate_price = np.zeros((n_hosts, n_slots)), np.zeros(n_slots)
    if not jobs:
        return LPSolution(
            "no jobs",
            True,
            0.0,
            x,
            done,
            completion,
            host_price,
            aggregate_price,
            time.perf_counter() - started,
            size,
        )

    options: dict[str, float | bool] = {"presolve": True}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    result = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.asarray(ub.rhs),
        A_eq=a_eq,
        b_eq=np.asarray(eq.rhs),
        bounds=(0.0, 1.0),
        method=method,
        options=options,
    )
    optimal = result.status == 0 and result.x is not None
    objective = float("nan")
    if optimal:
        solution = np.clip(result.x, 0.0, 1.0)
        for j, job in enumerate(jobs):
            n_cfg = len(job.configs)
            at = base[j] + n_cfg * n_slots
            x[j, :n_cfg] = solution[base[j] : at].reshape(n_cfg, n_slots)
            done_by, done[j] = solution[at : at + n_slots], solution[at + n_slots : at + 2 * n_slots]
            resize_s = job.resize_cost_s * solution[at + 2 * n_slots] if job.current is not None else 0.0
            if job.suspend_surcharge_s > 0:
                resize_s += job.suspend_surcharge_s * solution[at + 2 * n_slots + 1]
            completion[j] = float(
                horizon.total_s
                - slots[1:] @ done_by[:-1]
                + (1.0 - done[j, -1]) * job.remaining / job.best_rate
                + resize_s
            )
        objective = float(sum(job.weight * c for job, c in zip(jobs, completion)))
        duals = -np.asarray(result.ineqlin.marginals)  # ≤-rows of a minimisation have marginals ≤ 0
        has_row = host_rows >= 0
        host_price[has_row] = np.maximum(0.0, duals[host_rows[has_row]])
        aggregate_price[:] = np.maximum(0.0, duals[aggregate_rows])
    return LPSolution(
        str(result.message),
        optimal,
        objective,
        x,
        done,
        completion,
        host_price,
        aggregate_price,
        time.perf_counter() - started,
        size,
    )
