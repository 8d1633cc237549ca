"""Decoupled training for strategies that are not lockstep (pair averaging, local SGD): each worker runs
at its own pace, claiming batches from a shared counter, and all workers meet only at sync points.

A **phase** runs between two sync points. Its batches are runs of global positions (epoch·N +
offset into that epoch's permutation) claimed with one atomic ``add`` on the job store, so
every position is claimed exactly once however fast each worker is. A worker records the run it
is training (``inflight``) and clears it when the step is committed.

A phase ends (every worker stops claiming and goes to the sync point) when a newer cluster
config is published, a worker asked to stop, the phase consumed ``sync_every`` samples (or the
strategy's ``phase_steps`` global batches), or the data budget is used up. At the **sync point**
(the control message on the current groups) every worker reads the final counter, so all agree on
the new progress; the strategy's ``sync_point`` runs its collectives just before that agreement
and ``commit_sync_point`` applies them after it (LocalSGD averages the models there). The open
phase is part of the synced state: a worker that joins at a sync point takes part in closing it.
If a member died during the phase, the survivors recover first; the run it was training (its
``inflight`` record) is adopted by the new rank 0 and trained first, so no sample is lost.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from ..cluster.spec import ClusterView
from ..cluster.store import JobStore
from ..data.sampler import position_segments
from ..errors import CommError, StoreError
from ..monitor.stats import StepStats
from .batches import Batches
from .control import ControlChannel, Signals
from .engine import StepEngine
from .membership import Membership
from .peer import Member
from .state import Progress
from .step import Step
from .transitions import Transitions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseState:
    """What every worker agrees on about a phase (synced to joiners while it is open)."""

    index: int
    start: int  # global position where it began
    limit: int  # no position at or beyond this is claimed (data budget)
    mark: int  # a sync point once claims reach this position
    local_batch: int
    members: tuple[str, ...]
    open: bool = True
    batch_size: int = 0  # the global batch when the phase began (the unit of staleness)

    def key(self, name: str) -> str:
        return f"decoupled/{self.index}/{name}"


@dataclass
class PhaseRun:
    """This worker's view of a running phase."""

    state: PhaseState
    adopted: list[tuple[int, int]] = field(default_factory=list)
    local_steps: int = 0
    local_samples: int = 0


@dataclass(frozen=True)
class PhaseResult:
    """What all workers agreed at a sync point."""

    stats: StepStats
    consumed: int  # samples the phase trained
    position: int  # global position training has reached
    steps: int  # global-batch equivalents, for the step counter


def plan_phase(
    index: int,
    progress: Progress,
    num_samples: int,
    epochs: int,
    max_steps: int | None,
    sync_every: int | None,
    view: ClusterView,
    phase_steps: int | None = None,
) -> PhaseState:
    sampler = progress.sampler
    start = sampler.epoch * num_samples + sampler.cursor
    limit = epochs * num_samples
    if max_steps is not None:
        limit = min(limit, start + (max_steps - progress.step) * sampler.batch_size)
    every = sync_every or num_samples
    if phase_steps is not None:  # the strategy's own rhythm (LocalSGD's H), in global batches
        every = min(every, phase_steps * sampler.batch_size)
    return PhaseState(
        index=index,
        start=start,
        limit=limit,
        mark=min(limit, start + every),
        local_batch=max(1, math.ceil(sampler.batch_size / view.size)),
        members=view.members,
        batch_size=sampler.batch_size,
    )


class Phases:
    """Runs phases (claims, local steps) and closes them at sync points."""

    def __init__(
        self,
        store: JobStore,
        peer: Member,
        membership: Membership,
        engine: StepEngine,
        batches: Batches,
        control: ControlChannel,
        transitions: Transitions,
        signals: Signals,
        committed: Callable[[Step], None],
    ):
        self.store = store
        self.peer, self.membership = peer, membership
        self.engine, self.batches = engine, batches
        self.control = control
        self.transitions = transitions
        self.signals = signals
        self.committed = committed
        self.next_index = 0
        self.open: PhaseState | None = None  # a phase that ended but is not closed yet
        self.adopted: list[tuple[int, int]] = []  # rank 0: runs of departed workers to train first

    # -- one phase ------------------------------------------------------------------------

    def run(self, state: PhaseState, first_step: int) -> Iterator[Step]:
        self.next_index = state.index + 1
        if state.start >= state.limit:
            return
        run = PhaseRun(state, adopted=self.adopted)
        self.adopted = []
        self.open = state
        me = self.peer.view.worker_id
        if run.adopted:
            self.store.set(state.key(f"inflight/{me}"), json.dumps(run.adopted))
        started = time.perf_counter()
        while (claimed := self._claim(run, me)) is not None:
            segments = position_segments(*claimed, self.batches.num_samples)
            attempt = self.engine.begin_claimed(
                self.batches.claimed(segments, first_step + run.local_steps),
                self.batches.reach(segments),
                state.batch_size,
            )
            step = yield from self.engine.offer(attempt)
            self.engine.commit_local(attempt)
            self.committed(step)
            run.local_steps += 1
            run.local_samples += attempt.local_batch_size
            self.store.set(state.key(f"inflight/{me}"), json.dumps(run.adopted))
            if self._should_end(run, claimed[1]):
                break
        self.store.set(state.key("end"), "1")
        if self.peer.view.rank == 0:
            log.info(
                "decoupled phase %d: %d local steps (%d samples) in %.1fs on rank 0",
                state.index,
                run.local_steps,
                run.local_samples,
                time.perf_counter() - started,
            )

    def _claim(self, run: PhaseRun, me: str) -> tuple[int, int] | None:
        state = run.state
        if run.adopted:
            return run.adopted.pop(0)
        if self.store.has(state.key("end")):
            return None
        end = self.store.add(state.key("pos"), state.local_batch)
        lo, hi = state.start + end - state.local_batch, min(state.start + end, state.limit)
        if lo >= state.limit:
            return None
        self.store.set(state.key(f"inflight/{me}"), json.dumps([[lo, hi]] + run.adopted))
        return lo, hi

    def _should_end(self, run: PhaseRun, claimed_to: int) -> bool:
        if self.signals.stop_requested or claimed_to >= run.state.mark:
            return True
        if self.membership.newest_version() > self.peer.view.version:
            return True
        return self.store.has(run.state.key("end"))

    # -- sync point ---------------------------------------------------------------------

    def close(self, progress: Progress, decisions: int) -> PhaseResult:
        """Meet the other workers and agree on the open phase's consumption."""
        state = self.open
        assert state is not None, "no open phase to close"
        strategy = self.engine.strategy
        assert strategy is not None, "StepEngine.use(strategy) first"
        while True:
            try:
                strategy.sync_point()  # its collectives (LocalSGD's average), nothing applied yet
                stats = self.control.meet(decisions)  # the agreement: every worker got this far
                consumed = max(min(self.store.add(state.key("pos"), 0), state.limit - state.start), 0)
                break
            except (CommError, StoreError) as exc:
                self.transitions.recover(exc)
        strategy.commit_sync_point()
        self._adopt_departed(state)
        self.open = None
        return PhaseResult(
            stats, consumed, state.start + consumed, math.ceil(consumed / progress.sampler.batch_size)
        )

    def _adopt_departed(self, state: PhaseState) -> None:
        """Rank 0 takes over the runs that departed workers claimed but never committed."""
        view = self.peer.view
        if view.rank != 0:
            return
        for worker_id in [w for w in state.members if w not in view.members]:
            key = state.key(f"inflight/{worker_id}")
            try:
                runs = (
                    [tuple(r) for r in json.loads(self.store.get(key).decode() or "[]")]
                    if self.store.has(key)
                    else []
                )
            except StoreError:
                continue
            if runs:
                log.info(
                    "adopting %d sample(s) that departed worker %s claimed but did not commit",
                    sum(hi - lo for lo, hi in runs),
                    worker_id,
                )
                self.adopted.extend(runs)  # type: ignore[arg-type]
                self.store.set(key, "[]")

    # -- synced state ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"next_index": self.next_index, "open": asdict(self.open) if self.open else None}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = int(state.get("next_index", 0))
        opened = state.get("open")
        self.open = PhaseState(**{**opened, "members": tuple(opened["members"])}) if opened else None
