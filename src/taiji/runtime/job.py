"""The elastic training loop, over the parts ``WorkerParts.build`` assembles (runtime/worker.py).

``for step in job:`` yields one Step per global batch; the user runs forward and ``step.backward(loss)``.
When the loop comes back the step is finished: committed if every collective succeeded, else recovered
from (nothing committed; the survivors retry it). After a commit the policies decide at the step boundary,
``Decisions`` carries their plan out, a checkpoint is taken if due, and if any worker saw a newer cluster
version every worker moves to it at this same boundary.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from .. import env
from ..comm.topologies import check_topology
from ..comm.transfer import average_tensors
from ..data.fetch import BatchFetcher
from ..data.sampler import ElasticSampler
from ..errors import CommError, ConfigError, ConsensusError
from ..monitor.monitors import Monitors
from ..policies.base import Context, Policy, PolicyError
from ..policies.runner import Plan
from ..strategies.base import Strategy
from ..strategies.catalog import StrategyCatalog
from .adaptation import Adaptation, boundary_hooks
from .batches import Batches
from .decisions import Decisions
from .decoupled import Phases, plan_phase
from .engine import Failed
from .options import DataOptions, FaultOptions, MonitorOptions, SyncOptions, TrainingOptions, grouped
from .peer import Peer, default_peer
from .reporting import Ended, Event, Paused, PhaseClosed, Reporter, Snapshot, StepCommitted
from .state import Progress
from .step import Attempt, Step
from .transitions import LeftCluster, leave
from .worker import Callbacks, DataShape, WorkerParts

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
        self.model, self.optimizer = model, optimizer
        self.lr_scheduler, self.on_commit = lr_scheduler, on_commit
        self._peer = peer = peer or default_peer()
        self._catalog = StrategyCatalog(strategy, sync.strategies)
        self.strategy_name = self._catalog.initial
        self.strategy = self._catalog.get(self.strategy_name).attach(model, lambda: peer.comm)
        self._stop_agreed, self._started = False, False
        self._pending_strategy: str | None = None
        self.monitors = Monitors(monitoring.every, monitoring.gns_decay)
        self._adaptation = Adaptation(policies)
        sampler = ElasticSampler(len(dataset), seed=data.seed, shuffle=data.shuffle)  # type: ignore[arg-type]
        fetch = BatchFetcher(dataset, data.collate_fn, data.device, data.load_ahead)
        self._batches = Batches(fetch, sampler, max_steps)
        run_dir = env.RUN_DIR.get() if monitoring.run_dir is None else monitoring.run_dir
        self._reporter = Reporter(
            run_dir or None, monitoring.log_every, lead=self._leads, write_status=peer.job_store.write_status
        )
        parts = WorkerParts.build(
            model,
            optimizer,
            self.strategy,
            peer,
            callbacks=Callbacks(
                self._cluster_changed, self._check_consensus, lambda: self.strategy.exact, self.request_stop
            ),
            monitors=self.monitors,
            reporter=self._reporter,
            data=DataShape(sampler.num_samples, batch_size),
            parts={"gns": self.monitors, "adaptation": self._adaptation},
            lr_scheduler=lr_scheduler,
            ahead=self._batches,
            recovery_timeout=faults.recovery_timeout,
            checkpoint=faults.checkpoint,
        )
        self._membership, self._state, self._signals = parts.membership, parts.state, parts.signals
        self._control, self._engine = parts.control, parts.engine
        self._transitions, self._durable = parts.transitions, parts.durable
        if sync.topology:
            self._state.topology = check_topology(sync.topology)
        self._phases = Phases(
            peer.job_store,
            peer,
            self._membership,
            self._engine,
            self._batches,
            self._control,
            self._transitions,
            self._signals,
            committed=self._after_commit,
        )
        self._state.register("phases", self._phases)
        self._decisions = Decisions(
            self._adaptation, self._state, self._reporter, optimizer, lr_scheduler, peer, sampler.num_samples
        )
        self._durable.resume()

    # -- what the user reads ----------------------------------------------------------------

    @property
    def progress(self) -> Progress:
        """Where training stands: step, epoch and the sampler's state (cursor, batch size)."""
        return self._state.progress

    @property
    def done(self) -> bool:
        """Whether training has ended: ``max_steps`` or ``epochs`` reached, or a stop every worker agreed."""
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

    @property
    def has_state(self) -> bool:
        """Whether this worker holds training state: False on a joiner until it is admitted and synced."""
        return self._state.has_state

    def state_dict(self) -> dict[str, Any]:
        """taiji's training state as of the last committed step: where the data stands, the batch size,
        the optimizer, the LR scheduler, the monitors' and policies' state; not the model's parameters
        (``model.state_dict()``). What a framework's own checkpoint carries of taiji's."""
        if not self._state.has_state:
            raise ConfigError(
                "this worker holds no training state yet: it joins, and is synced when admitted"
            )
        return self._state.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load ``state_dict()``'s output, before the first step (every worker of the job loads it)."""
        if self._started:
            raise ConfigError("load a Job's state before iterating it: a running Job's state is its peers'")
        self._state.load_state_dict(state)

    def request_stop(self) -> None:
        """Stop after this step, every worker at one boundary (rides the control message); any worker asks."""
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

    def __enter__(self) -> Job:
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
                attempt = self._engine.begin(
                    self._batches.attempt(self.progress, self._peer.view, self._adaptation.digest)
                )
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
            self._batches.num_samples,
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
        (its decisions too): one commit everywhere — its row and on_commit here too
        (docs/design.md#invariants)."""
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
        plan = self._decisions.decide(hooks, self.strategy_name, self.strategies)
        if plan.strategy is not None:
            self._pending_strategy = plan.strategy  # after any transition at this boundary
        self._stop_agreed = self._stop_agreed or plan.stop is not None
        return plan

    def _context(self) -> Context:
        return self._decisions.context(self.strategy_name, self.strategies)

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
        end = self.options.samples_to_train(self._batches.num_samples, p.step, position, p.sampler.batch_size)
        return Snapshot(p.step, p.epoch, p.sampler.batch_size, view.version, view.size, position, end)
