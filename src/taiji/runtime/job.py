"""The elastic training loop: step boundaries, commit or retry, membership transitions.

``for step in job:`` yields one Step per global batch. The user runs forward and
``step.backward(loss)``; when the loop comes back, the Job finishes the step:

1. the step's collectives are waited for, including the control message (one small
   ``ctrl`` allreduce started when the step began, overlapping compute) that carries the
   newest config version any worker has seen;
2. **commit** only if all succeeded: optimizer step, step counter, sampler cursor;
3. **adapt**: the policies run on the agreed Context and their decisions are applied;
4. **transition** if the control message names a newer version: every worker switches at
   this same boundary, then syncs state from the most advanced replica;
5. on a failed collective nothing is committed: the worker reports it, waits for a newer
   config (the launcher removes the dead or hung peer), transitions, syncs and **retries the
   same step**, whose global batch is now split over the survivors.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from .. import env
from ..comm.communicator import Handle
from ..monitor.gns import GNSEstimator, two_batch_estimates
from ..monitor.stats import StepStats, WorkerReport
from ..data.sampler import ElasticSampler, SamplerState, advance, global_span
from ..errors import CommError, ConfigError, ConsensusError, StoreError
from ..policies.base import Policy, PolicyError
from ..strategies.base import Strategy
from ..strategies.catalog import StrategyCatalog
from . import faults
from .adapt import Adaptation
from .decoupled import Decoupled
from .step import Progress, Step
from .peer import Peer, default_peer
from .reporting import Reporter
from .state import sync_state

log = logging.getLogger(__name__)


class Job:
    """Elastic data-parallel training loop over ``dataset`` with a global batch size."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
                 batch_size: int, *, strategy: Strategy | None = None, epochs: int = 1,
                 max_steps: int | None = None, seed: int = 0, shuffle: bool = True,
                 lr_scheduler: Any = None, collate_fn: Callable[[list], Any] | None = None,
                 device: torch.device | str | None = None, log_every: int = 50,
                 peer: Peer | None = None, recovery_timeout: float | None = None,
                 on_commit: Callable[["Step"], None] | None = None, monitor_every: int = 1,
                 gns_decay: float = 0.95, run_dir: str | None = None, policies: Sequence[Policy] = (),
                 strategies: Mapping[str, Strategy] | None = None, sync_every: int | None = None):
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
        self.catalog = StrategyCatalog(strategy, strategies)
        self.strategy_name = self.catalog.initial
        self.strategy = self.catalog.get(self.strategy_name).attach(model, lambda: self.peer.comm)
        self._pending_strategy: str | None = None
        self._last_report = 0.0
        self._force_sync = False
        self.epochs = epochs
        self.max_steps = max_steps
        self.lr_scheduler = lr_scheduler
        self.collate_fn = collate_fn
        self.device = torch.device(device) if device is not None else None
        self.on_commit = on_commit
        if monitor_every < 0:
            raise ConfigError(f"monitor_every must be >= 0 (0 = off), got {monitor_every}")
        self.monitor_every = monitor_every
        self.gns = GNSEstimator(gns_decay)
        self.stats: StepStats | None = None  # the last committed step's agreed statistics
        self.last_raw_estimates: tuple[float, float] | None = None  # unsmoothed (|G|², tr Σ)
        self.run_dir = (run_dir if run_dir is not None else env.RUN_DIR.get()) or None  # "" = none
        self.reporter = Reporter(self, self.run_dir, log_every)
        self.recovery_timeout = env.RECOVERY_TIMEOUT.get() if recovery_timeout is None else recovery_timeout
        self.sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)  # type: ignore[arg-type]
        self.progress = Progress(sampler=SamplerState(batch_size=batch_size))
        self._started = False
        self._stop_requested = False
        self._stop_agreed = False
        self._has_state = self.peer.joined  # a joiner gets its state from the others
        self.adaptation = Adaptation(self, policies)
        if sync_every is not None and sync_every < 1:
            raise ConfigError(f"sync_every must be >= 1 samples, got {sync_every}")
        self.decoupled_sync_every = sync_every  # decoupled strategies meet every this many samples
        self.decoupled = Decoupled(self)
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

    @property
    def samples_per_second(self) -> float:
        """Global samples/s over the last ``log_every`` steps."""
        return self.reporter.samples_per_second

    @property
    def policies(self) -> list[Policy]:
        return self.adaptation.policies

    @property
    def strategies(self) -> tuple[str, ...]:
        """Names ``SetStrategy`` may switch to."""
        return self.catalog.names

    def __iter__(self) -> Iterator[Step]:
        if self._started:
            raise ConfigError("a Job can be iterated once; create a new Job to train again")
        self._started = True
        try:
            yield from self._loop()
        except (PolicyError, ConsensusError) as exc:
            # no peer can recover from this: the launcher stops the whole job, with this error
            # as the root cause (before peers mistake this worker's exit for a crash to recover from)
            if self.peer.elastic and self.peer.job_store is not None:
                try:
                    self.peer.job_store.report_fatal(self.peer.worker_id, str(exc))
                    self.peer.job_store.set_training(self.peer.worker_id, False)
                except StoreError:
                    log.warning("could not tell the launcher about: %s", exc)
            raise

    def _loop(self) -> Iterator[Step]:
        initial_member = self._has_state
        if not self.peer.joined:
            self._fire("boot")
            started = time.perf_counter()
            self.peer.join(self.recovery_timeout)
            log.info("joined the job as rank %d of %d (v%d) after %.2fs at the door",
                     self.peer.rank, self.peer.size, self.peer.version, time.perf_counter() - started)
        self._sync_until_consistent(first=True)
        if self.peer.elastic:
            self.peer.job_store.set_training(self.peer.worker_id, True)  # type: ignore[union-attr]
        self.reporter.start()
        self._report_event("start", size=self.peer.size, version=self.peer.version,
                           batch_size=self.progress.sampler.batch_size)
        if initial_member and self.progress.step == 0:
            self.adaptation.boundary(["before_train"] + (["before_epoch"] if self.progress.sampler.cursor == 0
                                                         else []) + ([] if self.done else ["before_step"]))
        self.strategy.cluster_changed(self.peer)
        while not self.done or self.decoupled.open is not None:
            if self.decoupled.open is not None:
                self.decoupled.close_phase()
                continue
            if self._pending_strategy is not None:
                self._switch_strategy(self._pending_strategy)
                continue
            if not self.strategy.lockstep:
                yield from self.decoupled.run_phase()
                continue
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
        if not self.strategy.exact and self.peer.size > 1:
            try:  # one model comes out of training: the replicas' average
                self.catalog.average_parameters(self.model, self.peer.comm)
            except CommError as exc:
                log.warning("could not average the replicas at the end of training (%s); each "
                            "worker keeps its own model", exc)
        plan = self.adaptation.boundary(["after_train"])
        if plan.batch_size is not None or plan.resize is not None:
            log.info("decisions taken in after_train have no effect: training has ended")
        if self.peer.elastic:
            store = self.peer.job_store
            assert store is not None
            store.set_training(self.peer.worker_id, False)
            if self.peer.rank == 0:
                store.set_done()
                self.reporter.write_status()
        self._report_event("end", size=self.peer.size, version=self.peer.version)
        self.reporter.close()

    def _fire(self, phase: str) -> None:
        if self._faults.faults:
            self._faults.fire(phase, self.peer.rank, self.peer.step, self.peer.worker_id)

    def _make_step(self) -> Step:
        progress = self.progress
        rank, size = self.peer.rank, self.peer.size
        lo, hi = global_span(progress.sampler, self.sampler.num_samples)
        indices = self.sampler.local_indices(progress.sampler, rank, size)
        batch = self._fetch(indices)
        self.peer.step = progress.step
        self.strategy.begin_step(len(indices) / (hi - lo), progress.step)
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
        if not self.strategy.lockstep:  # decoupled: no collective in a step
            self.strategy.synchronize()
            step.synchronized = True
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
            loss_sum=(step.loss or 0.0) * b, compute_seconds=time.perf_counter() - step.started,
            clock=time.time() if self.peer.rank == 0 else 0.0, decisions=float(self.adaptation.digest),
            wall_seconds=self._wall_since_last_report())

    def _wall_since_last_report(self) -> float:
        now = time.perf_counter()
        last, self._last_report = self._last_report, now
        return now - last if last else 0.0

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
        self.adaptation.check(step.stats.decisions, step.index)
        newer = max(newer, step.stats.version_seen)
        self._stop_agreed = self._stop_agreed or step.stats.stop
        self.optimizer.step()
        self.strategy.after_update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self._update_monitors(step)
        self.reporter.committed(step)
        epoch = self.progress.epoch
        self.progress = replace(
            self.progress, step=self.progress.step + 1,
            sampler=advance(self.progress.sampler, step.global_batch_size, self.sampler.num_samples))
        self.peer.step = self.progress.step
        self.adaptation.observe(step.stats)
        self._adapt(epoch_ended=self.progress.epoch != epoch)
        if self.on_commit is not None:
            self.on_commit(step)
        self.reporter.maybe_log_progress(step)
        return newer

    def _adapt(self, epoch_ended: bool) -> None:
        """The policies' turn at the boundary after a committed step (before any transition)."""
        hooks = ["after_step"] + (["after_epoch"] if epoch_ended else [])
        if not self.done:
            hooks += (["before_epoch"] if epoch_ended else []) + ["before_step"]
        self.adaptation.boundary(hooks)

    def _request_strategy(self, name: str) -> None:
        """A policy chose another strategy: switch before the next step (after any transition)."""
        self._pending_strategy = name

    def _switch_strategy(self, name: str, consolidate: bool = True) -> None:
        old, old_name = self.strategy, self.strategy_name
        self._pending_strategy = None
        if name == old_name:
            return
        old.detach()
        self.strategy = self.catalog.get(name).attach(self.model, lambda: self.peer.comm)
        self.strategy_name = name
        if self.peer.joined:
            self.strategy.cluster_changed(self.peer)
        if self.peer.rank == 0:
            log.info("strategy %s -> %s at step %d", old_name, name, self.progress.step)
        self._report_event("strategy", strategy=name, previous=old_name)
        if consolidate and self.strategy.exact and not old.exact and self.peer.size > 1:
            # replicas drifted apart under the old strategy: average them, then make every
            # replica bitwise identical (optimizer state too) before exact training resumes
            self._force_sync = True
            try:
                self.catalog.average_parameters(self.model, self.peer.comm)
                self._sync_until_consistent(first=True)
            except CommError as exc:
                self._recover(exc)

    def _set_batch_size(self, batch_size: int) -> None:
        """Takes effect at the next step; the cursor stays, so the epoch stays exactly-once."""
        self.progress = replace(self.progress, sampler=replace(self.progress.sampler, batch_size=batch_size))

    def _report_event(self, kind: str, **details: Any) -> None:
        self.reporter.event(kind, **details)

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
        self.strategy.cluster_changed(self.peer)
        finished = time.perf_counter()
        record = {"reason": reason, "from_version": old_version, "to_version": self.peer.version,
                  "from_size": old_size, "to_size": self.peer.size, "step": self.progress.step,
                  "switch_s": switched - started, "sync_s": finished - switched, "total_s": finished - started}
        self.transitions.append(record)
        if reason == "failure":
            self._report_event("failure", time=time.time() - (finished - started), size=old_size, version=old_version)
            self._report_event("recovery", size=self.peer.size, version=self.peer.version, seconds=record["total_s"])
        else:
            self._report_event("resize", size=self.peer.size, from_size=old_size, version=self.peer.version,
                        seconds=record["total_s"])
        self.reporter.restart_step_clock()
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
        extra: dict[str, Any] = {"gns": self.gns.state_dict(), "adaptation": self.adaptation.state_dict(),
                                 "strategy": self.strategy_name, "decoupled": self.decoupled.state_dict()}
        if self.lr_scheduler is not None:
            extra["lr_scheduler"] = self.lr_scheduler.state_dict()
        result = sync_state(self.peer.comm, self.model, self.optimizer,
                            self.progress.step if self._has_state else -1,
                            self.progress.to_json(), extra, force=first or self._force_sync)
        self._force_sync = False
        if result.meta is not None:
            self.progress = Progress.from_json(result.meta)
            received = result.meta["extra"]
            self.gns.load_state_dict(received["gns"])
            self.adaptation.load_state_dict(received["adaptation"])
            self._switch_strategy(received.get("strategy", self.strategy_name), consolidate=False)
            self.decoupled.load_state_dict(received.get("decoupled", {}))
            if self.lr_scheduler is not None and "lr_scheduler" in received:
                self.lr_scheduler.load_state_dict(received["lr_scheduler"])
        self._has_state = True
        self.peer.step = self.progress.step

def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
