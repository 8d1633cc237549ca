"""Parameter-server (PS) jobs for the scheduler simulator: the paper family's speed model with
locality, DL2's refined per-worker model, and DL2's per-model constants
(docs/reference/scheduler-model.md#speed-models).

A PS job trains with ``W`` workers (one GPU each) and ``S = ⌈W/γ⌉`` parameter servers (CPU slots,
``cpus_per_server`` each); the scheduler picks workers, the servers follow (the tightest form of
the coupling ``W ≤ γS`` [R, OASiS]; choosing S freely is not modelled [I]). Progress is counted in
mini-batches; a job is done after ``epochs × batches_per_epoch`` of them.

Speed models (``PsSettings.model``):

* ``paper`` [R, OASiS form]: each worker processes one mini-batch in ``θ = τ + 2g/b`` seconds
  (compute, push the gradient, pull the parameters), asynchronously, so a job makes ``W/θ``
  mini-batches per second; ``b`` is the intra-host bandwidth when all workers and servers share
  one host (locality), the inter-host bandwidth otherwise.
* ``dl2`` [C, DL2's ``scheduler/job.py``, docs/reference/scheduler-model.md#speed-models]: per worker on host
  n, ``intra = b_int / max(ps_n, wk_n)``; ``inter = b_ext`` if all servers are on n, else
  ``min(b_ext/(S − ps_n), b_ext/(W − min_{server hosts m} wk_m))``; one iteration takes
  ``τ + max(2(g/S)/inter, 2(g/S)/intra)`` and the job advances ``W / max_workers(t_iter)``
  mini-batches per second (the slowest worker paces a synchronous job). As summarised there, a
  job wholly on one host still pays the (unshared) NIC term, so this model's locality effect comes
  from NIC and bus sharing, not from a b_int/b_ext switch; the ablation uses ``paper``.

Bandwidths are the host's (DL2's analytical model: a 1510 MB/s NIC and a 4352 MB/s intra-host bus
[C]); the table's per-model measured bandwidths are kept for reference and not used [I].
Placements passed to the speed functions are workers per host and servers per host (tuples as long
as the cluster); a ``servers`` of ``None`` means "placed as :func:`taiji.sched.cluster.place_servers`
would on an empty cluster": on the workers' host when they share one, else beside the workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from taiji.errors import ConfigError

MB = 1e6


@dataclass(frozen=True)
class PsModelSpec:
    """One row of DL2's per-model table (Optimus/DL2 testbed, MXNet PS) [C]."""

    name: str
    batch_time_s: float  # τ: compute seconds per mini-batch on one worker
    size_mb: float  # g: model (= gradient) size
    batches_per_epoch: int
    inter_mb_s: float  # measured cross-host bandwidth (reference only)
    intra_mb_s: float  # measured intra-host bandwidth (reference only)
    worker_cpus: int
    worker_gpus: int
    server_cpus: int


# DL2's table (docs/reference/scheduler-model.md#speed-models). Workers are scheduled as one GPU each here
# whatever their (cpu, gpu) row says: the simulator's hosts count GPUs and server CPUs only [I].
DL2_MODELS: dict[str, PsModelSpec] = {
    spec.name: spec
    for spec in (
        PsModelSpec("resnet-50", 0.449, 102.2, 115, 91.9, 306.5, 2, 4, 3),
        PsModelSpec("vgg-16", 0.535, 553.4, 115, 233.0, 427.8, 2, 4, 4),
        PsModelSpec("resnext-110", 0.226, 6.92, 390, 59.5, 63.0, 2, 4, 3),
        PsModelSpec("inception-bn", 0.815, 42.1, 120, 145.9, 1082.1, 2, 4, 3),
        PsModelSpec("seq2seq", 0.075, 36.5, 780, 120.1, 181.1, 4, 0, 1),
        PsModelSpec("cnn-text-cls", 0.585, 24.0, 193, 60.8, 159.6, 2, 4, 3),
        PsModelSpec("dssm", 0.567, 6.0, 349, 92.1, 65.6, 4, 0, 1),
        PsModelSpec("wlm", 0.154, 19.2, 165, 10.4, 22.9, 1, 4, 1),
    )
}
PS_MODELS = tuple(DL2_MODELS)
SPEED_MODELS = ("paper", "dl2")


@dataclass(frozen=True)
class PsSettings:
    """How the simulator runs PS jobs: speed model, host bandwidths, workers per server, a cap."""

    model: str = "paper"
    bw_intra_mb_s: float = 4352.0  # DL2's intra-host bus [C]
    bw_inter_mb_s: float = 1510.0  # DL2's host NIC [C]
    workers_per_server: int = 4  # γ [I: OASiS's coupling; the value is ours]
    max_workers: int = 16  # N^max [I]

    def __post_init__(self) -> None:
        if self.model not in SPEED_MODELS:
            raise ConfigError(f"PS speed model {self.model!r}: expected one of {', '.join(SPEED_MODELS)}")
        if not (self.bw_intra_mb_s > 0 and self.bw_inter_mb_s > 0):
            raise ConfigError(f"PS bandwidths must be > 0, got {self.bw_intra_mb_s}, {self.bw_inter_mb_s}")
        if self.workers_per_server < 1 or self.max_workers < 1:
            raise ConfigError(
                f"workers_per_server and max_workers must be >= 1, got "
                f"{self.workers_per_server}, {self.max_workers}"
            )

    def with_ratio(self, ratio: float) -> PsSettings:
        """The same settings with ``b_ext = ratio × b_int`` (the locality ablation)."""
        return PsSettings(
            self.model,
            self.bw_intra_mb_s,
            ratio * self.bw_intra_mb_s,
            self.workers_per_server,
            self.max_workers,
        )


def sample_time(compute_s: float, grad_bytes: float, bandwidth: float) -> float:
    """The paper family's seconds per mini-batch of one PS worker [R, OASiS form]: compute plus a
    push and a pull of the gradient, ``τ + 2g/b``."""
    return compute_s + 2.0 * grad_bytes / bandwidth


def is_internal(workers: Sequence[int], servers: Sequence[int]) -> bool:
    """Locality: one host holds every worker and every server of the job."""
    hosts = {h for h, n in enumerate(workers) if n > 0} | {h for h, n in enumerate(servers) if n > 0}
    return len(hosts) <= 1


def paper_rate(
    spec: PsModelSpec, settings: PsSettings, workers: Sequence[int], servers: Sequence[int]
) -> float:
    """Mini-batches per second, asynchronous PS, internal or external bandwidth (module docstring)."""
    bandwidth = settings.bw_intra_mb_s if is_internal(workers, servers) else settings.bw_inter_mb_s
    return sum(workers) / sample_time(spec.batch_time_s, spec.size_mb * MB, bandwidth * MB)


def dl2_rate(
    spec: PsModelSpec, settings: PsSettings, workers: Sequence[int], servers: Sequence[int]
) -> float:
    """Mini-batches per second under DL2's per-worker model (module docstring)."""
    w, p = sum(workers), sum(servers)
    shard = spec.size_mb / p  # each server holds 1/p of the parameters
    server_hosts = [h for h, n in enumerate(servers) if n > 0]
    fewest_beside_servers = min(workers[h] for h in server_hosts)
    slowest = 0.0
    for host, count in enumerate(workers):
        if count == 0:
            continue
        intra = settings.bw_intra_mb_s / max(servers[host], count)
        if servers[host] == p:
            inter = settings.bw_inter_mb_s
        else:  # floors: DL2 divides by these counts; both are >= 1 whenever traffic crosses hosts
            inter = min(
                settings.bw_inter_mb_s / max(p - servers[host], 1),
                settings.bw_inter_mb_s / max(w - fewest_beside_servers, 1),
            )
        iteration = spec.batch_time_s + max(2 * shard / inter, 2 * shard / intra)
        slowest = max(slowest, iteration)
    return w / slowest


RATES = {"paper": paper_rate, "dl2": dl2_rate}


def servers_for(workers: int, settings: PsSettings) -> int:
    """Servers a job of ``workers`` workers runs with: ``⌈W/γ⌉`` (none without workers)."""
    return math.ceil(workers / settings.workers_per_server) if workers > 0 else 0


def beside_workers(workers: Sequence[int], count: int) -> tuple[int, ...]:
    """Where ``count`` servers go on an otherwise empty cluster: round-robin over the workers'
    hosts, most workers first (all on the one host when the workers share one)."""
    hosts = sorted((h for h, n in enumerate(workers) if n > 0), key=lambda h: (-workers[h], h))
    placed = [0] * len(workers)
    for i in range(count):
        placed[hosts[i % len(hosts)]] += 1
    return tuple(placed)


@dataclass(frozen=True, eq=False)  # identity hash, like model.Application (cache keys)
class PsApplication:
    """A PS job's ground truth (or, with ``speed_scale`` ≠ 1, a policy's estimate of it) in the
    shape the simulator and the policies use for Pollux applications: progress in mini-batches,
    one rate per placement (the same in every epoch), a fixed batch (PS jobs do not adapt it)."""

    spec: PsModelSpec
    settings: PsSettings
    max_epochs: int
    fixed_batch_size: int  # nominal; PS progress does not depend on it
    speed_scale: float = 1.0  # estimates: rates × this (ground truth: 1)
    server_cpus_each: int = 0  # CPU slots per server (set from the spec by ps_application)

    @property
    def name(self) -> str:
        return self.spec.name

    # the attributes batch-choosing policies read; a PS job's batch is fixed
    @property
    def init_batch_size(self) -> int:
        return self.fixed_batch_size

    @property
    def max_batch_size(self) -> int:
        return self.fixed_batch_size

    min_local_bsz = 1

    @property
    def max_replicas(self) -> int:
        return self.settings.max_workers

    @property
    def epoch_progress(self) -> tuple[float, ...]:
        return tuple(float((k + 1) * self.spec.batches_per_epoch) for k in range(self.max_epochs))

    @property
    def target_progress(self) -> float:
        return float(self.max_epochs * self.spec.batches_per_epoch)

    def epoch_of(self, progress: float) -> int:
        return min(int(progress // self.spec.batches_per_epoch), self.max_epochs)

    def max_useful_replicas(self, batch_size: int) -> int:
        return self.settings.max_workers

    def servers_for(self, workers: int) -> int:
        return servers_for(workers, self.settings)

    @property
    def server_cpus(self) -> int:
        return self.server_cpus_each

    def rate(self, workers: Sequence[int], servers: Sequence[int] | None = None) -> float:
        """Mini-batches per second on ``workers`` per host with ``servers`` per host (``None``:
        :func:`beside_workers`), scaled by ``speed_scale``."""
        workers = tuple(workers)
        if sum(workers) < 1:
            return 0.0
        if servers is None or sum(servers) == 0:
            servers = beside_workers(workers, self.servers_for(sum(workers)))
        return self.speed_scale * RATES[self.settings.model](
            self.spec, self.settings, workers, tuple(servers)
        )

    def time_to_finish(
        self, progress: float, workers: Sequence[int], servers: Sequence[int] | None = None
    ) -> float:
        return max(self.target_progress - progress, 0.0) / self.rate(workers, servers)

    def advance(
        self, progress: float, seconds: float, workers: Sequence[int], servers: Sequence[int] | None = None
    ) -> float:
        return min(progress + self.rate(workers, servers) * max(seconds, 0.0), self.target_progress)


def ps_application(model: str, epochs: int, batch_size: int, settings: PsSettings) -> PsApplication:
    """The ground truth of a PS job training DL2's ``model`` for ``epochs`` epochs."""
    if model not in DL2_MODELS:
        raise ConfigError(f"unknown PS model {model!r}; known: {', '.join(PS_MODELS)}")
    if epochs < 1:
        raise ConfigError(f"a PS job ({model}) needs epochs >= 1, got {epochs}")
    spec = DL2_MODELS[model]
    return PsApplication(spec, settings, epochs, batch_size, server_cpus_each=spec.server_cpus)
