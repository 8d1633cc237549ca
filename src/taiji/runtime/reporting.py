"""What the Job tells the user: progress lines, the run directory's metrics and events, `taiji status`."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .job import Job, Step

log = logging.getLogger("taiji.runtime.job")


class Reporter:
    """Rank 0 writes the run log and status; every rank keeps its samples/s for benchmarks."""

    def __init__(self, job: "Job", run_dir: str | None, log_every: int):
        self.job = job
        self.run_dir = run_dir
        self.log_every = log_every
        self._run_log: Any = None
        self._last_commit_time = 0.0
        self._samples_since_log = 0
        self._time_of_log = 0.0
        self.samples_per_second = 0.0

    def start(self) -> None:
        self._time_of_log = self._last_commit_time = time.perf_counter()

    def restart_step_clock(self) -> None:
        """A transition's stall is reported as such, not as a slow step."""
        self._last_commit_time = time.perf_counter()

    def event(self, kind: str, **details: Any) -> None:
        """Rank 0 records what happened to the job in the run directory (if there is one)."""
        run_log = self._runlog()
        if run_log is not None:
            run_log.log_event(kind, self.job.progress.step, **details)

    def close(self) -> None:
        if self._run_log is not None:
            self._run_log.close()
            self._run_log = None

    def _runlog(self) -> Any:
        if self.run_dir is None or self.job.peer.rank != 0:
            return None
        if self._run_log is None:  # opened by whoever is rank 0 now; files are appended to
            from ..metrics.runlog import RunLog
            self._run_log = RunLog(self.run_dir)
        return self._run_log

    def committed(self, step: "Step") -> None:
        job = self.job
        now = time.perf_counter()
        step_seconds, self._last_commit_time = now - self._last_commit_time, now
        self._samples_since_log += step.global_batch_size
        run_log = self._runlog()
        if run_log is not None and job._monitoring(step.index):
            stats = step.stats
            assert stats is not None
            run_log.log_metrics({
                "step": step.index, "epoch": step.epoch, "version": job.peer.version, "size": job.peer.size,
                "batch_size": step.global_batch_size, "loss": stats.loss,
                "samples_per_s": step.global_batch_size / step_seconds if step_seconds > 0 else None,
                "gns": job.gns.b_noise, "grad_sqnorm": job.gns.grad_sqnorm, "trace_sigma": job.gns.trace_sigma,
                "grad_variance": stats.grad_variance, "straggler": stats.straggler,
                "lr": job.optimizer.param_groups[0].get("lr")})

    def phase_closed(self, samples: int, seconds: float | None) -> None:
        """A decoupled phase ended at a sync point: one metrics line for it (rank 0)."""
        job = self.job
        self._last_commit_time = time.perf_counter()
        if seconds:
            self.samples_per_second = samples / seconds
        run_log = self._runlog()
        if run_log is not None:
            run_log.log_metrics({
                "step": job.progress.step, "epoch": job.progress.epoch, "version": job.peer.version,
                "size": job.peer.size, "batch_size": job.progress.sampler.batch_size,
                "samples_per_s": samples / seconds if seconds else None,
                "lr": job.optimizer.param_groups[0].get("lr"), "strategy": job.strategy_name})
        if job.peer.rank == 0:
            log.info("epoch %d step %d: %d samples in the last decoupled phase, %s samples/s on %d workers",
                     job.progress.epoch, job.progress.step, samples,
                     f"{samples / seconds:.0f}" if seconds else "n/a", job.peer.size)
            self.write_status()

    def maybe_log_progress(self, step: "Step") -> None:
        job = self.job
        if not self.log_every or job.progress.step % self.log_every:
            return
        now = time.perf_counter()
        elapsed = max(now - self._time_of_log, 1e-9)
        self.samples_per_second = self._samples_since_log / elapsed
        self._samples_since_log, self._time_of_log = 0, now
        if job.peer.rank == 0:
            stats = step.stats
            loss = step.loss if stats is None or stats.loss is None else stats.loss
            gns = job.gns.b_noise
            log.info("epoch %d step %d: loss %s, %.0f samples/s, global batch %d on %d workers, GNS %s",
                     step.epoch, job.progress.step, "n/a" if loss is None else f"{loss:.4f}",
                     self.samples_per_second, step.global_batch_size, job.peer.size,
                     "n/a" if gns is None else f"{gns:.0f}")
            self.write_status()

    def write_status(self) -> None:
        job = self.job
        if job.peer.elastic and job.peer.rank == 0:
            job.peer.job_store.write_status({  # type: ignore[union-attr]
                "step": job.progress.step, "epoch": job.progress.epoch,
                "batch_size": job.progress.sampler.batch_size, "version": job.peer.version,
                "size": job.peer.size, "samples_per_s": round(self.samples_per_second, 1),
                "time": time.time()})
