"""Job workloads for the scheduler simulator: the Pollux workload CSVs and a synthetic generator.

A workload is a tuple of :class:`JobSpec`, sorted by submission time. The Pollux files
(``workload-{1..8}.csv``, shipped gzip-compressed in ``taiji/sched/data/workloads``) have the
columns ``name,time,application,num_replicas,batch_size``: ``time`` is the submission time in
seconds from the start of the workload, and ``num_replicas``/``batch_size`` the "tuned"
configuration that rigid policies (FIFO, Tiresias, SRTF) run at; elastic policies may ignore the
replica count. Every reader error names the file and line.

:func:`synthetic_workload` draws Philly-shaped workloads with a seeded generator: Poisson
arrivals over a window and the application/configuration mix of the eight Pollux files.
:func:`workload_at_load` gives workload N at a relative job load: the shipped file at 1.0x and,
since Pollux's 0.5x/1.5x/2.0x sets were not copied, a *reconstructed* synthetic stand-in otherwise.
:func:`mixed_workload` adds parameter-server jobs (DL2's models, :mod:`taiji.sched.ps`) to that mix.
:func:`application_of` is a job's ground truth in the simulator, :func:`estimated` a policy's belief of it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taiji.errors import ConfigError
from taiji.sched.csvio import Source, data_root, parse_number, read_rows
from taiji.sched.model import APPLICATIONS, AnyApplication, Application, load_application
from taiji.sched.ps import PS_MODELS, PsSettings, ps_application

logger = logging.getLogger(__name__)

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
POLLUX_WORKLOADS = tuple(range(1, 9))
# Pollux's relative job load counts jobs in one fixed window: 1.0x = 160 jobs in 8 hours, 2.0x = 320
POLLUX_JOBS_AT_LOAD_1 = 160
POLLUX_WINDOW_S = 8 * 3600.0
LIVE = "live"  # a live job's application: its model is fitted to its measurements (sched/live.py)


@dataclass(frozen=True)
class JobSpec:
    """One submitted job: what it trains and the configuration it asked for."""

    name: str
    submit_time: float  # seconds from the start of the workload
    application: str  # one of model.APPLICATIONS (or LIVE: a running taiji job, sched/live.py)
    num_replicas: int  # GPUs requested (rigid policies run exactly this many); PS jobs: workers
    batch_size: int  # total batch size requested (nominal for PS jobs: their progress ignores it)
    epochs: int = 0  # PS jobs: epochs to train (> 0); allreduce jobs: 0 (the application's own)

    def __post_init__(self) -> None:
        if (
            self.application not in APPLICATIONS
            and self.application not in PS_MODELS
            and self.application != LIVE
        ):
            raise ConfigError(
                f"job {self.name!r}: unknown application {self.application!r}; "
                f"known: {', '.join(APPLICATIONS + PS_MODELS)}"
            )
        if self.submit_time < 0 or self.num_replicas < 1 or self.batch_size < 1:
            raise ConfigError(
                f"job {self.name!r}: need time >= 0, num_replicas >= 1, batch_size >= 1; "
                f"got {self.submit_time}, {self.num_replicas}, {self.batch_size}"
            )
        if self.is_ps != (self.epochs > 0):
            raise ConfigError(
                f"job {self.name!r}: a PS job ({', '.join(PS_MODELS)}) needs epochs >= 1, "
                f"an allreduce job epochs = 0; got {self.application} with {self.epochs}"
            )

    @property
    def is_ps(self) -> bool:
        """A parameter-server job (a DL2 model, :mod:`taiji.sched.ps`) rather than an allreduce one."""
        return self.application in PS_MODELS


def read_workload(source: Source) -> tuple[JobSpec, ...]:
    """The jobs of a Pollux-format workload CSV (plain or ``.gz``), sorted by submission time
    (ties keep file order). Raises ConfigError naming the file and line of a bad row."""
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for row in read_rows(source, COLUMNS):
        name = row.fields["name"]
        if not name:
            raise ConfigError(f"{source}:{row.line}: empty job name")
        if name in seen:
            raise ConfigError(f"{source}:{row.line}: job name {name!r} repeats line {seen[name]}")
        seen[name] = row.line
        try:
            jobs.append(
                JobSpec(
                    name=name,
                    submit_time=parse_number(source, row, "time"),
                    application=row.fields["application"],
                    num_replicas=int(parse_number(source, row, "num_replicas", int)),
                    batch_size=int(parse_number(source, row, "batch_size", int)),
                )
            )
        except ConfigError as exc:
            if str(exc).startswith(str(source)):
                raise
            raise ConfigError(f"{source}:{row.line}: {exc}") from None
    if not jobs:
        raise ConfigError(f"{source}: no jobs")
    return tuple(sorted(jobs, key=lambda job: job.submit_time))


def _check_pollux_index(index: int) -> None:
    if index not in POLLUX_WORKLOADS:
        raise ConfigError(f"Pollux workloads are numbered 1..8, got {index}")


def pollux_workload(index: int) -> tuple[JobSpec, ...]:
    """Pollux's ``workload-<index>.csv`` (1..8, the 1.0x job load), from the shipped copy."""
    _check_pollux_index(index)
    return read_workload(data_root().joinpath("workloads", f"workload-{index}.csv.gz"))


def workload_at_load(index: int, load: float) -> tuple[JobSpec, ...]:
    """Pollux workload ``index`` (1..8) at relative job load ``load`` (> 0).

    At 1.0 this is the shipped ``workload-<index>.csv`` unchanged. Other loads are **reconstructed,
    not upstream's files**: Pollux's ``workloads-0.5/-1.5/-2.0`` sets were not copied (and are
    sampled from the Philly log, which was not copied either), so they stand in as
    :func:`synthetic_workload` with ``round(160 × load)`` jobs over the same 8-hour window, seeded
    with ``index``: Philly-shaped (the configuration mix of the eight files) but not job-for-job
    upstream's, so their JCTs are not comparable with Pollux's published 0.5x/2.0x numbers. (Workload
    6 at 2.0 is ``taiji sched simulate --workload synthetic --seed 6 --jobs 320 --duration-h 8``.)"""
    _check_pollux_index(index)
    if not (math.isfinite(load) and load > 0):
        raise ConfigError(
            f"relative job load must be a number > 0 (1.0 = Pollux's 160 jobs in 8 h), got {load}"
        )
    if load == 1.0:
        return pollux_workload(index)
    num_jobs = round(POLLUX_JOBS_AT_LOAD_1 * load)
    if num_jobs < 1:
        raise ConfigError(
            f"relative job load {load:g} rounds to 0 of Pollux's {POLLUX_JOBS_AT_LOAD_1} jobs; "
            f"use at least 1/{POLLUX_JOBS_AT_LOAD_1}"
        )
    return synthetic_workload(index, num_jobs=num_jobs, duration_s=POLLUX_WINDOW_S)


def load_workload(spec: str) -> tuple[JobSpec, ...]:
    """A workload named on a command line: ``pollux:N`` for a shipped file, ``pollux:N@LOAD`` for
    workload N at relative job load LOAD (:func:`workload_at_load`), else a CSV path."""
    if spec.startswith("pollux:"):
        index_text, _, load_text = spec.split(":", 1)[1].partition("@")
        expected = (
            f"workload {spec!r}: expected pollux:1..pollux:8, optionally with a relative job load, "
            f"e.g. pollux:6@2.0"
        )
        if not index_text.isdigit() or int(index_text) not in POLLUX_WORKLOADS:
            raise ConfigError(expected)
        try:
            load = float(load_text) if load_text else 1.0
        except ValueError:
            raise ConfigError(expected) from None
        return workload_at_load(int(index_text), load)
    return read_workload(Path(spec))


# (application, num_replicas, batch_size) and how often each appears in the eight Pollux files
# (1280 jobs): the mix the synthetic generator draws from, so it stays Philly-shaped.
PHILLY_MIX: tuple[tuple[str, int, int, int], ...] = (
    ("ncf", 1, 32768, 503),
    ("cifar10", 6, 2048, 134),
    ("cifar10", 8, 2048, 119),
    ("cifar10", 12, 4096, 133),
    ("cifar10", 16, 4096, 109),
    ("deepspeech2", 6, 320, 34),
    ("deepspeech2", 8, 320, 34),
    ("deepspeech2", 12, 640, 43),
    ("bert", 6, 384, 23),
    ("bert", 8, 384, 18),
    ("bert", 12, 384, 20),
    ("bert", 16, 384, 25),
    ("yolov3", 4, 64, 59),
    ("imagenet", 24, 3200, 9),
    ("imagenet", 32, 6400, 9),
    ("imagenet", 48, 6400, 8),
)


def synthetic_workload(
    seed: int,
    num_jobs: int = POLLUX_JOBS_AT_LOAD_1,
    duration_s: float = POLLUX_WINDOW_S,
    mix: tuple[tuple[str, int, int, int], ...] = PHILLY_MIX,
) -> tuple[JobSpec, ...]:
    """``num_jobs`` jobs with Poisson arrivals over ``duration_s`` (sorted uniform times, which is
    what a Poisson process conditioned on its count is) and configurations drawn with the
    frequencies of ``mix``. The same seed gives the same workload."""
    if num_jobs < 1 or duration_s <= 0:
        raise ConfigError(f"need num_jobs >= 1 and duration_s > 0, got {num_jobs}, {duration_s}")
    rng = np.random.default_rng(seed)
    times = _arrival_times(rng, num_jobs, duration_s)
    picks = _draw_mix(rng, mix, num_jobs)
    return tuple(
        JobSpec(
            name=f"{mix[k][0]}-{i}",
            submit_time=float(t),
            application=mix[k][0],
            num_replicas=mix[k][1],
            batch_size=mix[k][2],
        )
        for i, (t, k) in enumerate(zip(times, picks))
    )


def _arrival_times(rng: np.random.Generator, num_jobs: int, duration_s: float) -> np.ndarray:
    """Sorted uniform times, whole seconds: a Poisson process conditioned on its count."""
    return np.sort(rng.uniform(0.0, duration_s, size=num_jobs)).round()


def _draw_mix(rng: np.random.Generator, mix: tuple[tuple[str, int, int, int], ...], count: int) -> np.ndarray:
    """Indices into ``mix`` drawn with its frequencies (the last field of each entry)."""
    weights = np.array([entry[3] for entry in mix], dtype=float)
    return rng.choice(len(mix), size=count, p=weights / weights.sum())


# Workers a PS job asks for, and epochs it trains (uniform, inclusive) [I: DL2's trace draws
# both at random; its exact ranges are not documented].
PS_WORKER_CHOICES = (1, 2, 4, 8)
PS_EPOCHS = (10, 60)
PS_NOMINAL_BATCH = 32


def mixed_workload(
    seed: int,
    num_jobs: int = 60,
    duration_s: float = 4 * 3600.0,
    ps_fraction: float = 0.5,
    mix: tuple[tuple[str, int, int, int], ...] = PHILLY_MIX,
    ps_models: tuple[str, ...] = PS_MODELS,
) -> tuple[JobSpec, ...]:
    """PS jobs (a DL2 model drawn uniformly from ``ps_models``, 1/2/4/8 workers, 10–60 epochs) and
    allreduce jobs (drawn from ``mix`` like :func:`synthetic_workload`), each job PS with
    probability ``ps_fraction``, Poisson arrivals over ``duration_s``. Seeded: the same arguments
    give the same workload. ``ps_fraction=1`` gives a PS-only workload."""
    if num_jobs < 1 or duration_s <= 0 or not 0.0 <= ps_fraction <= 1.0:
        raise ConfigError(
            f"need num_jobs >= 1, duration_s > 0 and ps_fraction in [0, 1], got "
            f"{num_jobs}, {duration_s}, {ps_fraction}"
        )
    unknown = sorted(set(ps_models) - set(PS_MODELS))
    if not ps_models or unknown:
        raise ConfigError(f"ps_models: expected some of {', '.join(PS_MODELS)}, got {list(ps_models)}")
    rng = np.random.default_rng(seed)
    times = _arrival_times(rng, num_jobs, duration_s)
    is_ps = rng.random(num_jobs) < ps_fraction
    picks = _draw_mix(rng, mix, num_jobs)
    models = rng.integers(len(ps_models), size=num_jobs)
    workers = rng.choice(PS_WORKER_CHOICES, size=num_jobs)
    epochs = rng.integers(PS_EPOCHS[0], PS_EPOCHS[1] + 1, size=num_jobs)
    jobs = []
    for i, t in enumerate(times):
        if is_ps[i]:
            model = ps_models[models[i]]
            jobs.append(
                JobSpec(
                    f"ps-{model}-{i}",
                    float(t),
                    model,
                    int(workers[i]),
                    PS_NOMINAL_BATCH,
                    epochs=int(epochs[i]),
                )
            )
        else:
            app, replicas, batch, _ = mix[picks[i]]
            jobs.append(JobSpec(f"{app}-{i}", float(t), app, replicas, batch))
    return tuple(jobs)


def application_of(
    spec: JobSpec, ps: PsSettings, live: Mapping[str, Application] | None = None
) -> AnyApplication:
    """A job's ground truth: Pollux's measured application, a DL2 PS model under ``ps``, or for a
    LIVE job (a replay of taiji jobs) the Application fitted to it, from ``live`` by job name."""
    if spec.application == LIVE:
        if not live or spec.name not in live:
            raise ConfigError(f"job {spec.name!r} is a live job but SimConfig.live has no Application for it")
        return live[spec.name]
    if spec.is_ps:
        return ps_application(spec.application, spec.epochs, spec.batch_size, ps)
    return load_application(spec.application)


def estimated(app: AnyApplication, name: str, error: float, seed: int) -> AnyApplication:
    """What a policy believes of ``app``: every speed × one factor ``1 + error·U(−1, 1)`` per job,
    drawn from (seed, job name) so it does not depend on arrival order [I: DL2/Optimus perturb
    their speed estimates by ±10 %; a per-job constant factor is our reading]."""
    if error == 0.0:
        return app
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return dataclasses.replace(app, speed_scale=1.0 + error * rng.uniform(-1.0, 1.0))
