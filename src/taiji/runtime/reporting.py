"""What the Job tells the user: progress lines, the run directory's metrics and events, and the
status ``taiji status`` reads. The Job hands the Reporter typed records; rank 0 writes them.

A step's samples/s is timed from the previous commit, or from the end of the last pause if one
came since: time outside training (``job.pause()``, a membership change) is never a slow step.
Rank 0 records each ``job.pause()`` as a ``pause`` event with its start and length, so
``taiji plot`` can shade it; a membership change is already an event of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..metrics.runlog import PAUSE_EVENT, RunLog, last_recorded_step

log = logging.getLogger("taiji.runtime.job")

STATUS_SECONDS = 1.0  # rank 0's status is written at least this often (and every log_every steps)


@dataclass(frozen=True)
class Snapshot:
    """Where the job stands, as the status shows it."""

    step: int
    epoch: int
    batch_size: int
    version: int
    size: int
    position: int = 0  # samples trained since the start: epoch·N + cursor
    end: int = 0  # the position where training will end (0: unknown)


@dataclass(frozen=True)
class Event:
    """Something that happened to the job (start, end, resize, failure, recovery, policy, strategy)."""

    kind: str
    step: int
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepCommitted:
    index: int
    epoch: int  # the epoch the step's samples came from (``where.epoch`` may be the next)
    where: Snapshot  # after the commit
    global_batch: int
    monitored: bool
    loss: float | None
    grad_variance: float | None
    straggler: float
    gns: float | None
    grad_sqnorm: float | None
    trace_sigma: float | None
    lr: float | None
    allreduce_wait: float | None = None  # what the step waited for its gradients' allreduce after backward
    topology: str = ""

    @staticmethod
    def of(attempt: Any, where: Snapshot, monitors: Any, lr: float | None) -> StepCommitted:
        """From a committed Attempt and the monitors after it."""
        stats, gns = attempt.stats, monitors.gns
        return StepCommitted(
            attempt.index,
            attempt.epoch,
            where,
            attempt.global_batch_size,
            attempt.measure,
            stats.loss,
            monitors.grad_variance,
            stats.straggler,
            gns.b_noise,
            gns.grad_sqnorm,
            gns.trace_sigma,
            lr,
            attempt.allreduce_wait,
            attempt.topology,
        )


@dataclass(frozen=True)
class PhaseClosed:
    where: Snapshot
    samples: int
    seconds: float | None
    lr: float | None
    strategy: str


@dataclass(frozen=True)
class Paused:
    """Time passed that is not training (``job.pause()``, a membership change): not a slow step.
    Sent when it ends; it covers the time since the last commit (or the previous pause).
    ``transition``: a membership change's, already recorded by its own event (with its seconds)."""

    transition: bool = False


@dataclass(frozen=True)
class Ended:
    where: Snapshot


class Reporter:
    """Rank 0 writes the run log and status; every rank keeps its samples/s for benchmarks."""

    def __init__(
        self,
        run_dir: str | None,
        log_every: int,
        lead: Callable[[], bool],
        write_status: Callable[[dict], None],
    ):
        self.run_dir = run_dir
        self.log_every = log_every
        self._lead = lead
        self._write_status = write_status
        self._run_log: RunLog | None = None
        # The step clock restarts at each commit and at the end of each pause.
        self._step_clock = self._time_of_log = time.perf_counter()
        self._samples_since_log = 0
        self._paused_since_log = 0.0  # seconds of pauses within the periodic rate's window
        self._step = 0  # committed steps, as the events' step counts them
        self.samples_per_second = 0.0
        # the status window: its own samples/s, and the last step's figures (metrics, `taiji top`)
        self._status_clock = self._time_of_log
        self._samples_since_status, self._paused_since_status = 0, 0.0
        self._last: dict[str, Any] = {}
        self._checkpoint: dict[str, Any] = {}  # rank 0's last checkpoint: step, wall time, stall

    def on(self, record: Any) -> None:
        if isinstance(record, StepCommitted):
            self._committed(record)
        elif isinstance(record, Event):
            self._step = record.step
            if record.kind == "checkpoint":  # staged at this boundary; written in the background
                self._checkpoint = {
                    "checkpoint_step": record.step,
                    "checkpoint_time": time.time(),
                    "checkpoint_stall_s": record.details.get("stall_s"),
                }
            if record.kind == "start":
                self._time_of_log = self._step_clock = self._status_clock = time.perf_counter()
                self._paused_since_log = self._paused_since_status = 0.0
            run_log = self._runlog()
            if run_log is not None:
                run_log.log_event(record.kind, record.step, **record.details)
        elif isinstance(record, PhaseClosed):
            self._phase_closed(record)
        elif isinstance(record, Paused):
            self._paused(record.transition)
        elif isinstance(record, Ended):
            self._status(record.where)
            if self._run_log is not None:
                self._run_log.close()
                self._run_log = None
        else:
            raise TypeError(f"Reporter.on: unknown record {record!r}")

    def recorded_step(self) -> int | None:
        """The last step a previous run recorded in this run directory (rank 0; None elsewhere,
        or with no run directory): call before this run writes."""
        if self.run_dir is None or not self._lead():
            return None
        return last_recorded_step(self.run_dir)

    def _runlog(self) -> RunLog | None:
        if self.run_dir is None or not self._lead():
            return None
        if self._run_log is None:  # opened by whoever is rank 0 now; files are appended to
            self._run_log = RunLog(self.run_dir)
        return self._run_log

    def _paused(self, transition: bool) -> None:
        """Leave the time since the step clock last started out of the next step's samples/s
        and out of the periodic rate; rank 0 records it unless it was a transition's."""
        now = time.perf_counter()
        seconds, self._step_clock = now - self._step_clock, now
        self._paused_since_log += seconds
        self._paused_since_status += seconds
        run_log = self._runlog()
        if run_log is not None and not transition:
            run_log.log_event(PAUSE_EVENT, self._step, time=time.time() - seconds, seconds=seconds)

    def _committed(self, record: StepCommitted) -> None:
        now = time.perf_counter()
        step_seconds, self._step_clock = now - self._step_clock, now
        self._samples_since_log += record.global_batch
        self._samples_since_status += record.global_batch
        where = record.where
        self._step = where.step
        self._last = {
            "step_s": step_seconds,
            "allreduce_wait_s": record.allreduce_wait,
            "lr": record.lr,
            "loss": record.loss,
            "straggler": record.straggler,
            "gns": record.gns if record.gns is not None else self._last.get("gns"),
        }
        run_log = self._runlog()
        if run_log is not None and record.monitored:
            # batch_size is the decided size; samples what the step trained on (fewer in an
            # epoch's short last batch), which is what its samples/s counts.
            run_log.log_metrics(
                {
                    "step": record.index,
                    "epoch": record.epoch,
                    "version": where.version,
                    "size": where.size,
                    "batch_size": where.batch_size,
                    "samples": record.global_batch,
                    "loss": record.loss,
                    "samples_per_s": record.global_batch / step_seconds if step_seconds > 0 else None,
                    "gns": record.gns,
                    "grad_sqnorm": record.grad_sqnorm,
                    "trace_sigma": record.trace_sigma,
                    "grad_variance": record.grad_variance,
                    "straggler": record.straggler,
                    "lr": record.lr,
                    "allreduce_wait_ms": None
                    if record.allreduce_wait is None
                    else 1000 * record.allreduce_wait,
                    "topology": record.topology or None,
                }
            )
        if not self.log_every or where.step % self.log_every:
            if now - self._status_clock >= STATUS_SECONDS:
                self._status(where)
            return
        elapsed = max(now - self._time_of_log - self._paused_since_log, 1e-9)
        self.samples_per_second = self._samples_since_log / elapsed
        self._samples_since_log, self._time_of_log, self._paused_since_log = 0, now, 0.0
        if self._lead():
            log.info(
                "epoch %d step %d: loss %s, %.0f samples/s, global batch %d on %d workers, GNS %s",
                where.epoch,
                where.step,
                "n/a" if record.loss is None else f"{record.loss:.4f}",
                self.samples_per_second,
                record.global_batch,
                where.size,
                "n/a" if record.gns is None else f"{record.gns:.0f}",
            )
            self._status(where)

    def _phase_closed(self, record: PhaseClosed) -> None:
        self._step_clock = time.perf_counter()
        samples, seconds, where = record.samples, record.seconds, record.where
        self._step = where.step
        if seconds:
            self.samples_per_second = samples / seconds
        run_log = self._runlog()
        if run_log is not None:
            run_log.log_metrics(
                {
                    "step": where.step,
                    "epoch": where.epoch,
                    "version": where.version,
                    "size": where.size,
                    "batch_size": where.batch_size,
                    "samples": samples,
                    "samples_per_s": samples / seconds if seconds else None,
                    "lr": record.lr,
                    "strategy": record.strategy,
                }
            )
        if self._lead():
            log.info(
                "epoch %d step %d: %d samples in the last decoupled phase, %s samples/s on %d workers",
                where.epoch,
                where.step,
                samples,
                f"{samples / seconds:.0f}" if seconds else "n/a",
                where.size,
            )
            self._status(where)

    def _status(self, where: Snapshot) -> None:
        """Rank 0's status: where the job is, its samples/s since the last status (at least
        ``STATUS_SECONDS`` apart, pauses left out) and the last step's figures."""
        now = time.perf_counter()
        elapsed = now - self._status_clock - self._paused_since_status
        rate = self._samples_since_status / elapsed if elapsed > 0 and self._samples_since_status else None
        self._status_clock, self._samples_since_status, self._paused_since_status = now, 0, 0.0
        if self._lead():
            self._write_status(
                {
                    "step": where.step,
                    "epoch": where.epoch,
                    "batch_size": where.batch_size,
                    "version": where.version,
                    "size": where.size,
                    "position": where.position,
                    "end": where.end,
                    "samples_per_s": round(rate or self.samples_per_second, 1),
                    "time": time.time(),
                    **self._last,
                    **self._checkpoint,
                }
            )
