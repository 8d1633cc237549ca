"""The elastic training loop: step boundaries, commit or retry, membership transitions.

``for step in job:`` yields one Step per global batch. The user runs forward and
``step.backward(loss)``; when the loop comes back, the Job finishes the step:

1. the step's collectives are waited for, including the control message (one small
   ``ctrl`` allreduce started when the step began, overlapping compute) that carries the
   newest config version any worker has seen;
2. **commit** only if all succeeded: optimizer step, step counter, sampler cursor;
3. **transition** if the control message names a newer version: every worker switches at
   this same boundary, then syncs state from the most advanced replica;
4. on a failed collective nothing is committed: the worker reports it, waits for a newer
   config (the launcher removes the dead or hung peer), transitions, syncs and **retries the
   same step**, whose global batch is now split over the survivors.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from .. import env
from ..comm.communicator import Handle
from ..monitor.gns import GNSEstimator, two_batch_estimates
from ..monitor.stats import StepStats, WorkerReport
from ..data.sampler import ElasticSampler, SamplerState, advance, global_span
from ..errors import CommError, ConfigError, StoreError
from ..strategies.base import Strategy
from ..strategies.sync_sgd import SyncSGD
from . import faults
from .peer import Peer, default_peer
from .state import sync_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """Where training stands; identical on every replica after each committed step."""
    step: int = 0
    sampler: SamplerState = SamplerState()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def to_json(self) -> dict:
        return {"step": self.step, **asdict(self.sampler)}

    @staticmethod
    def from_json(data: dict) -> "Progress":
        return Progress(step=int(data["step"]), sampler=SamplerState(
            epoch=int(data["epoch"]), cursor=int(data["cursor"]), batch_size=int(data["batch_size"])))


class Step:
    """One global batch: this worker's slice of it, and the way to submit its loss."""

    def __init__(self, job: "Job", index: int, epoch: int, batch: Any, indices: torch.Tensor,
                 span: tuple[int, int]):
        self.job = job
        self.index = index
        self.epoch = epoch
        self.batch = batch
        self.indices = indices
        self.local_batch_size = len(indices)
        self.span = span  # positions [lo, hi) of the epoch's permutation this step consumes
        self.global_batch_size = span[1] - span[0]
        self.loss: float | None = None
        self.synchronized = False
        self.error: CommError | None = None
        self.started = time.perf_counter()
        self.split_sqnorm: float | None = None  # one worker: mean |g|² of two half-batches
        self.stats: StepStats | None = None     # agreed by all workers once synchronised

    @property
    def failed(self) -> bool:
        return self.error is not None

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` and synchronise gradients.

        ``loss`` is the mean over this worker's slice, or the per-sample losses (a vector, as
        from ``reduction="none"``; their mean is used). Afterwards every worker holds the
        gradient of the mean loss over the global batch. If a peer fails meanwhile this does
        not raise: the step is marked failed and the Job retries it on the surviving workers.
        """
        try:
            if self.local_batch_size > 0:
                if loss.dim() == 1 and self.job._split_for_gns(self):
                    self._split_backward(loss)
                else:
                    loss = loss.mean() if loss.dim() == 1 else loss
                    loss.backward()
                self.loss = float(loss.detach().mean())
            self.job._fire("allreduce")
            self.job._synchronize(self)
        except CommError as exc:
            self.error = self.error or exc

    def _split_backward(self, losses: torch.Tensor) -> None:
        """One worker, per-sample losses: backward the two halves separately so the gradient
        noise scale has two batch sizes to compare (b/2 and b); the summed gradient is the
        same as one backward of the mean."""
        n, half = len(losses), len(losses) // 2
        params = [p for p in self.job.model.parameters() if p.requires_grad]
        with self.job.strategy.no_sync():  # type: ignore[attr-defined]
            (losses[:half].sum() / n).backward(retain_graph=True)
        first = [p.grad.detach().clone() if p.grad is not None else None for p in params]
        (losses[half:].sum() / n).backward()
        sq_a = sq_b = 0.0
        for p, g_a in zip(params, first):
            if p.grad is None or g_a is None:
                continue
            sq_a += float((g_a * (n / half)).square().sum())
            sq_b += float(((p.grad - g_a) * (n / (n - half))).square().sum())
        self.split_sqnorm = (sq_a + sq_b) / 2


class Job:
    """Elastic data-parallel training loop over ``dataset`` with a global batch size."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
                 batch_size: int, *, strategy: Strategy | None = None, epochs: int = 1,
                 max_steps: int | None = None, seed: int = 0, shuffle: bool = True,
                 lr_scheduler: Any = None, collate_fn: Callable[[list], Any] | None = None,
                 device: torch.device | str | None = None, log_every: int = 50,
                 peer: Peer | None = None, recovery_timeout: float | None = None,
                 on_commit: Callable[["Step"], None] | None = None, monitor_every: int = 1,
                 gns_decay: float = 0.95, run_dir: str | None = None):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if epochs < 1 and max_steps is None:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        if max_steps is not None and max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {max_steps}")
        self.model = model
        self.optimizer = optimizer
        self.dataset = dataset
        self.peer = peer or default_peer()
        self.strategy = (strategy or SyncSGD()).attach(model, lambda: self.peer.comm)
        self.epochs = epochs
        self.max_steps = max_steps
        self.lr_scheduler = lr_scheduler
        self.collate_fn = collate_fn
        self.device = torch.device(device) if device is not None else None
        self.log_every = log_every
        self.on_commit = on_commit
        if monitor_every < 0:
            raise ConfigError(f"monitor_every must be >= 0 (0 = off), got {monitor_every}")
        self.monitor_every = monitor_every
        self.gns = GNSEstimator(gns_decay)
        self.stats: StepStats | None = None  # the last committed step's agreed statistics
        self.last_raw_estimates: tuple[float, float] | None = None  # unsmoothed (|G|², tr Σ)
        self.run_dir = (run_dir if run_dir is not None else env.RUN_DIR.get()) or None  # "" = none
        self._run_log: Any = None
        self._last_commit_time = 0.0
        self.recovery_timeout = env.RECOVERY_TIMEOUT.get() if recovery_timeout is None else recovery_timeout
        self.sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)  # type: ignore[arg-type]
        self.progress = Progress(sampler=SamplerState(batch_size=batch_size))
        self._started = False
        self._stop_requested = False
        self._stop_agreed = False
        self._has_state = self.peer.joined  # a joiner gets its state from the others
        self._samples_since_log = 0
        self._time_of_log = 0.0
        self.samples_per_second = 0.0
        self.transitions: list[dict] = []  # (for tests and benchmarks) what each change cost
        store = self.peer.job_store
        self._faults = faults.FaultPlan(
            faults.parse(env.FAULTS.get()),
            (lambda i: store.add(f"fault/{i}", 1) == 1) if store is not None else (lambda i: True))

    # -- loop -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop training after the current step, on every worker at the same step boundary
        (the request rides the step's control message). Callable from any worker."""
        self._stop_requested = True
        if not self.peer.elastic or self.peer.size == 1:
            self._stop_agreed = True

    @property
    def done(self) -> bool:
        if self._stop_agreed:
            return True
        if self.max_steps is not None and self.progress.step >= self.max_steps:
            return True
        return self.progress.epoch >= self.epochs

    def __iter__(self) -> Iterator[Step]:
        if self._started:
            raise ConfigError("a Job can be iterated once; create a new Job to train again")
        self._started = True
        if not self.peer.joined:
            self._fire("boot")
            started = time.perf_counter()
            self.peer.join(self.recovery_timeout)
            log.info("joined the job as rank %d of %d (v%d) after %.2fs at the door",
                     self.peer.rank, self.peer.size, self.peer.version, time.perf_counter() - started)
        self._sync_until_consistent(first=True)
        if self.peer.elastic:
            self.peer.job_store.set_training(self.peer.worker_id, True)  # type: ignore[union-attr]
        self._time_of_log = self._last_commit_time = time.perf_counter()
        self._event("start", size=self.peer.size, version=self.peer.version,
                    batch_size=self.progress.sampler.batch_size)
        while not self.done:
            step = self._make_step()
            try:
                yield step
            except GeneratorExit:
                self.strategy.abort_step()
                raise
            newer = self._finish(step)
            if step.failed:
                self._recover(step.error)
            elif newer > self.peer.version:
                self._transition(self.peer.read_config(newer), reason="resize")
        if self.peer.elastic:
            store = self.peer.job_store
            assert store is not None
            store.set_training(self.peer.worker_id, False)
            if self.peer.rank == 0:
                store.set_done()
                self._write_status()
        self._event("end", size=self.peer.size, version=self.peer.version)
        if self._run_log is not None:
            self._run_log.close()

    def _fire(self, phase: str) -> None:
        if self._faults.faults:
            self._faults.fire(phase, self.peer.rank, self.progress.step, self.peer.worker_id)

    def _make_step(self) -> Step:
        progress = self.progress
        rank, size = self.peer.rank, self.peer.size
        lo, hi = global_span(progress.sampler, self.sampler.num_samples)
        indices = self.sampler.local_indices(progress.sampler, rank, size)
        batch = self._fetch(indices)
        self.peer.step = progress.step
        self.strategy.begin_step(len(indices) / (hi - lo))
        self.strategy.measure_norms = self._monitoring(progress.step)
        step = Step(self, progress.step, progress.epoch, batch, indices, (lo, hi))
        self._fire("compute")
        return step

    def _monitoring(self, step: int) -> bool:
        return self.monitor_every > 0 and step % self.monitor_every == 0

    def _split_for_gns(self, step: Step) -> bool:
        return (self.peer.size == 1 and self._monitoring(step.index) and step.local_batch_size >= 2
                and hasattr(self.strategy, "no_sync"))

    def _fetch(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is None:
            batch: Any = tuple(t[indices] for t in self.dataset.tensors)
        else:
            collate = self.collate_fn or default_collate
            batch = collate([self.dataset[int(i)] for i in indices])
        if self.device is not None:
            batch = _to_device(batch, self.device)
        return batch

    def _synchronize(self, step: Step) -> None:
        """Finish the step's communication: gradients, plus the one control message.

        The control message is an allgather of one small row per worker (newest config version
        seen, stop request, monitors' local sums, loss, compute time), started once the last
        gradient bucket is on its way so it overlaps the allreduce; every worker then derives the
        same ``StepStats`` from the same rows.
        """
        if step.synchronized:
            return
        try:
            self.strategy.launch_all()
            report = self._report(step)
            control: Handle | None = None
            if self.peer.elastic:
                control = self.peer.comm.allgather(torch.tensor(report.to_row(), dtype=torch.float64),
                                                   channel="ctrl", async_op=True)
            self.strategy.synchronize()
            rows = [WorkerReport.from_row(r.tolist()) for r in control.wait()] if control else [report]
        except StoreError as exc:
            self.strategy.abort_step()
            raise CommError(f"[rank {self.peer.rank} v={self.peer.version}] the job store failed: {exc}") from exc
        except CommError:
            self.strategy.abort_step()
            raise
        step.stats = StepStats.reduce(rows, self.strategy.global_sqnorm())
        step.synchronized = True

    def _report(self, step: Step) -> WorkerReport:
        seen = self.peer.newer_version_published() if self.peer.elastic and self.peer.rank == 0 else 0
        local = step.split_sqnorm if step.split_sqnorm is not None else self.strategy.local_sqnorm()
        b = float(step.local_batch_size)
        return WorkerReport(
            version_seen=float(seen), stop=float(self._stop_requested),
            local_sqnorm=math.nan if local is None else local,
            sqnorm_batch=b / 2 if step.split_sqnorm is not None else b, local_batch=b,
            loss_sum=(step.loss or 0.0) * b, compute_seconds=time.perf_counter() - step.started)

    def _finish(self, step: Step) -> int:
        """Wait for the step's collectives; commit if all succeeded. Returns the newest
        config version the control message reported (our own if none)."""
        newer = self.peer.version
        if not step.failed:
            try:
                self._synchronize(step)  # the user may have called loss.backward() directly
            except CommError as exc:
                step.error = exc
        if step.failed:
            self.strategy.abort_step()
            # the retry must start from clean gradients, not accumulate onto this attempt's
            self.model.zero_grad(set_to_none=True)
            self.optimizer.zero_grad(set_to_none=True)
            return newer
        assert step.stats is not None
        newer = max(newer, step.stats.version_seen)
        self._stop_agreed = self._stop_agreed or step.stats.stop
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self._update_monitors(step)
        self._log_metrics(step)
        self.progress = replace(
            self.progress, step=self.progress.step + 1,
            sampler=advance(self.progress.sampler, step.global_batch_size, self.sampler.num_samples))
        self.peer.step = self.progress.step
        if self.on_commit is not None:
            self.on_commit(step)
        self._samples_since_log += step.global_batch_size
        if self.log_every and self.progress.step % self.log_every == 0:
            self._log_progress(step)
        return newer

    def _update_monitors(self, step: Step) -> None:
        stats = step.stats
        assert stats is not None
        self.stats = stats
        big = self.strategy.global_sqnorm()
        if stats.small_sqnorm is not None and big is not None:
            self.gns.update(stats.small_sqnorm, big, stats.small_batch, stats.global_batch)
            if stats.global_batch > stats.small_batch > 0:
                self.last_raw_estimates = two_batch_estimates(stats.small_sqnorm, big, stats.small_batch,
                                                              stats.global_batch)

    def _event(self, kind: str, **details: Any) -> None:
        """Rank 0 records what happened to the job in the run directory (if there is one)."""
        log_ = self._runlog()
        if log_ is not None:
            log_.log_event(kind, self.progress.step, **details)

    def _runlog(self) -> Any:
        if self.run_dir is None or self.peer.rank != 0:
            return None
        if self._run_log is None:  # opened by whoever is rank 0 now; files are appended to
            from ..metrics.runlog import RunLog
            self._run_log = RunLog(self.run_dir)
        return self._run_log

    def _log_metrics(self, step: Step) -> None:
        now = time.perf_counter()
        step_seconds, self._last_commit_time = now - self._last_commit_time, now
        log_ = self._runlog()
        if log_ is None or not self._monitoring(step.index):
            return
        stats = step.stats
        assert stats is not None
        log_.log_metrics({
            "step": step.index, "epoch": step.epoch, "version": self.peer.version, "size": self.peer.size,
            "batch_size": step.global_batch_size, "loss": stats.loss,
            "samples_per_s": step.global_batch_size / step_seconds if step_seconds > 0 else None,
            "gns": self.gns.b_noise, "grad_sqnorm": self.gns.grad_sqnorm, "trace_sigma": self.gns.trace_sigma,
            "grad_variance": stats.grad_variance, "straggler": stats.straggler,
            "lr": self.optimizer.param_groups[0].get("lr")})

    # -- membership changes -----------------------------------------------------------

    def _recover(self, error: CommError | None) -> None:
        """A collective failed: nothing was committed. Wait for the launcher's next config."""
        log.warning("step %d failed (%s); waiting for a new cluster config", self.progress.step,
                    str(error).split(". ")[0] if error else "collective failed")
        started = time.perf_counter()
        self.peer.report_failure()
        config = self.peer.wait_for_newer_config(self.recovery_timeout)
        self._transition(config, reason="failure", started=started)

    def _transition(self, config, reason: str, started: float | None = None) -> None:
        started = time.perf_counter() if started is None else started
        old_size, old_version = self.peer.size, self.peer.version
        if not self.peer.transition(config):
            log.info("not a member of cluster v%d: leaving at step %d", config.version, self.progress.step)
            self.strategy.detach()
            raise SystemExit(0)
        switched = time.perf_counter()
        self._sync_until_consistent(first=False)
        finished = time.perf_counter()
        record = {"reason": reason, "from_version": old_version, "to_version": self.peer.version,
                  "from_size": old_size, "to_size": self.peer.size, "step": self.progress.step,
                  "switch_s": switched - started, "sync_s": finished - switched, "total_s": finished - started}
        self.transitions.append(record)
        if reason == "failure":
            self._event("failure", time=time.time() - (finished - started), size=old_size, version=old_version)
            self._event("recovery", size=self.peer.size, version=self.peer.version, seconds=record["total_s"])
        else:
            self._event("resize", size=self.peer.size, from_size=old_size, version=self.peer.version,
                        seconds=record["total_s"])
        self._last_commit_time = time.perf_counter()
        log.info("cluster v%d -> v%d (%s): %d -> %d workers at step %d in %.3fs",
                 old_version, self.peer.version, reason, old_size, self.peer.size, self.progress.step,
                 finished - started)

    def _sync_until_consistent(self, first: bool) -> None:
        """Sync state on the current groups; if that fails too, recover and try again."""
        while True:
            try:
                if not first:
                    self._fire("sync")
                self._sync(first)
                return
            except CommError as exc:
                log.warning("state sync failed (%s); waiting for a new cluster config", str(exc).split(". ")[0])
                self.peer.report_failure()
                config = self.peer.wait_for_newer_config(self.recovery_timeout)
                if not self.peer.transition(config):
                    raise SystemExit(0)

    def _sync(self, first: bool) -> None:
        extra: dict[str, Any] = {"gns": self.gns.state_dict()}
        if self.lr_scheduler is not None:
            extra["lr_scheduler"] = self.lr_scheduler.state_dict()
        result = sync_state(self.peer.comm, self.model, self.optimizer,
                            self.progress.step if self._has_state else -1,
                            self.progress.to_json(), extra, force=first)
        if result.meta is not None:
            self.progress = Progress.from_json(result.meta)
            received = result.meta["extra"]
            self.gns.load_state_dict(received["gns"])
            if self.lr_scheduler is not None and "lr_scheduler" in received:
                self.lr_scheduler.load_state_dict(received["lr_scheduler"])
        self._has_state = True
        self.peer.step = self.progress.step

    # -- progress ---------------------------------------------------------------------

    def _log_progress(self, step: Step) -> None:
        now = time.perf_counter()
        elapsed = max(now - self._time_of_log, 1e-9)
        self.samples_per_second = self._samples_since_log / elapsed
        self._samples_since_log, self._time_of_log = 0, now
        if self.peer.rank == 0:
            stats = step.stats
            loss = step.loss if stats is None or stats.loss is None else stats.loss
            gns = self.gns.b_noise
            log.info("epoch %d step %d: loss %s, %.0f samples/s, global batch %d on %d workers, GNS %s",
                     step.epoch, self.progress.step, "n/a" if loss is None else f"{loss:.4f}",
                     self.samples_per_second, step.global_batch_size, self.peer.size,
                     "n/a" if gns is None else f"{gns:.0f}")
            self._write_status()

    def _write_status(self) -> None:
        if self.peer.elastic and self.peer.rank == 0:
            self.peer.job_store.write_status({  # type: ignore[union-attr]
                "step": self.progress.step, "epoch": self.progress.epoch,
                "batch_size": self.progress.sampler.batch_size, "version": self.peer.version,
                "size": self.peer.size, "samples_per_s": round(self.samples_per_second, 1),
                "time": time.time()})


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
