"""Application models for the cluster scheduler: measured ground truth and analytic forms.

Three kinds of model live here (docs/reference/scheduler-model.md#speed-models; tags as in
docs/reference/scheduler-model.md#sources):

* :class:`Application` — ground truth built from Pollux's measured traces (shipped in
  ``taiji/sched/data``, Apache-2.0, see the README there). Step and sync time come from
  ``placements.csv`` by placement and per-GPU batch, or, for spreads it does not cover, from
  ``scalability.csv`` plus per-(nodes, replicas) averages of ``placements.csv``. Statistical
  efficiency comes from the gradient statistics of ``validation-<B>.csv``: with
  ``φ = B0·grad_var/grad_sqr`` (the gradient noise scale) the efficiency is
  ``E(B) = (φ+B0)/(φ+B)`` and one step at total batch ``B`` makes ``(B/B0)·E(B)`` units of
  *statistical progress* (iterations at the initial batch ``B0``). A job is done when its
  progress reaches the last epoch boundary of the traces. [C: Pollux simulator semantics as
  documented in the traces README; the interpolation for unmeasured spreads is ours, see
  :func:`spread_step_time`.]
* :class:`ThroughputParams` — Pollux's fitted throughput model (``T_comp``, ``T_net`` with node
  spread, γ overlap) and goodput (``taiji.monitor.gns.goodput``). [C]
* :class:`AllreduceModel` — taiji's allreduce jobs: the Pollux form plus explicit ring-allreduce
  bytes over intra-host or (shared) inter-host bandwidth. [I] Parameter-server jobs live in
  :mod:`taiji.sched.ps`; the functions below dispatch to it for a :class:`~taiji.sched.ps.PsApplication`.

All functions are pure; loaded applications are cached per name (the data never changes).
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from taiji.errors import ConfigError
from taiji.sched.csvio import Source, data_root, parse_number, read_rows
from taiji.sched.ps import PsApplication, sample_time

logger = logging.getLogger(__name__)

APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

# Per-application settings of the Pollux simulator (traces README, "applications.py" table):
# epochs to train, and the two explicit overrides: yolov3's per-GPU batch is capped at 8 although
# placements were measured up to 16, and ncf runs on at most 1 replica under Pollux and Optimus.
_MAX_EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
_MAX_LOCAL_BSZ = {"yolov3": 8}
_MAX_REPLICAS = {"ncf": 1}
_FIXED_BATCH = {"ncf": 32768}  # ncf keeps its batch even under batch-adaptive policies
MAX_TRACE_NODES = 16  # the traces measure at most 16 nodes; wider spreads are read as 16


@dataclass(frozen=True)
class Curve:
    """Step and sync time (s) measured at increasing per-GPU batch sizes for one configuration."""

    local_bsz: tuple[float, ...]
    step_time: tuple[float, ...]
    sync_time: tuple[float, ...]

    def at(self, local_bsz: float) -> tuple[float, float]:
        """(step, sync) linearly interpolated in the batch size, clamped at the measured ends."""
        return (
            float(np.interp(local_bsz, self.local_bsz, self.step_time)),
            float(np.interp(local_bsz, self.local_bsz, self.sync_time)),
        )


@dataclass(frozen=True)
class Validation:
    """Per-epoch gradient statistics of one training run at total batch ``batch_size``."""

    batch_size: int
    progress: tuple[float, ...]  # cumulative statistical progress at the end of each epoch
    iteration: tuple[float, ...]  # cumulative optimizer steps at this batch by the end of each epoch
    grad_sqr: tuple[float, ...]
    grad_var: tuple[float, ...]


@dataclass(frozen=True)
class BatchConfig:
    """How a total batch is split on ``replicas`` GPUs: ``replicas × atomic × (accum_steps+1)``."""

    replicas: int
    atomic_bsz: int
    accum_steps: int

    @property
    def total(self) -> int:
        return self.replicas * self.atomic_bsz * (self.accum_steps + 1)


@dataclass(frozen=True, eq=False)  # identity hash: used as a cache key; never compared by value
class Application:
    """Measured behaviour of one Pollux application (ground truth for the simulator)."""

    name: str
    max_epochs: int
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_replicas: int | None  # an explicit cap (ncf: 1), None when unlimited
    fixed_batch_size: int | None  # batch-adaptive policies may not change it (ncf)
    placements: Mapping[str, Curve]  # canonical placement string -> curve
    spreads: Mapping[tuple[int, int], Curve]  # (nodes, replicas) -> curve, measured or averaged
    validations: tuple[Validation, ...]  # sorted by batch size
    epoch_progress: tuple[float, ...]  # progress at the end of epoch k+1 (min over runs)
    speed_scale: float = 1.0  # a policy's estimate: rates × this (ground truth: 1)
    server_cpus: int = 0  # allreduce jobs have no parameter servers
    pollux_batch_rules: bool = True  # split a batch as Pollux's simulator does (batch_config)

    def servers_for(self, workers: int) -> int:
        """Parameter servers a job of ``workers`` workers needs: none (allreduce)."""
        return 0

    @property
    def target_progress(self) -> float:
        """Statistical progress at which the job is complete (end of the last epoch)."""
        return self.epoch_progress[-1]

    def epoch_of(self, progress: float) -> int:
        """0-based epoch a job at ``progress`` is in; ``max_epochs`` once complete."""
        return bisect.bisect_right(self.epoch_progress, progress)

    def batch_config(self, replicas: int, batch_size: int) -> BatchConfig:
        """Split ``batch_size`` over ``replicas`` by the rules of Pollux's simulator (traces README,
        ``Job.update_local_bsz``) [C]: accumulate gradients when a GPU cannot hold its share (per-GPU
        batch above ``max_local_bsz``); on one GPU a batch above the initial batch always takes at
        least one accumulation step (two micro-steps); and the per-GPU batch is capped at
        ``max_batch_size // (replicas × micro-steps)``, so the batch trained may fall short of the one
        asked for (bert at 384 on 6 GPUs trains 6 × 10 × 6 = 360) and never exceeds the largest
        validated batch. Without ``pollux_batch_rules`` (a live taiji job) only the first rule holds:
        the batch is split in whole samples, rounded up."""
        if replicas < 1 or batch_size < 1:
            raise ConfigError(
                f"{self.name}: need replicas >= 1 and batch >= 1, got {replicas} x {batch_size}"
            )
        local = math.ceil(batch_size / replicas)
        accum = math.ceil(local / self.max_local_bsz) - 1
        if self.pollux_batch_rules and replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1))
        if self.pollux_batch_rules:
            atomic = max(1, min(atomic, self.max_batch_size // (replicas * (accum + 1))))
        return BatchConfig(replicas, atomic, accum)

    def max_useful_replicas(self, batch_size: int) -> int:
        """Most GPUs worth giving a job of this batch: every GPU keeps ``min_local_bsz`` samples."""
        limit = max(1, batch_size // self.min_local_bsz)
        return min(limit, self.max_replicas) if self.max_replicas else limit


def canonical_placement(placement: Sequence[int]) -> tuple[int, ...]:
    """GPUs per used node, rotated to the lexicographically smallest rotation: the traces list
    each arrangement once up to rotation, so node order is cyclic, not sorted."""
    used = tuple(count for count in placement if count > 0)
    if not used:
        raise ConfigError("a placement needs at least one GPU")
    return min(used[i:] + used[:i] for i in range(len(used)))


def step_time(app: Application, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
    """Measured (step, sync) seconds of one synchronous step of ``app`` at ``local_bsz`` per GPU
    with ``placement`` (GPUs per node, any order, zeros ignored)."""
    return _step_time(app, canonical_placement(placement), float(local_bsz))


@functools.lru_cache(maxsize=1 << 16)
def _step_time(app: Application, canonical: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
    key = "".join(str(count) for count in canonical)
    curve = app.placements.get(key) if all(count < 10 for count in canonical) else None
    if curve is not None:
        return curve.at(local_bsz)
    return spread_step_time(app, len(canonical), sum(canonical), local_bsz)


def spread_step_time(app: Application, nodes: int, replicas: int, local_bsz: float) -> tuple[float, float]:
    """(step, sync) for a spread the placement table lacks. [I] Upstream interpolates linearly
    over the scattered (nodes, replicas, local_bsz) points; we use the measured grid instead:
    at each node count whose replica range covers ``replicas`` interpolate linearly in replicas,
    then linearly between the nearest such node counts below and above (or take the one that
    exists). Spreads beyond the traces are clamped (nodes to 16, replicas to the range)."""
    nodes = min(nodes, MAX_TRACE_NODES)
    by_nodes: dict[int, list[int]] = {}
    for k, n in app.spreads:
        by_nodes.setdefault(k, []).append(n)
    covering = sorted(k for k, ns in by_nodes.items() if min(ns) <= replicas <= max(ns))
    if not covering:  # more replicas than ever measured: the widest measured spread at most
        widest = max(by_nodes, key=lambda k: max(by_nodes[k]))
        return _along_replicas(app, widest, sorted(by_nodes[widest]), replicas, local_bsz)
    below = [k for k in covering if k <= nodes]
    above = [k for k in covering if k >= nodes]
    if below and above:
        low, high = below[-1], above[0]
    else:
        low = high = (below or above)[-1 if below else 0]
    step_low = _along_replicas(app, low, sorted(by_nodes[low]), replicas, local_bsz)
    if high == low:
        return step_low
    step_high = _along_replicas(app, high, sorted(by_nodes[high]), replicas, local_bsz)
    weight = (nodes - low) / (high - low)
    return tuple((1 - weight) * a + weight * b for a, b in zip(step_low, step_high))  # type: ignore[return-value]


def _along_replicas(
    app: Application, nodes: int, measured: list[int], replicas: int, local_bsz: float
) -> tuple[float, float]:
    """(step, sync) at ``nodes`` interpolated linearly between the bracketing measured replica
    counts (clamped at the ends)."""
    replicas = min(max(replicas, measured[0]), measured[-1])
    index = bisect.bisect_left(measured, replicas)
    high = measured[index]
    if high == replicas:
        return app.spreads[(nodes, high)].at(local_bsz)
    low = measured[index - 1]
    weight = (replicas - low) / (high - low)
    a, b = app.spreads[(nodes, low)].at(local_bsz), app.spreads[(nodes, high)].at(local_bsz)
    return ((1 - weight) * a[0] + weight * b[0], (1 - weight) * a[1] + weight * b[1])


def _across_runs(app: Application, batch_size: float, epoch: int, *columns: str) -> tuple[float, ...]:
    """``columns`` of the validation runs in ``epoch`` (0-based) at total batch ``batch_size``: linear
    between the two runs that bracket the batch, clamped outside the measured range."""
    runs = app.validations
    row = min(max(epoch, 0), app.max_epochs - 1)
    sizes = [run.batch_size for run in runs]
    index = bisect.bisect_left(sizes, batch_size)
    if index == 0 or index == len(runs):
        run = runs[min(index, len(runs) - 1)]
        return tuple(getattr(run, column)[row] for column in columns)
    low, high = runs[index - 1], runs[index]
    weight = (batch_size - low.batch_size) / (high.batch_size - low.batch_size)
    return tuple(
        (1 - weight) * getattr(low, column)[row] + weight * getattr(high, column)[row] for column in columns
    )


def grad_stats(app: Application, batch_size: float, epoch: int) -> tuple[float, float]:
    """(grad_sqr, grad_var) in ``epoch`` (0-based) at total batch ``batch_size``, across runs."""
    sqr, var = _across_runs(app, batch_size, epoch, "grad_sqr", "grad_var")
    return sqr, var


def trace_iterations(app: Application, batch_size: float, epoch: int) -> float:
    """Optimizer steps at ``batch_size`` from the start of training to the end of ``epoch`` (0-based)
    as the validation runs count them, across runs."""
    return _across_runs(app, batch_size, epoch, "iteration")[0]


def iteration_time(app: Application, placement: Sequence[int], batch_size: int) -> float:
    """Seconds of one optimizer step of ``batch_size`` on ``placement``, accumulation included
    (:meth:`Application.batch_config`): ``step + accum_steps × (step − sync)``."""
    config = app.batch_config(sum(count for count in placement if count > 0), batch_size)
    step, sync = step_time(app, placement, config.atomic_bsz)
    return step + config.accum_steps * (step - sync)


def trace_efficiency(app: Application, batch_size: float, epoch: int) -> float:
    """Measured efficiency of ``batch_size`` in ``epoch``. Written as ``(var+sqr)/(var+scale·sqr)``
    (scale = B/B0), which equals ``(φ+B0)/(φ+B)`` with ``φ = B0·var/sqr`` and stays finite where
    the traces record ``grad_sqr = 0`` (deepspeech2's late epochs: pure noise, efficiency 1)."""
    sqr, var = grad_stats(app, batch_size, epoch)
    denominator = var + (batch_size / app.init_batch_size) * sqr
    return (var + sqr) / denominator if denominator > 0 else 1.0


AnyApplication = Application | PsApplication


def progress_rate(app: AnyApplication, placement: Sequence[int], batch_size: int, epoch: int) -> float:
    """Statistical progress per second of ``app`` training at ``batch_size`` on ``placement``
    during ``epoch``. One iteration with ``a`` accumulation steps costs ``step + a·(step − sync)``.
    A PS job's rate (mini-batches/s) depends on neither batch nor epoch; its servers are assumed
    beside its workers (:func:`taiji.sched.ps.beside_workers`)."""
    if isinstance(app, PsApplication):
        return app.rate(placement)
    return _epoch_rates(app, canonical_placement(placement), batch_size)[epoch]


@functools.lru_cache(maxsize=1 << 14)
def _epoch_rates(app: Application, canonical: tuple[int, ...], batch_size: int) -> tuple[float, ...]:
    """Progress per second in every epoch (the rate only changes at epoch boundaries, where the
    gradient statistics do)."""
    config = app.batch_config(sum(canonical), batch_size)
    iteration = iteration_time(app, canonical, batch_size)
    scale = config.total / app.init_batch_size
    return tuple(
        app.speed_scale * scale * trace_efficiency(app, config.total, epoch) / iteration
        for epoch in range(app.max_epochs)
    )


@functools.lru_cache(maxsize=1 << 14)
def _seconds_after(app: Application, canonical: tuple[int, ...], batch_size: int) -> tuple[float, ...]:
    """``[e]``: seconds to train epochs ``e..max_epochs-1`` in full (``[max_epochs]`` = 0)."""
    rates = _epoch_rates(app, canonical, batch_size)
    lengths = np.diff(np.concatenate(([0.0], app.epoch_progress)))
    per_epoch = lengths / np.asarray(rates)
    return tuple(np.concatenate((np.cumsum(per_epoch[::-1])[::-1], [0.0])).tolist())


def advance(
    app: AnyApplication,
    progress: float,
    seconds: float,
    placement: Sequence[int],
    batch_size: int,
    servers: Sequence[int] | None = None,
) -> float:
    """Progress after training ``seconds`` from ``progress``; the rate is constant within an
    epoch, so this integrates exactly across epoch boundaries. Never exceeds the target.
    ``servers``: a PS job's servers per host (ignored for allreduce jobs)."""
    if isinstance(app, PsApplication):
        return app.advance(progress, seconds, placement, servers)
    rates = _epoch_rates(app, canonical_placement(placement), batch_size)
    while seconds > 0 and progress < app.target_progress:
        epoch = app.epoch_of(progress)
        boundary = app.epoch_progress[epoch]
        needed = (boundary - progress) / rates[epoch]
        if needed > seconds:
            return progress + rates[epoch] * seconds
        progress, seconds = boundary, seconds - needed
    return min(progress, app.target_progress)


def time_to_finish(
    app: AnyApplication,
    progress: float,
    placement: Sequence[int],
    batch_size: int,
    servers: Sequence[int] | None = None,
) -> float:
    """Seconds of training from ``progress`` to completion on ``placement`` (exact, per epoch);
    ``servers`` as for :func:`advance`."""
    if isinstance(app, PsApplication):
        return app.time_to_finish(progress, placement, servers)
    epoch = app.epoch_of(progress)
    if epoch >= app.max_epochs:
        return 0.0
    canonical = canonical_placement(placement)
    rate = _epoch_rates(app, canonical, batch_size)[epoch]
    return (app.epoch_progress[epoch] - progress) / rate + _seconds_after(app, canonical, batch_size)[
        epoch + 1
    ]


# -- analytic models ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputParams:
    """Pollux's throughput model parameters [C]: compute ``α_c + β_c·local_bsz``; network
    ``α + β·(n−2)⁺`` with the inter-node pair (``α_n, β_n``) when the job spans >1 node, the
    intra-node pair (``α_r, β_r``) otherwise; ``γ ∈ [1, 10]`` blends compute and network
    (γ=1: no overlap, large γ: full overlap)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def __post_init__(self) -> None:
        if not 1.0 <= self.gamma <= 10.0:
            raise ConfigError(f"gamma must lie in [1, 10], got {self.gamma}")


def overlap(compute: float, network: float, gamma: float) -> float:
    """``(T_comp^γ + T_net^γ)^(1/γ)``: between the sum (γ=1) and the max (γ→∞)."""
    return (compute**gamma + network**gamma) ** (1.0 / gamma)


def pollux_step_time(
    params: ThroughputParams, nodes: int, replicas: int, local_bsz: float, accum_steps: int = 0
) -> float:
    """Seconds per iteration predicted by Pollux's model; accumulation steps add compute only."""
    compute = params.alpha_c + params.beta_c * local_bsz
    if replicas == 1:
        network = 0.0  # nothing to synchronise
    elif nodes > 1:
        network = params.alpha_n + params.beta_n * max(replicas - 2, 0)
    else:
        network = params.alpha_r + params.beta_r * max(replicas - 2, 0)
    return accum_steps * compute + overlap(compute, network, params.gamma)


@dataclass(frozen=True)
class AllreduceModel:
    """taiji's allreduce job [I]: Pollux's form plus ring-allreduce traffic ``2(n−1)/n · g`` over
    the intra-host bus or the host NIC, whose bandwidth ``contention`` distributed jobs share."""

    compute: ThroughputParams
    grad_bytes: float
    bw_intra: float  # bytes/s between workers on one host
    bw_inter: float  # bytes/s of one host's NIC

    def step_time(self, hosts: int, replicas: int, local_bsz: float, contention: int = 1) -> float:
        p = self.compute
        compute = p.alpha_c + p.beta_c * local_bsz
        if replicas == 1:
            return compute
        traffic = 2 * (replicas - 1) / replicas * self.grad_bytes
        if hosts > 1:
            network = (
                p.alpha_n + p.beta_n * max(replicas - 2, 0) + traffic * max(contention, 1) / self.bw_inter
            )
        else:
            network = p.alpha_r + p.beta_r * max(replicas - 2, 0) + traffic / self.bw_intra
        return overlap(compute, network, p.gamma)


# the paper family's PS time per mini-batch lives with the rest of the PS model
ps_sample_time = sample_time


# -- loading the shipped traces ---------------------------------------------------------------------


@functools.cache
def load_application(name: str) -> Application:
    """The :class:`Application` ``name`` built from the shipped traces (cached)."""
    if name not in APPLICATIONS:
        raise ConfigError(f"unknown application {name!r}; known: {', '.join(APPLICATIONS)}")
    folder = data_root().joinpath("traces", name)
    placements = _read_curves(folder.joinpath("placements.csv.gz"), ("placement",))
    scalability = _read_curves(folder.joinpath("scalability.csv.gz"), ("num_nodes", "num_replicas"))
    spreads = _average_by_spread(placements)
    spreads.update({(int(k[0]), int(k[1])): curve for k, curve in scalability.items()})
    validations = _read_validations(name, folder)
    max_epochs = _MAX_EPOCHS[name]
    short = [run.batch_size for run in validations if len(run.progress) < max_epochs]
    if short:
        raise ConfigError(f"{name}: validation runs {short} have fewer than {max_epochs} epochs")
    bsz = sorted({b for curve in placements.values() for b in curve.local_bsz})
    return Application(
        name=name,
        max_epochs=max_epochs,
        init_batch_size=validations[0].batch_size,
        max_batch_size=validations[-1].batch_size,
        min_local_bsz=int(bsz[0]),
        max_local_bsz=_MAX_LOCAL_BSZ.get(name, int(bsz[-1])),
        max_replicas=_MAX_REPLICAS.get(name),
        fixed_batch_size=_FIXED_BATCH.get(name),
        placements={key[0]: curve for key, curve in placements.items()},
        spreads=spreads,
        validations=validations,
        epoch_progress=tuple(min(run.progress[k] for run in validations) for k in range(max_epochs)),
    )


def _read_curves(source: Source, keys: tuple[str, ...]) -> dict[tuple[str, ...], Curve]:
    points: dict[tuple[str, ...], list[tuple[float, float, float]]] = {}
    for row in read_rows(source, keys + ("local_bsz", "step_time", "sync_time")):
        point = tuple(parse_number(source, row, column) for column in ("local_bsz", "step_time", "sync_time"))
        points.setdefault(tuple(row.fields[k] for k in keys), []).append(point)  # type: ignore[arg-type]
    return {key: _curve(rows) for key, rows in points.items()}


def _curve(points: list[tuple[float, float, float]]) -> Curve:
    points = sorted(points)
    return Curve(tuple(p[0] for p in points), tuple(p[1] for p in points), tuple(p[2] for p in points))


def _average_by_spread(placements: dict[tuple[str, ...], Curve]) -> dict[tuple[int, int], Curve]:
    """Mean (step, sync) over the placements with the same (nodes, replicas), per batch size."""
    grouped: dict[tuple[int, int], dict[float, list[tuple[float, float]]]] = {}
    for (key,), curve in placements.items():
        spread = (len(key), sum(int(digit) for digit in key))
        for bsz, step, sync in zip(curve.local_bsz, curve.step_time, curve.sync_time):
            grouped.setdefault(spread, {}).setdefault(bsz, []).append((step, sync))
    return {
        spread: _curve(
            [
                (b, float(np.mean([s for s, _ in v])), float(np.mean([y for _, y in v])))
                for b, v in by_bsz.items()
            ]
        )
        for spread, by_bsz in grouped.items()
    }


def _read_validations(name: str, folder) -> tuple[Validation, ...]:
    runs = []
    for entry in folder.iterdir():
        file = entry.name
        if not (file.startswith("validation-") and file.endswith(".csv.gz")):
            continue
        batch = int(file[len("validation-") : -len(".csv.gz")])
        columns = ("progress", "iteration", "grad_sqr", "grad_var")
        rows = list(read_rows(entry, columns))
        runs.append(Validation(batch, *(tuple(parse_number(entry, r, c) for r in rows) for c in columns)))
    if not runs:
        raise ConfigError(f"{name}: no validation-<B>.csv.gz files in {folder}")
    return tuple(sorted(runs, key=lambda run: run.batch_size))
