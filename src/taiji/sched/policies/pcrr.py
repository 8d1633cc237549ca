"""PCRR on the simulator: the packing/covering LP with randomized rounding
(docs/reference/scheduler-model.md#pcrr) as a :class:`~taiji.sched.policy.Policy`.

Every round this adapter turns the active :class:`~taiji.sched.policy.JobView` s into an
:class:`~taiji.sched.lp.Problem`, lets :func:`~taiji.sched.rounding.decide` solve the LP and round it
(α-point order, seeded rounding of the first slot, repair, work-conserving fill) and turns the chosen
placements back into :class:`~taiji.sched.cluster.Allocation` s.

**Candidates** per job (at most ~10): the allocation it holds now, kept exactly where it is (the LP's
``Job.current``, so the LP can weigh leaving it against the resize cost); ``n`` GPUs for n = 1, 2, 4, …
up to the GPUs per host and the host's GPUs less each of those (1, 2, 3, 4 on a 4-GPU host),
*internal* (one host, the consolidated rate); and multiples of a host (2, 4,
8, … hosts) as *external* configurations at the rate of full hosts; plus the job's cap when the powers
of two skip it. The small ones are flexible too ([I], a simplification of internal candidates fixed on each of
the ≤3 emptiest hosts, docs/reference/scheduler-model.md#pcrr): the LP only counts them against the cluster's
aggregate capacity, and the rounding's placer puts them on the fullest single host that holds them (best fit),
so they stay internal unless the cluster is too fragmented. Fixed-host candidates for every job would mostly
point at the few hosts free *now*, which hides from the LP exactly the GPUs it frees by shrinking others.

**Rates and batch** (an oracle, as Optimus and the Pollux-like baseline use): work is the job's remaining
statistical progress; a configuration's rate is that work over the exact time to finish on its shape.
With ``adaptive_batch`` (default; what Pollux-like does and what taiji's ``GNSBatchSize`` does live) the
batch is the goodput-best of a geometric grid for the shape *in each remaining epoch*, so the time to
finish assumes the batch is re-chosen at epoch boundaries; the allocation gets the best batch for the
current epoch on its actual placement. With ``adaptive_batch=False`` the job keeps its requested batch
(the setting of Tiresias and Optimus) and GPUs beyond ``batch / min_local_bsz`` are not offered.

**Horizon**: geometric slots (two of ``slot_s``, then each twice the last) reaching ~2.1 h; the first
slot is the round the decision is executed for (the simulator's interval, the live daemon's
``--round``: ``make_policy("pcrr", resize, round_s=R)`` sets ``slot_s`` = R and as many slots as
reach the same horizon, :func:`horizon_slots`). Completion is counted at slot ends, so a first slot
many rounds long hides what running a short job *now* gains: with 60 s slots under 2 s live rounds
a job of 10 s finished "in the first slot" whether it ran now or behind a long running job, and
the sticky rounding kept the long one whole round after round (it was never suspended).

**Resize cost**: the simulator does not tell a policy what a change costs, so it is a constructor field
(``resize``, one of :data:`~taiji.sched.costs.SYSTEMS`; ``make_policy("pcrr", resize)``); the LP and
the fill charge a running job κ × the largest of its grow/shrink/move pauses for a change. Pass the
same system as ``SimConfig.resize``.

**Suspend cost**: leaving a running job without GPUs costs it a suspend + resume (the checkpoint
stall, a new launcher's boot, the load), far more than an in-place resize under taiji: the LP charges
κ × that (``JobView.suspend_cost_s``, measured per job live; else the system's ``resume``) on the part
of the first slot a running job runs nothing (``lp.py``), and the rounding's repair and fill count it
too, so PCRR suspends a job only when what its GPUs gain the others outweighs its resume.

**Rounding** (:func:`~taiji.sched.rounding.decide` options; chosen on synthetic workloads, not on
Pollux's): every job the LP runs at all in the first slot is a candidate to run (its configuration drawn
in proportion to the LP's fractions) and jobs are placed strictly in α-point order, so a running job
later in that order is repaired (shrunk) when an earlier one needs its GPUs. The default Bernoulli draw
("run with probability Σ_k x") with running jobs placed first left short jobs the LP finishes inside the
first slot waiting for several rounds behind running ones (ncf jobs waited ~5 min). Changes of a running
job are weighed by the LP itself, which charges them κ × the resize pause (``hysteresis``): the
rounding's own gain test priced GPUs at the LP's duals summed over the whole horizon and so refused
nearly every grow the LP asked for; instead the rounding is sticky, a running job keeps its allocation
when the LP gives it at least ``keep_share`` of its first-slot mass (no coin flip against the LP's
choice under a 30 s restart). The LP prices a running job's time share of the first slot as that
fraction of a resize, but a job earlier in α-point order that takes its GPUs makes the repair change
it in full; so such a displaced job is kept (placed first) whenever its whole resize plus the progress
it would lose cost the slot more than the wait it causes (:func:`~taiji.sched.rounding.slot_loss`).

**Identical waiting jobs** (:func:`~taiji.sched.rounding.first_come_among_equals`): waiting jobs of the
same weight, candidate sizes and remaining work (within 5%), speeds less than 2× apart, are served in
arrival order (then name), taking the places and configurations the rounding gave their group: the LP
orders them by their speeds alone — a guess for a waiting live job, interference-laden measurements
otherwise — so a replay of a live run, with speeds measured afterwards, ran two identical jobs the
other way round.

**PS jobs** (:mod:`taiji.sched.ps`): the same candidates; a count up to one host is rated internal
(workers and servers on one host, intra-host bandwidth), a larger one external. The LP and the rounding
count GPUs only; servers are placed afterwards in α-point order (:func:`~taiji.sched.cluster.with_servers`)
and a PS job whose servers find no CPUs waits that round [I: the paper's LP has server rows too].

**Estimation error**: rates come from the job's model as the simulator shows it (``JobView.app``), so
with ``SimConfig.estimation_error`` PCRR plans with perturbed speeds like every other oracle policy.

**Not modelled**: interference between distributed jobs, and Pollux-like's limit of twice the GPUs a
job has held (PCRR may give a new job many GPUs at once).

**Determinism**: the rounding's seed is derived from ``seed`` and the round's time (plus
``seed_clock``: a replay of a live run gives the run's start, so each of its rounds draws what the
daemon's round at that time drew), so a run is a pure function of (workload, settings, seed). No LP
time limit is set by default, because a limit would make decisions depend on the machine's speed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation, Cluster, packed_shape, with_servers
from taiji.sched.costs import SYSTEMS, ResizeCost
from taiji.sched.lp import Config, Horizon, Host, Job, Problem
from taiji.sched.model import Application, canonical_placement, progress_rate
from taiji.sched.policy import JobView
from taiji.sched.rounding import decide

BATCH_GRID_POINTS = 12  # candidate total batch sizes per GPU count (geometric)
HORIZON_S = 7680.0  # the LP's horizon by default: 60, 60, 120, … 3840 s (~2.1 h in all)
MAX_GPUS_PER_JOB = 64  # as the Pollux-like baseline: beyond this no trace data exists
Shape = tuple[int, ...]  # canonical placement: GPUs per used host


@dataclass(frozen=True)
class EpochPlan:
    """How a job trains on one shape with a given set of allowed batches, per epoch: the best batch,
    its progress rate, and seconds to train from the start of that epoch to the end (``[max_epochs]``=0)."""

    batches: tuple[int, ...]
    rates: tuple[float, ...]
    seconds_from: tuple[float, ...]

    def time_to_finish(self, app: Application, progress: float) -> float:
        epoch = app.epoch_of(progress)
        if epoch >= app.max_epochs:
            return 0.0
        return (app.epoch_progress[epoch] - progress) / self.rates[epoch] + self.seconds_from[epoch + 1]


def batch_grid(app: Application, replicas: int, adaptive: bool, requested: int) -> tuple[int, ...]:
    """Total batch sizes a job may train with on ``replicas`` GPUs: its request when not adaptive (or
    when the application pins its batch), otherwise a geometric grid from the larger of the initial
    batch and ``min_local_bsz`` per GPU up to the largest batch the traces validate."""
    if app.fixed_batch_size:
        return (app.fixed_batch_size,)
    if not adaptive:
        return (requested,)
    smallest = min(max(app.init_batch_size, replicas * app.min_local_bsz), app.max_batch_size)
    return tuple(
        sorted({int(round(b)) for b in np.geomspace(smallest, app.max_batch_size, BATCH_GRID_POINTS)})
    )


@functools.lru_cache(maxsize=1 << 14)
def epoch_plan(app: Application, shape: Shape, batches: tuple[int, ...]) -> EpochPlan:
    """The per-epoch best of ``batches`` on ``shape`` (cached: it depends on nothing that changes)."""
    best = [max((progress_rate(app, shape, b, epoch), b) for b in batches) for epoch in range(app.max_epochs)]
    lengths = np.diff(np.concatenate(([0.0], app.epoch_progress)))
    per_epoch = lengths / np.array([rate for rate, _ in best])
    seconds_from = np.concatenate((np.cumsum(per_epoch[::-1])[::-1], [0.0]))
    return EpochPlan(tuple(b for _, b in best), tuple(r for r, _ in best), tuple(seconds_from.tolist()))


def gpu_cap(job: JobView, total_gpus: int, adaptive: bool) -> int:
    """Most GPUs worth offering: every GPU keeps ``min_local_bsz`` samples of the largest allowed batch."""
    app = job.app
    largest = app.fixed_batch_size or (app.max_batch_size if adaptive else job.spec.batch_size)
    return max(1, min(app.max_useful_replicas(largest), total_gpus, MAX_GPUS_PER_JOB))


def candidate_counts(cap: int, gpus_per_host: int) -> list[int]:
    """1, 2, 4, … below a host and what fills a host beside each of them (3 on a 4-GPU host: with
    powers of two alone a job beside a one-GPU job gets 2 and a GPU idles), one full host, then 2, 4,
    8, … full hosts; and ``cap`` itself when the doubling skips it (a job capped at 6 GPUs should be
    able to get 6)."""
    counts = {gpus_per_host}
    n = 1
    while n < gpus_per_host:
        counts.update((n, gpus_per_host - n))
        n *= 2
    n = 2 * gpus_per_host
    while n <= cap:
        counts.add(n)
        n *= 2
    counts.add(cap)
    return sorted(c for c in counts if c <= cap)


def horizon_slots(first_s: float, total_s: float = HORIZON_S) -> int:
    """The fewest slots of a geometric horizon whose first slot is ``first_s`` (the round it is
    executed for) that reaches ``total_s``: a 2 s live round plans as far ahead as a 60 s one."""
    if not first_s > 0:
        raise ConfigError(f"the LP's first slot must be > 0 seconds, got {first_s}")
    slots = 2
    while Horizon.geometric(slots, first_s).total_s < total_s:
        slots += 1
    return slots


@dataclass(frozen=True)
class RoundStats:
    """One decision, for the decision-time and LP-size metrics
    (docs/reference/scheduler-model.md#experiments)."""

    now: float
    jobs: int
    variables: int
    rows: int
    decide_s: float  # candidates + LP + rounding + translation, wall seconds
    lp_s: float
    lp_optimal: bool
    repaired: int
    kept_by_hysteresis: int


@dataclass
class Pcrr:
    """PCRR as a simulator policy; see the module docstring for the candidates, rates and cost."""

    name: str = "pcrr"
    resize: ResizeCost = SYSTEMS["restart"]
    seed: int = 0
    seed_clock: float = 0.0  # added to a round's time for its seed (module docstring, "Determinism")
    adaptive_batch: bool = True
    slot_s: float = 60.0  # first slot = the simulator's round (only it is executed)
    slots: int = 8  # geometric horizon: 60, 60, 120, … 3840 s (~2.2 h in all)
    alpha: float | None = 0.5  # α-points; None = one uniform α per job (randomized variant)
    hysteresis: float = 1.0  # κ: the LP and the fill charge a running job κ × its resize pause
    keep_share: float = 0.5  # a running job keeps its allocation when the LP gives it this share
    capacity_slack: float = 0.0  # ε of the LP's capacity rows
    rounds: list[RoundStats] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def change_cost_s(self) -> float:
        """What the LP charges a running job for any change: its largest pause."""
        return max(self.resize.grow, self.resize.shrink, self.resize.move)

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        started = time.perf_counter()
        if not jobs:
            return {}
        problem = Problem(
            tuple(Host(f"h{h}", cluster.gpus_per_host) for h in range(cluster.num_hosts)),
            tuple(self._candidates(job, cluster) for job in jobs),
            Horizon.geometric(self.slots, self.slot_s),
            self.capacity_slack,
        )
        # α-point list scheduling; the LP's own resize charge decides changes, and running jobs
        # are sticky (module docstring, "Rounding", says why these beat decide's defaults)
        schedule = decide(
            problem,
            seed=self._round_seed(now),
            alpha=self.alpha,
            hysteresis=None,
            keep_first=False,
            conditional=True,
            keep_share=self.keep_share,
        )
        chosen: dict[str, Allocation] = {}
        for view, assignment in zip(jobs, schedule.assignments, strict=False):
            if assignment.config is None:
                continue
            counts = [0] * cluster.num_hosts
            for host, gpus in assignment.placement:
                counts[host] = gpus
            chosen[view.name] = Allocation(tuple(counts), self._batch_now(view, tuple(counts)))
        # PS jobs' servers, in α-point order: the LP counts GPUs only, so a PS job whose servers
        # find no CPUs waits this round
        answer = with_servers(
            cluster,
            [(name, chosen[name]) for name in schedule.order if name in chosen],
            {view.name: view.app for view in jobs},
            {view.name: view.allocation for view in jobs if view.allocation is not None},
        )
        size = schedule.lp.size
        self.rounds.append(
            RoundStats(
                now,
                len(jobs),
                size.get("variables", 0),
                size.get("rows", 0),
                time.perf_counter() - started,
                schedule.lp.solve_s,
                schedule.lp.optimal,
                schedule.repaired,
                schedule.kept_by_hysteresis,
            )
        )
        return answer

    def _round_seed(self, now: float) -> int:
        return int(
            np.random.SeedSequence((self.seed, int(round((now + self.seed_clock) * 1000)))).generate_state(1)[
                0
            ]
        )

    def _plan(self, view: JobView, shape: Shape) -> EpochPlan:
        grid = batch_grid(view.app, sum(shape), self.adaptive_batch, view.spec.batch_size)
        return epoch_plan(view.app, shape, grid)

    def _rate(self, view: JobView, shape: Shape) -> float:
        """Remaining work over the exact time to finish on ``shape``: the average rate the LP plans with."""
        seconds = self._plan(view, shape).time_to_finish(view.app, view.progress)
        # floors: a job a rounding error from its target still needs a positive rate in the LP
        return max(view.remaining_progress, 1e-9) / max(seconds, 1e-9)

    def _batch_now(self, view: JobView, placement: tuple[int, ...]) -> int:
        plan = self._plan(view, canonical_placement(placement))
        return plan.batches[min(view.app.epoch_of(view.progress), view.app.max_epochs - 1)]

    def _candidates(self, view: JobView, cluster: Cluster) -> Job:
        configs: list[Config] = []
        current: int | None = None
        held: Shape | None = None
        if view.allocation is not None:
            held = canonical_placement(view.allocation.placement)
            configs.append(
                Config.spread(
                    {h: g for h, g in enumerate(view.allocation.placement) if g},
                    self._rate(view, held),
                    "current",
                )
            )
            current = 0
        for count in candidate_counts(
            gpu_cap(view, cluster.total_gpus, self.adaptive_batch), cluster.gpus_per_host
        ):
            shape = canonical_placement(packed_shape(count, cluster.gpus_per_host))
            if shape == held:  # the held allocation already offers this shape, without a move
                continue
            mode = "int" if count <= cluster.gpus_per_host else "ext"
            configs.append(Config.external(count, self._rate(view, shape), f"{count}@{mode}"))
        suspend_s = self.resize.resume_s if view.suspend_cost_s is None else view.suspend_cost_s
        running = current is not None
        return Job(
            view.name,
            max(view.remaining_progress, 1e-9),
            tuple(configs),
            view.weight,
            current,
            self.hysteresis * self.change_cost_s if running else 0.0,
            self.hysteresis * suspend_s if running else 0.0,
            view.spec.submit_time,
        )
