"""One submitted job as the live scheduler (:mod:`taiji.sched.scheduler`) knows it (pure): its
record (:class:`LiveJob`, plain data the daemon persists), one read of its launcher
(:class:`Observed`) and what is read off the record (its measured step times by size, the seconds it
still trains, when it last started)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .goodput import BatchStats
from .live import Measured

ENDED = ("finished", "failed", "cancelled")  # the states a job ends in


@dataclass
class LiveJob:
    """One submitted job as the daemon knows it."""

    id: str
    name: str
    command: list[str]
    min_np: int
    max_np: int
    requested: int  # what a rigid policy (FIFO) runs it at
    weight: float
    submitted: float
    cwd: str = ""  # where it was submitted (its command runs there)
    work_hint: int = 0  # samples to train, as the submitter guessed (until the job reports its own)
    state: str = "queued"  # queued | running | suspended | finished | failed | cancelled
    reason: str = ""
    size: int = 0  # workers it runs now (its launcher says)
    version: int = 0
    step: int = 0
    batch_size: int = 0
    position: int = 0  # samples trained
    end: int = 0  # the position where it will be done (0: not reported yet)
    samples_per_s: float = 0.0
    placement: list[int] = field(default_factory=list)  # workers per host (empty: none yet)
    home: int = -1  # the host its launcher runs on (-1: not started)
    started: float | None = None
    ended: float | None = None
    measured: dict[str, list[float]] = field(default_factory=dict)  # workers -> recent step seconds
    allocations: list[tuple[float, int]] = field(default_factory=list)  # (time, workers) as observed
    priority: int = 0  # its class: a higher one's arrival may suspend it
    preemptible: bool = True  # False: never suspended (`submit --no-preempt`)
    checkpoint_dir: str = ""  # where it checkpoints (what it resumes from)
    checkpoint_every: str = ""
    resumed: float | None = None  # when its launcher last started
    launches: list[float] = field(default_factory=list)  # when each of its launchers started
    suspending: float | None = None  # when it was asked to suspend (its launcher still runs)
    stopped_at: int = -1  # the step it stopped at, while suspended (its latest checkpoint)
    suspensions: list[float] = field(default_factory=list)  # when it was suspended
    stall: float | None = None  # its last suspension's stall, until the resume's cost is measured
    costs: list[float] = field(default_factory=list)  # measured suspend + resume seconds
    boots: list[float] = field(default_factory=list)  # measured launch -> first step seconds
    booting: bool = False  # its launcher (re)started and it has not reported a step yet
    growing: float | None = None  # when a grow was asked of it, until its new workers are seen
    joins: list[float] = field(default_factory=list)  # measured grow ask -> new workers seen seconds
    stalls: list[float] = field(default_factory=list)  # measured suspend ask -> launcher gone seconds
    max_batch: int = 0  # `submit --max-batch`: it adapts its batch up to this (0: not said)
    init_batch: int = 0  # its run log's first batch (B0), 0 until read
    largest_batch: int = 0  # the largest batch its run log shows
    noise_scale: float | None = None  # its run log's latest gradient noise scale (samples)

    @property
    def active(self) -> bool:
        return self.state not in ENDED

    def measurements(self) -> list[Measured]:
        """Its step times at its current batch (a goodput job's earlier batches are other models)."""
        return [
            Measured(n, 1, statistics.median(times))
            for (n, b), times in ((size_key(k, self.batch_size), v) for k, v in self.measured.items())
            if times and b == self.batch_size
        ]

    def stats(self) -> BatchStats | None:
        if not self.init_batch:
            return None
        return BatchStats(
            self.init_batch, self.batch_size or self.init_batch, self.largest_batch, self.noise_scale
        )


@dataclass(frozen=True)
class Observed:
    """One read of a running job's launcher (its ``taiji status``)."""

    size: int
    version: int
    step: int = 0
    batch_size: int = 0
    position: int = 0
    end: int = 0
    samples_per_s: float = 0.0
    placement: tuple[int, ...] = ()  # workers per host (empty: all on its home host)


def size_key(key: str, batch: int) -> tuple[int, int]:
    """(workers, batch) of a key of ``LiveJob.measured``: ``"N@B"`` (``"N"`` in an older state: ``batch``)."""
    size, _, at = key.partition("@")
    return int(size), int(at) if at else batch


def seconds_left(job: LiveJob) -> float:
    """Seconds ``job`` still trains at its present speed (infinite until it reported its end and speed)."""
    if not job.end or job.samples_per_s <= 0:
        return math.inf
    return max(0, job.end - job.position) / job.samples_per_s


def last_start(job: LiveJob, now: float) -> float:
    """When ``job`` last (re)started (``now`` if it never did)."""
    return job.resumed if job.resumed is not None else job.started if job.started is not None else now
