"""The elastic training loop: the one place that composes the runtime's parts.

``for step in job:`` yields one Step per global batch; the user runs forward and ``step.backward(loss)``.
When the loop comes back the step is finished: committed if every collective succeeded, else recovered
from (nothing committed; the survivors retry it). After a commit the policies decide at the step boundary,
``_apply`` carries their plan out, a checkpoint is taken if due, and if any worker saw a newer cluster
version every worker moves to it at this same boundary.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import Dataset

from .. import env
from ..comm.topologies import check_topology
from ..comm.transfer import average_tensors
from ..data.fetch import BatchFetcher
from ..data.sampler import ElasticSampler
from ..errors import CommError, ConfigError, ConsensusError
from ..monitor.monitors import Monitors
from ..policies.base import Context, Policy, PolicyError, Resize, Stop
from ..policies.runner import Plan
from ..strategies.base import Strategy
from ..strategies.catalog import StrategyCatalog
from .adaptation import Adaptation, boundary_hooks, policy_events, scale_lr, who
from .checkpointing import Checkpoint, Checkpointer, effective
from .control import ControlChannel, Signals
from .decoupled import Phases, plan_phase
from .engine import Failed, StepEngine
from .faults import for_worker
from .membership import membership_for
from .peer import Peer, default_peer
from .reporting import Ended, Event, Paused, PhaseClosed, Reporter, Snapshot, StepCommitted
from .options import DataOptions, FaultOptions, MonitorOptions, SyncOptions, TrainingOptions, grouped
from .state import Progress, TrainState
from .step import Attempt, Step
from .transitions import LeftCluster, Transitions, leave

log = logging.getLogger(__name__)


class Job:
    """Elastic data-parallel training loop over ``dataset`` with a global batch size."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset,
        batch_size: int,
        *,
        epochs: int = 1,
        max_steps: int | None = None,
        strategy: Strategy | None = None,
        policies: Sequence[Policy] = (),
        lr_scheduler: Any = None,
        on_commit: Callable[[Step], None] | None = None,
        data: DataOptions = DataOptions(),
        monitoring: MonitorOptions = MonitorOptions(),
        faults: FaultOptions = FaultOptions(),
        sync: SyncOptions = SyncOptions(),
        peer: Peer | None = None,
        **deprecated: Any,
    ):
        if deprecated:  # the keywords the option groups replaced (runtime/options.py)
            given = grouped(
                {"data": data, "monitoring": monitoring, "faults": faults, "sync": sync}, deprecated
            )
            data, monitoring, faults, sync = (
                given["data"],
                given["monitoring"],
                given["faults"],
                given["sync"],
            )
        self.options = TrainingOptions(batch_size, epochs, max_steps, monitoring.every, sync.sync_every)
        self.model, self.optimizer, self.lr_scheduler, self.on_commit = (
            model,
            optimizer,
            lr_scheduler,
            on_commit,
        )
        self._peer = peer or default_peer()
        self._membership = membership_for(self._peer)
        self._catalog = StrategyCatalog(strategy, sync.strategies)
        self.strategy_name = self._catalog.initial
        self.strategy = self._catalog.get(self.strategy_name).attach(model, lambda: self._peer.comm)
        self._signals, self._stop_agreed, self._started = Signals(), False, False
        self._pending_strategy: str | None = None
        self.monitors = Monitors(monitoring.every, monitoring.gns_decay)
        self._adaptation = Adaptation(policies)
        self._sampler = ElasticSampler(len(dataset), seed=data.seed, shuffle=data.shuffle)  # type: ignore[arg-type]
        self._state = TrainState(
            model,
            optimizer,
            self._sampler.num_samples,
            batch_size,
            self.strategy_name,
            {"gns": self.monitors, "adaptation": self._adaptation},
            has_state=self._peer.joined,
        )
        self._state.topology = check_topology(sync.topology) if sync.topology else self._state.topology
        if lr_scheduler is not None:
            self._state.register("lr_scheduler", lr_scheduler)
        run_dir = (
            env.RUN_DIR.get() if monitoring.run_dir is None else monitoring.run_dir
        ) or None  # "": none
        store = self._peer.job_store
        self._reporter = Reporter(
            run_dir, monitoring.log_every, lead=self._leads, write_status=store.write_status
        )
        self._fire = for_worker(store, lambda: (self._peer.rank, self._peer.worker_id))
        self._control = ControlChannel(self._peer, self._membership, self._signals)
        fetch = BatchFetcher(dataset, data.collate_fn, data.device, data.load_ahead)
        self._engine = StepEngine(
            model,
            optimizer,
            lr_scheduler,
            fetch,
            self._sampler,
            self._peer,
            self._membership,
            self._control,
            self.monitors,
            self._check_consensus,
            self._fire,
            max_steps,
        )
        self._engine.use(self.strategy)
        timeout = env.RECOVERY_TIMEOUT.get() if faults.recovery_timeout is None else faults.recovery_timeout
        self._transitions = Transitions(
            self._peer,
            self._membership,
            self._state,
            self._reporter,
            self._fire,
            timeout,
            changed=self._cluster_changed,
        )
        self._phases = Phases(
            store,
            self._peer,
            self._membership,
            self._engine,
            self._control,
            self._transitions,
            self._signals,
            committed=self._after_commit,
        )
        self._state.register("phases", self._phases)
        self._durable = Checkpointer(
            effective(faults.checkpoint, Checkpoint.from_env()),
            self._state,
            self._peer,
            lambda: self.strategy.exact,
            self.request_stop,
        )
        self._durable.resume()

    # -- what the user reads ----------------------------------------------------------------

    @property
    def progress(self) -> Progress:
        """Where training stands: step, epoch and the sampler's state (cursor, batch size)."""
        return self._state.progress

    @property
    def done(self) -> bool:
        """Whether training has ended: ``max_steps`` or ``epochs`` reached, or a stop agreed by every worker."""
        return self._stop_agreed or self.options.done(self.progress.step, self.progress.epoch)

    @property
    def samples_per_second(self) -> float:
        """Global samples/s over the last ``log_every`` steps."""
        return self._reporter.samples_per_second

    @property
    def policies(self) -> list[Policy]:
        """The adaptation policies, in the order they run."""
        return self._adaptation.policies

    @property
    def strategies(self) -> tuple[str, ...]:
        """Names ``SetStrategy`` may switch to."""
        return self._catalog.names

    # the monitors' figures, agreed by every worker
    gns = property(
        lambda self: self.monitors.gns,
        doc="The gradient noise scale estimator (``job.gns.b_noise``: B_noise = tr Σ / |G|²).",
    )
    """The gradient noise scale estimator (``job.gns.b_noise``: B_noise = tr Σ / |G|²)."""
    stats = property(
        lambda self: self.monitors.stats,
        doc="The last committed step's ``StepStats`` (mean loss, compute times, straggler ratio), or None.",
    )
    """The last committed step's ``StepStats`` (mean loss, compute times, straggler ratio), or None."""
    last_raw_estimates = property(
        lambda self: self.monitors.last_raw_estimates,
        doc="The last unsmoothed (|G|², tr Σ) pair the noise scale was updated with, or None.",
    )
    """The last unsmoothed (|G|², tr Σ) pair the noise scale was updated with, or None."""

    @property
    def transitions(self) -> list[dict]:
        """What each membership change cost (reason, versions, sizes, step, seconds)."""
        return self._transitions.records

    def request_stop(self) -> None:
        """Stop after this step, every worker at one boundary (rides the control message); any worker may ask."""
        self._signals.stop_requested = True
        if not self._peer.elastic or self._peer.size == 1:
            self._stop_agreed = True

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Rank-local work between steps (an evaluation): not a step's time, to samples/s or policies."""
        try:
            yield
        finally:
            self._reporter.on(Paused())
            self._control.restart_clock()

    def close(self) -> None:
        """Release the model (the strategy's hooks) and this Job's threads; idempotent."""
        self._peer.show_context(None)
        self._durable.close()
        self.strategy.detach()
        self._membership.close()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Step]:
        if self._started:
            raise ConfigError("a Job can be iterated once; create a new Job to train again")
        self._started = True
        try:
            yield from self._loop()
        except (PolicyError, ConsensusError) as exc:
            self._membership.report_fatal(str(exc))
            raise
        except LeftCluster:
            leave()
        finally:
            self.close()

    def _loop(self) -> Iterator[Step]:
        fresh = self._state.has_state and self.progress.step == 0
        self._transitions.enter()
        self._peer.show_context(self._context)
        self._membership.set_training(True)
        self._durable.start(self._reporter)
        if fresh:
            start = ["before_epoch"] if self.progress.sampler.cursor == 0 else []
            self._decide(["before_train"] + start + ([] if self.done else ["before_step"]))
        while not self.done or self._phases.open is not None:
            if self._phases.open is not None:
                self._close_phase()
            elif self._pending_strategy is not None:
                self._switch_strategy(self._pending_strategy)
            elif not self.strategy.lockstep:
                yield from self._phases.run(self._plan_phase(), self.progress.step)
            else:
                attempt = self._engine.begin(self.progress, self._adaptation.digest)
                step = yield from self._engine.offer(attempt)
                outcome = self._engine.finish(attempt)
                if isinstance(outcome, Failed):
                    self._transitions.recover(outcome.error, since=attempt.started)
                    if self.progress.step == attempt.index + 1:  # its peers committed it meanwhile
                        self._adopt(attempt, step)
                    continue
                self._stop_agreed = self._stop_agreed or outcome.stats.stop
                epoch_ended = self._state.advance(attempt.global_batch_size)
                self._adaptation.observe(outcome.stats, self.monitors.gns, self.monitors.grad_variance)
                self._reporter.on(StepCommitted.of(attempt, self._snapshot(), self.monitors, self._lr()))
                self._decide(boundary_hooks(epoch_ended, self.done))
                self._after_commit(step)
                self._durable.committed(outcome.stats.clock)
                self._move_if_newer(outcome.newest_version)
        self._end()

    def _plan_phase(self):  # noqa: ANN202
        options = self.options
        return plan_phase(
            self._phases.next_index,
            self.progress,
            self._sampler.num_samples,
            options.epochs,
            options.max_steps,
            options.sync_every,
            self._peer.view,
            self.strategy.phase_steps,
        )

    def _close_phase(self) -> None:
        result = self._phases.close(self.progress, self._adaptation.digest)
        self._check_consensus(result.stats.decisions, self.progress.step)
        self._stop_agreed = self._stop_agreed or result.stats.stop
        epoch_ended = self._state.advance_to(result.position, result.steps)
        self._adaptation.observe(result.stats, self.monitors.gns, samples=result.consumed)
        self._reporter.on(
            PhaseClosed(
                self._snapshot(),
                result.consumed,
                self._adaptation.metrics.step_seconds,
                self._lr(),
                self.strategy_name,
            )
        )
        self._decide(boundary_hooks(epoch_ended, self.done))
        self._durable.committed(result.stats.clock)
        self._move_if_newer(result.stats.version_seen)

    def _move_if_newer(self, version: int) -> None:
        if version > self._peer.view.version:
            self._transitions.to(self._membership.read_config(version), reason="resize")

    def _end(self) -> None:
        view = self._peer.view
        if not self.strategy.exact and view.size > 1:
            try:  # one model comes out of training: the replicas' average
                average_tensors([p.data for p in self.model.parameters()], self._peer.comm)
            except CommError as exc:
                log.warning(
                    "could not average the replicas at the end of training (%s); each "
                    "worker keeps its own model",
                    exc,
                )
        plan = self._decide(["after_train"])
        if plan.batch_size is not None or plan.resize is not None:
            log.info("decisions taken in after_train have no effect: training has ended")
        self._durable.ended()
        self._membership.set_training(False)
        self._membership.finish()
        self._reporter.on(Event("end", self.progress.step, {"size": view.size, "version": view.version}))
        self._reporter.on(Ended(self._snapshot()))

    def _adopt(self, attempt: Attempt, step: Step) -> None:
        """The peers committed the step this worker's attempt failed at; the sync brought their state
        (its decisions too): one commit everywhere — its row and on_commit here too (DESIGN §6)."""
        attempt.stats = stats = self.monitors.stats
        log.info(
            "step %d was committed by its peers while this worker's attempt failed: adopted", attempt.index
        )
        self._stop_agreed = self._stop_agreed or bool(stats and stats.stop)
        self._reporter.on(StepCommitted.of(attempt, self._snapshot(), self.monitors, self._lr()))
        self._after_commit(step)

    def _after_commit(self, step: Step) -> None:
        if self.on_commit is not None:
            self.on_commit(step)

    # -- decisions ----------------------------------------------------------------------------

    def _decide(self, hooks: list[str]) -> Plan:
        if not self._adaptation.policies:
            return Plan()  # the Context costs microseconds a step: build it only for policies
        context = self._context()
        plan = self._adaptation.decide(hooks, context, lead=self._leads())
        self._apply(plan, context)
        return plan

    def _apply(self, plan: Plan, context: Context) -> None:
        """The one place where decisions take effect, identically on every worker."""
        lead = self._leads()
        for event in policy_events(plan, context, lead):
            self._reporter.on(event)
        if plan.batch_size is not None:
            self._state.set_batch_size(plan.batch_size)
        if plan.lr_factor != 1.0:
            scale_lr(self.optimizer, self.lr_scheduler, plan.lr_factor)
        if plan.strategy is not None:
            self._pending_strategy = plan.strategy  # after any transition at this boundary
        if plan.topology is not None:  # from the next step's buckets on (this one's are done)
            self._state.topology = plan.topology
            self._peer.comm.set_topology(plan.topology)
        if plan.resize is not None and lead:
            self._peer.propose_size(plan.resize, source=f"policy {who(plan, Resize)}")
        if plan.stop is not None:
            if lead:
                log.info("policy %s stops training at step %d: %s", who(plan, Stop), context.step, plan.stop)
            self._stop_agreed = True

    def _context(self) -> Context:
        return self._adaptation.context(
            self.progress,
            self._sampler.num_samples,
            self._peer.view,
            self._lr(),
            self.strategy_name,
            self.strategies,
            self._state.topology,
        )

    def _check_consensus(self, digests: Sequence[float], step: int) -> None:
        self._adaptation.check(digests, step, self._peer.comm)

    # -- strategies and cluster changes -------------------------------------------------------

    def _switch_strategy(self, name: str, consolidate: bool = True) -> None:
        old, old_name = self.strategy, self.strategy_name
        self._pending_strategy = None
        if name == old_name:
            return
        old.detach()
        self.strategy = self._catalog.get(name).attach(self.model, lambda: self._peer.comm)
        self.strategy_name = self._state.strategy = name
        self._engine.use(self.strategy)
        if self._peer.joined:
            self.strategy.cluster_changed(self._peer.view, self._peer.job_store)
        if self._leads():
            log.info("strategy %s -> %s at step %d", old_name, name, self.progress.step)
        self._reporter.on(Event("strategy", self.progress.step, {"strategy": name, "previous": old_name}))
        if consolidate and self.strategy.exact and not old.exact and self._peer.view.size > 1:
            # replicas drifted apart under the old strategy: average them, then make every
            # replica bitwise identical (optimizer state too) before exact training resumes
            try:
                average_tensors([p.data for p in self.model.parameters()], self._peer.comm)
                self._transitions.sync(force=True)
            except CommError as exc:
                self._transitions.recover(exc)

    def _cluster_changed(self) -> None:
        """After every (re)sync: adopt the synced strategy and topology, and tell it the new cluster."""
        self._peer.comm.set_topology(self._state.topology)
        if self._state.strategy != self.strategy_name:
            self._switch_strategy(self._state.strategy, consolidate=False)
        self.strategy.cluster_changed(self._peer.view, self._peer.job_store)

    # -- small helpers ------------------------------------------------------------------------

    def _leads(self) -> bool:
        return self._peer.joined and self._peer.view.rank == 0

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _snapshot(self) -> Snapshot:
        view, p, position = self._peer.view, self.progress, self._state.position
        end = self.options.samples_to_train(self._sampler.num_samples, p.step, position, p.sampler.batch_size)
        return Snapshot(p.step, p.epoch, p.sampler.batch_size, view.version, view.size, position, end)
