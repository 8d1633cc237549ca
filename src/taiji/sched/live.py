"""Live jobs as the simulator's policies see them (pure): a step-time model fitted online to what
a running taiji job measured, turned into an :class:`~taiji.sched.model.Application`, so that the
live scheduler runs the very policy code the simulator runs (docs/design.md#cluster-scheduler).

The model of one global step at batch ``B`` on ``n`` workers over ``h`` hosts (local batch B/n):

    t = α_c + β_c·(B/n) + [n > 1]·(α_s + β_s·(n − 2)⁺) + [h > 1]·α_x

compute (a fixed part and a per-sample part) plus synchronisation (a fixed part, a part growing
with the ring's length, and a cross-host surcharge), added without overlap: conservative for
SyncSGD, whose allreduce overlaps backward. All five are non-negative and fitted by least squares
on relative errors. What the measurements cannot tell is pulled towards zero by a weak prior, so
a job measured at one size is predicted to scale linearly — optimistic, as Pollux's model is
before it has seen a size (a policy that grows the job measures the truth one round later).

**Goodput** (:mod:`taiji.sched.goodput` reads the run log): progress is counted as Pollux's
simulator counts it (:mod:`taiji.sched.model`), in steps at the job's initial batch ``B0`` (an epoch
of ``S`` samples is ``ceil(S / B0)`` of them), and one step at batch ``B`` makes ``(B/B0)·E(B)`` of
them, with the statistical efficiency ``E(B) = (φ+B0)/(φ+B)`` from the gradient noise scale φ its
run log measured. It is given to the model as one validation run at ``B0`` with ``grad_sqr = 1`` and
``grad_var = φ/B0`` in every epoch (``model.trace_efficiency`` then reads ``(φ+B0)/(φ+B)``); before a
noise scale was measured, ``grad_sqr = 0`` and ``grad_var = 1``: efficiency 1 at every batch. A job
that keeps its batch (``fixed_batch_size``, ``B = B0``) has efficiency 1 whatever φ, so its noise is
not read (one unit of progress is one of its steps, as before); one that adapts
its batch (taiji's goodput policy) may train any batch in ``[B0, max_batch]``, and the batch-adaptive
policies (Pollux-like, PCRR) pick its goodput-best batch per allocation as the job's own policy does.
A sample trained counts once, whatever batch it was trained at (``progress = position / B0``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from ..errors import ConfigError
from .cluster import Allocation
from .model import Application, Curve, Validation
from .policy import JobView
from .workload import LIVE, JobSpec

PRIOR_WEIGHT = 1e-3  # of the prior rows against one measurement (relative errors are ~1)


@dataclass(frozen=True)
class Measured:
    """A job's mean global step time while it ran ``replicas`` workers on ``hosts`` hosts."""

    replicas: int
    hosts: int
    step_seconds: float

    def __post_init__(self) -> None:
        if self.replicas < 1 or not 1 <= self.hosts <= self.replicas or not self.step_seconds > 0:
            raise ConfigError(f"a measurement needs replicas >= hosts >= 1 and a step time > 0, got {self}")


@dataclass(frozen=True)
class StepModel:
    """Seconds of one global step (see the module's docstring)."""

    compute_fixed: float  # α_c
    compute_per_sample: float  # β_c, per sample of the local batch
    sync_fixed: float  # α_s, any job of more than one worker
    sync_per_worker: float  # β_s, per worker beyond two
    cross_host: float  # α_x, once the job spans hosts

    def sync_time(self, hosts: int, replicas: int) -> float:
        if replicas <= 1:
            return 0.0
        return (
            self.sync_fixed
            + self.sync_per_worker * max(replicas - 2, 0)
            + (self.cross_host if hosts > 1 else 0.0)
        )

    def step_time(self, hosts: int, replicas: int, local_bsz: float) -> float:
        return self.compute_fixed + self.compute_per_sample * local_bsz + self.sync_time(hosts, replicas)


def features(batch_size: int, hosts: int, replicas: int) -> list[float]:
    many = 1.0 if replicas > 1 else 0.0
    return [1.0, batch_size / replicas, many, many * max(replicas - 2, 0), 1.0 if hosts > 1 else 0.0]


def logged_step_times(rows: Sequence[Mapping], batch_size: int) -> list[Measured]:
    """A job's mean step seconds per size at ``batch_size`` over its whole run, from its run log's
    metric rows (``metrics.jsonl``: one per step with its size, batch and samples/s): unlike the
    daemon's recent readings, the speed it trained at on average, whatever else ran beside it
    (a gap while it was suspended is no step: each row's speed is its own step's)."""
    seconds: dict[int, list[float]] = {}
    for row in rows:
        if row.get("batch_size") == batch_size and (row.get("samples_per_s") or 0) > 0 and row.get("size"):
            seconds.setdefault(int(row["size"]), []).append(batch_size / float(row["samples_per_s"]))
    return [Measured(size, 1, sum(times) / len(times)) for size, times in sorted(seconds.items())]


def fit_step_model(batch_size: int, measured: Sequence[Measured]) -> StepModel:
    """The non-negative model closest (in relative error) to the measurements. Each measurement
    counts once per distinct (replicas, hosts): a size measured for longer is not a better fit."""
    if not measured:
        raise ConfigError("fit_step_model needs at least one measurement")
    by_size: dict[tuple[int, int], list[float]] = {}
    for m in measured:
        by_size.setdefault((m.replicas, m.hosts), []).append(m.step_seconds)
    rows, targets = [], []
    for (replicas, hosts), times in sorted(by_size.items()):
        t = float(np.median(times))
        rows.append([x / t for x in features(batch_size, hosts, replicas)])
        targets.append(1.0)
    scale = float(np.median([float(np.median(v)) for v in by_size.values()]))
    # the prior: every term but the per-sample compute is zero unless measured otherwise (the
    # per-sample term's own prior row is tiny, so one size is explained by compute that scales)
    for index, weight in (
        (0, PRIOR_WEIGHT),
        (2, PRIOR_WEIGHT),
        (3, PRIOR_WEIGHT),
        (4, PRIOR_WEIGHT),
        (1, PRIOR_WEIGHT * 1e-3),
    ):
        row = [0.0] * 5
        row[index] = weight * (batch_size if index == 1 else 1.0) / scale
        rows.append(row)
        targets.append(0.0)
    solution, _ = nnls(np.asarray(rows), np.asarray(targets))
    return StepModel(*(float(x) for x in solution))


def live_application(
    name: str,
    model: StepModel,
    batch_size: int,
    samples_per_epoch: int,
    epochs: int,
    max_replicas: int,
    max_hosts: int = 1,
    min_local_bsz: int = 1,
    init_batch: int | None = None,
    max_batch: int | None = None,
    noise_scale: float | None = None,
) -> Application:
    """An Application whose step times are ``model``'s, for the simulator's policies. Progress is
    counted in steps at ``init_batch`` (B0, default ``batch_size``); a job with ``max_batch`` above
    B0 adapts its batch in ``[B0, max_batch]``, any other keeps ``batch_size``; ``noise_scale`` (φ,
    samples; None: not measured) gives the statistical efficiency (the module's doc)."""
    init = init_batch or batch_size
    largest_batch = max(max_batch or 0, init)
    adapts = largest_batch > init
    if (
        batch_size < 1
        or init < 1
        or samples_per_epoch < 1
        or epochs < 1
        or max_replicas < 1
        or max_hosts < 1
        or (noise_scale is not None and not noise_scale > 0)
    ):
        raise ConfigError(
            f"job {name!r}: batches, samples per epoch, epochs, replicas and hosts must be >= 1 "
            f"and a noise scale > 0"
        )
    top = largest_batch if adapts else batch_size
    largest = max(1, min(max_replicas, top // max(min_local_bsz, 1)))
    local_ends = (1.0, float(top))  # the model is linear in the local batch: two points hold it
    spreads = {}
    for hosts in range(1, min(max_hosts, largest) + 1):
        for replicas in range(hosts, largest + 1):
            sync = model.sync_time(hosts, replicas)
            spreads[(hosts, replicas)] = Curve(
                local_ends, tuple(model.step_time(hosts, replicas, b) for b in local_ends), (sync, sync)
            )
    unit = init if adapts else batch_size
    steps_per_epoch = math.ceil(samples_per_epoch / unit)
    progress = tuple(float(steps_per_epoch * (k + 1)) for k in range(epochs))
    # a fixed batch: one step is one unit (its whole-sample split trains no faster); before any
    # noise scale: efficiency 1 at every batch; else (φ+B0)/(φ+B)
    sqr, var = (1.0, 0.0) if not adapts else (0.0, 1.0) if noise_scale is None else (1.0, noise_scale / unit)
    stats = Validation(unit, progress, iteration=progress, grad_sqr=(sqr,) * epochs, grad_var=(var,) * epochs)
    return Application(
        name=name,
        max_epochs=epochs,
        init_batch_size=unit,
        max_batch_size=top,
        min_local_bsz=max(min_local_bsz, 1),
        max_local_bsz=top,
        max_replicas=largest,
        fixed_batch_size=None if adapts else batch_size,
        placements={},
        spreads=spreads,
        validations=(stats,),
        epoch_progress=progress,
        pollux_batch_rules=False,
    )


def policy_application(
    name: str,
    measured: Sequence[Measured],
    per_sample: float,
    batch: int,
    work: int,
    max_replicas: int,
    init: int,
    largest: int,
    noise_scale: float | None = None,
) -> Application:
    """The model a policy sees of a live job (``Scheduler.view_of``, and a replay before a job's first
    step): fitted to its ``measured`` step times at ``batch``; never measured, compute that scales
    linearly at ``per_sample`` worker-seconds per sample (its own at another batch, else a typical job's)."""
    model = fit_step_model(batch, measured) if measured else StepModel(0.0, per_sample, 0.0, 0.0, 0.0)
    return live_application(
        name,
        model,
        batch,
        samples_per_epoch=work,
        epochs=1,
        max_replicas=max_replicas,
        init_batch=init,
        max_batch=largest,
        noise_scale=noise_scale,
    )


def seconds_per_sample(measured: Iterable[tuple[int, int, float]]) -> float:
    """Worker-seconds per sample at the fastest of (workers, batch, step seconds); 0 when none."""
    per = [n * t / b for n, b, t in measured if b]
    return min(per) if per else 0.0


def typical(values: Iterable[float], default: float) -> float:
    """The median of the known (non-zero) ``values``, as ``default``'s type; ``default`` when none is."""
    known = [v for v in values if v]
    return type(default)(statistics.median(known)) if known else default


def live_view(
    app: Application,
    submitted: float,
    requested: int,
    steps_done: float,
    placement: Sequence[int] | None,
    attained_worker_s: float = 0.0,
    restarts: int = 0,
    peak_replicas: int = 0,
    weight: float = 1.0,
    batch_now: int | None = None,
    suspend_cost_s: float | None = None,
) -> JobView:
    """What a policy sees of a live job: ``requested`` workers asked at submission, ``steps_done``
    steps at its initial batch trained, ``placement`` workers per host (None while it waits),
    ``batch_now`` the batch it trains with (default its initial one), ``suspend_cost_s`` its
    measured suspend + resume seconds (None: the policy's own guess)."""
    batch = batch_now or app.init_batch_size
    allocation = Allocation(tuple(placement), batch) if placement is not None and any(placement) else None
    spec = JobSpec(app.name, submitted, LIVE, requested, app.init_batch_size)
    return JobView(
        spec=spec,
        app=app,
        progress=min(float(steps_done), app.target_progress),
        attained_gpu_s=attained_worker_s,
        allocation=allocation,
        restarts=restarts,
        peak_replicas=max(peak_replicas, allocation.replicas if allocation else 0),
        weight=weight,
        suspend_cost_s=suspend_cost_s,
    )


def placement_timeline(
    events: Sequence[Mapping], addresses: Sequence[str]
) -> list[tuple[float, tuple[int, ...]]]:
    """A job's workers per host over time from its run log (``events.jsonl``: start, resize and
    recovery carry ``hosts``, the workers on each address; ``end`` frees them). On one host, or for
    a log without ``hosts``, all workers count on the first address."""
    steps = []
    for event in events:
        if event.get("kind") in ("start", "resize", "recovery") and "size" in event:
            on = dict(event.get("hosts") or {}) if len(addresses) > 1 else {}
            on = on or {addresses[0]: int(event["size"])}
            steps.append((float(event["time"]), tuple(int(on.get(a, 0)) for a in addresses)))
        elif event.get("kind") == "end":
            steps.append((float(event["time"]), (0,) * len(addresses)))
    return steps
