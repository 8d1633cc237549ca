"""The live scheduler's state and decisions (pure): submissions, observations and time in,
changes out — like ``cluster/controller.py`` for one job. ``launch/sched_daemon.py`` does the effects
(launching jobs, reading their launchers, proposing resizes, the request socket).

One host today: the slots are its cores and every placement is ``(workers,)``. Each round the
jobs' measured step times refit their models (:mod:`taiji.sched.live`), the simulator's policy
allocates, targets are clamped to each job's ``[min_np, max_np]`` (a running job never goes below
its minimum: taiji cannot pause a job) and :class:`~taiji.sched.rounds.Rounds` turns them into
shrinks first, grows after. A job the policy gives no slot stays queued.

The state is plain data (``to_json``/``from_json``): a restarted daemon loads it and re-adopts
the jobs whose launchers still run.
"""
from __future__ import annotations

import logging
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import ConfigError
from .cluster import Cluster
from .live import Measured, StepModel, fit_step_model, live_application, live_view
from .rounds import Ask, Change, Rounds
from .sim import Policy

log = logging.getLogger(__name__)

ENDED = ("finished", "failed", "cancelled")
KEEP_MEASUREMENTS = 8          # recent step times kept per size
GUESS_BATCH = 128              # a queued job's batch and work are unknown until it reports them
                               # (the work from `submit --work` if given; else a typical job's)
GUESS_SAMPLES = 60000
GUESS_SECONDS_PER_SAMPLE = 1e-3


@dataclass
class LiveJob:
    """One submitted job as the daemon knows it."""
    id: str
    name: str
    command: list[str]
    min_np: int
    max_np: int
    requested: int            # what a rigid policy (FIFO) runs it at
    weight: float
    submitted: float
    cwd: str = ""             # where it was submitted (its command runs there)
    work_hint: int = 0        # samples to train, as the submitter guessed (until the job reports its own)
    state: str = "queued"     # queued | running | finished | failed | cancelled
    reason: str = ""
    size: int = 0             # workers it runs now (its launcher says)
    version: int = 0
    step: int = 0
    batch_size: int = 0
    position: int = 0         # samples trained
    end: int = 0              # the position where it will be done (0: not reported yet)
    samples_per_s: float = 0.0
    started: float | None = None
    ended: float | None = None
    measured: dict[str, list[float]] = field(default_factory=dict)   # workers -> recent step seconds
    allocations: list[tuple[float, int]] = field(default_factory=list)  # (time, workers) as observed

    @property
    def active(self) -> bool:
        return self.state not in ENDED

    def measurements(self) -> list[Measured]:
        return [Measured(int(n), 1, statistics.median(times)) for n, times in self.measured.items() if times]


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


class Scheduler:
    def __init__(self, slots: int, policy: Policy, shrink_timeout: float = 30.0):
        if slots < 1:
            raise ConfigError(f"the scheduler needs at least one slot, got {slots}")
        self.slots = slots
        self.policy = policy
        self.cluster = Cluster(num_hosts=1, gpus_per_host=slots, cpus_per_host=slots)
        self.rounds = Rounds(slots=(slots,), shrink_timeout=shrink_timeout)
        self.jobs: dict[str, LiveJob] = {}
        self.next_id = 1

    # -- what happens to jobs -------------------------------------------------------------------

    def submit(self, now: float, command: list[str], min_np: int = 1, max_np: int | None = None,
               np: int | None = None, weight: float = 1.0, name: str = "", cwd: str = "",
               work: int = 0) -> LiveJob:
        """Queue a job; ConfigError (with the reason) for one that can never run here."""
        max_np = self.slots if max_np is None else max_np
        if not command:
            raise ConfigError("submit needs a command to run (taiji sched submit -- python train.py ...)")
        if min_np < 1 or max_np < min_np:
            raise ConfigError(f"need 1 <= min_np <= max_np, got min_np={min_np}, max_np={max_np}")
        if min_np > self.slots:
            raise ConfigError(f"the job needs at least {min_np} workers but this scheduler has {self.slots} "
                              f"slot(s): it could never run (lower --min-np or add slots)")
        if not (math.isfinite(weight) and weight > 0):
            raise ConfigError(f"weight must be a number > 0, got {weight}")
        if work < 0:
            raise ConfigError(f"work must be >= 0 samples (0: unknown), got {work}")
        requested = min(max_np, self.slots) if np is None else np
        if not min_np <= requested <= max_np or requested > self.slots:
            raise ConfigError(f"-np {requested} must lie in [min_np={min_np}, max_np={max_np}] and fit "
                              f"{self.slots} slot(s)")
        job_id = f"s{self.next_id:04d}"
        self.next_id += 1
        job = LiveJob(job_id, name or job_id, list(command), min_np, max_np, requested, weight, now, cwd=cwd,
                      work_hint=work)
        self.jobs[job_id] = job
        return job

    def observe(self, now: float, job_id: str, seen: Observed) -> None:
        job = self.jobs[job_id]
        if not job.active:
            return
        if job.state == "queued":
            job.state, job.started = "running", now
        fresh = seen.step > job.step   # a status its rank 0 wrote since the last read
        steady = seen.version == job.version and seen.size == job.size
        if fresh and steady and seen.samples_per_s > 0 and seen.batch_size > 0 and seen.size > 0:
            times = job.measured.setdefault(str(seen.size), [])
            times.append(seen.batch_size / seen.samples_per_s)
            del times[:-KEEP_MEASUREMENTS]
        if seen.size != job.size:
            job.allocations.append((now, seen.size))
        job.size, job.version, job.step = seen.size, seen.version, seen.step
        job.batch_size = seen.batch_size or job.batch_size
        job.position, job.end, job.samples_per_s = seen.position, seen.end or job.end, seen.samples_per_s

    def launched(self, now: float, job_id: str) -> None:
        """Its launcher started (no workers reported yet)."""
        job = self.jobs[job_id]
        if job.state == "queued":
            job.state, job.started = "running", now

    def ended(self, now: float, job_id: str, state: str, reason: str = "") -> None:
        if state not in ENDED:
            raise ConfigError(f"a job ends as one of {ENDED}, not {state!r}")
        job = self.jobs[job_id]
        if not job.active:
            return
        job.state, job.reason, job.ended = state, reason, now
        if job.size:
            job.allocations.append((now, 0))
        job.size = 0

    # -- rounds ---------------------------------------------------------------------------------

    def holds(self) -> dict[str, tuple[int, ...]]:
        return {job.id: (job.size,) for job in self.jobs.values() if job.active}

    def round(self, now: float) -> list[Change]:
        """Run the policy on every active job and start applying its targets."""
        active = [job for job in self.jobs.values() if job.active]
        if not active:
            return []
        views = [self.view_of(job, now) for job in active]
        allocations = self.policy.allocate(now, self.cluster, views)
        targets = {}
        for job in active:
            given = allocations.get(job.id)
            workers = given.replicas if given is not None else 0
            if job.state == "running":
                workers = max(job.min_np, min(job.max_np, workers))
            elif workers < job.min_np:
                continue   # stays queued
            targets[job.id] = (min(workers, job.max_np),)
        active_ids = {job.id: job for job in active}
        return self.rounds.start(now, self.holds(), targets, {j: active_ids[j].min_np for j in targets},
                                 self.versions())

    def tick(self, now: float) -> list[Change]:
        return self.rounds.tick(now, self.holds(), self.versions())

    def versions(self) -> dict[str, int]:
        return {job.id: job.version for job in self.jobs.values() if job.active}

    def request_failed(self, job_id: str) -> None:
        """A change never reached the job's launcher: the next round asks again."""
        self.rounds.withdraw(job_id)

    def view_of(self, job: LiveJob, now: float | None = None):  # noqa: ANN202 - a sim.JobView
        """What the policy sees of ``job``: its fitted model, work, progress and placement."""
        measured = job.measurements()
        batch = job.batch_size or self._typical(lambda j: j.batch_size, GUESS_BATCH)
        if measured:
            model = fit_step_model(batch, measured)
        else:   # never measured: compute that scales linearly, at a typical job's speed
            model = StepModel(0.0, self._typical(self._seconds_per_sample, GUESS_SECONDS_PER_SAMPLE), 0.0, 0.0, 0.0)
        work = job.end or job.work_hint or self._typical(lambda j: j.end or j.work_hint, GUESS_SAMPLES)
        app = live_application(job.id, model, batch, samples_per_epoch=work, epochs=1,
                               max_replicas=min(job.max_np, self.slots))
        placement = (job.size,) if job.size else None
        held = job.allocations + ([(now, 0)] if now is not None and job.allocations else [])
        attained = sum((b[0] - a[0]) * a[1] for a, b in zip(held, held[1:]))   # worker-seconds so far
        return live_view(app, job.submitted, job.requested, job.position / batch, placement,
                         attained_worker_s=attained, peak_replicas=max((n for _, n in job.allocations), default=0),
                         weight=job.weight)

    def _typical(self, read, default: float):  # noqa: ANN001, ANN202
        values = [v for v in (read(j) for j in self.jobs.values()) if v]
        return type(default)(statistics.median(values)) if values else default

    @staticmethod
    def _seconds_per_sample(job: LiveJob) -> float:
        """Worker-seconds per sample, from its fastest measured size (0 when never measured)."""
        per = [n * statistics.median(t) / job.batch_size for n, t in
               ((int(k), v) for k, v in job.measured.items()) if t and job.batch_size]
        return min(per) if per else 0.0

    # -- persistence ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "next_id": self.next_id, "jobs": [asdict(j) for j in self.jobs.values()],
                "asked": {job: [list(a.target), list(a.reserve), a.shrink] for job, a in self.rounds.asked.items()}}

    def load_json(self, data: Mapping[str, Any]) -> None:
        """Jobs and outstanding asks of a previous daemon (its slots must be ours)."""
        if int(data.get("slots", self.slots)) != self.slots:
            raise ConfigError(f"the saved state is for {data['slots']} slots, this daemon has {self.slots}: "
                              f"start it with the same --slots or move the state away")
        self.next_id = int(data.get("next_id", 1))
        for raw in data.get("jobs", []):
            job = LiveJob(**{**raw, "allocations": [tuple(a) for a in raw.get("allocations", [])]})
            self.jobs[job.id] = job
        for job_id, (target, reserve, shrink) in data.get("asked", {}).items():
            self.rounds.asked[job_id] = Ask(tuple(target), tuple(reserve), bool(shrink))
