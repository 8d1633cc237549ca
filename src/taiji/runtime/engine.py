"""StepEngine: begin an attempt at a step, finish its collectives, commit it or report it failed.

A lockstep step: ``begin`` starts the strategy's step for an attempt over this worker's share; the
user's ``step.backward(loss)`` runs backward (the strategy sends gradient buckets as they are ready; not begun
once a newer version dropped a peer as lost), and the control message rides in the last bucket (or, where the
strategy cannot, goes out right after it); ``finish`` waits for both and **commits only if every collective
succeeded**: optimizer step, strategy's after-update, scheduler, monitors. Otherwise nothing is applied and
the outcome is ``Failed``. A decoupled step (``begin_claimed``/``commit_local``) has no collective to fail. A
step of the user's own loop (``begin_own``: ``taiji.Optimizer``) is the same step over the user's batch.

The engine knows no data set: a Job hands it attempts its ``Batches`` built, and while a lockstep step's
allreduce is in flight the engine asks them to load the next step's share (``LoadsAhead``), where
loading hides in a wait the worker would spend idle.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..comm.transfer import average_buffers_async
from ..errors import CommError
from ..monitor.monitors import Monitors
from ..monitor.split import split_backward
from ..monitor.stats import StepStats
from ..strategies.base import Strategy, SupportsCarry, SupportsNoSync
from .allocator import keep_freed_memory
from .batches import LoadsAhead, NothingAhead
from .control import ControlChannel, Measurements, agree
from .membership import Membership
from .peer import Member
from .step import Attempt, Step

log = logging.getLogger(__name__)

_NO_INDICES = torch.empty(0, dtype=torch.long)  # a step of the user's own loop: its samples are the user's


def _mean_of(loss: torch.Tensor) -> float:
    # the usual scalar loss is read with one op (on the step's critical path when its row is carried)
    return loss.item() if loss.dim() == 0 else float(loss.detach().mean())


@dataclass(frozen=True)
class Committed:
    stats: StepStats
    newest_version: int  # the newest config version any worker reported


@dataclass(frozen=True)
class Failed:
    error: CommError


class StepEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        peer: Member,
        membership: Membership,
        control: ControlChannel,
        monitors: Monitors,
        check_consensus: Callable[[Sequence[float], int], None],
        fire: Callable[[str, int], None],
        *,
        lr_scheduler: Any = None,
        ahead: LoadsAhead | None = None,
        clear_grads: bool = True,
    ):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.peer, self.membership = peer, membership
        self.control = control
        self.monitors = monitors
        self.check_consensus = check_consensus
        self.fire = fire
        self.ahead: LoadsAhead = ahead or NothingAhead()
        self.clear_grads = clear_grads  # after a commit (a loop the user writes clears them itself)
        self.strategy: Strategy | None = None
        keep_freed_memory()  # steps reuse the same large buffers: no page faults for them every step
        self._carrier: SupportsCarry | None = None  # the strategy, if it can carry control rows
        # running statistics (BatchNorm): averaged every step so replicas stay identical, and put
        # back as they were when an attempt fails (its forward already updated them)
        self._buffers = [b for b in model.buffers() if b.numel() > 0]
        self._buffers_before: list[torch.Tensor] = []
        self._collectives_done_at = time.perf_counter()  # when this worker last talked to its peers
        # of the last commit, for the next row
        self._last_allreduce_wait = self._last_monitor_seconds = math.nan

    def use(self, strategy: Strategy) -> None:
        self.strategy = strategy
        # asked once: a runtime Protocol check costs microseconds, every step
        self._carrier = strategy if isinstance(strategy, SupportsCarry) else None

    def _strategy(self) -> Strategy:
        assert self.strategy is not None, "StepEngine.use(strategy) first"
        return self.strategy

    # -- begin --------------------------------------------------------------------------

    def begin(self, attempt: Attempt) -> Attempt:
        """Start the strategy's step for an attempt at a lockstep step over this worker's share."""
        attempt.measure = self.monitors.measuring(attempt.index)
        return self._start(attempt)

    def begin_own(self, index: int) -> Attempt:
        """Step ``index`` of the user's own loop over the user's batch, each gradient weighing 1/size;
        CommError (nothing begun) where the peers gave up on this worker while it was away."""
        if self._strategy().lockstep:
            self._check_peers_waited()
        size = self.peer.view.size
        return self._start(Attempt(index, 0, None, _NO_INDICES, (0, 0), [], size, local_samples=1))

    def _start(self, attempt: Attempt) -> Attempt:
        """Start the strategy's lockstep step for ``attempt``; this worker's gradient weighs its share."""
        weight = attempt.local_batch_size / attempt.global_batch_size
        self._buffers_before = [b.detach().clone() for b in self._buffers] if self.peer.view.size > 1 else []
        self.peer.at_step(attempt.index)
        self._strategy().begin_step(weight, attempt.index, attempt.measure)
        attempt.carried = (
            self._carrier is not None
            and not self.control.compact
            and self._carrier.carry(
                self.control.WIDTH, lambda: self.control.row(attempt.decisions, self._measurements(attempt))
            )
        )
        self.fire("compute", attempt.index)
        return attempt

    def begin_claimed(self, attempt: Attempt, reach: int, batch_size: int) -> Attempt:
        """A decoupled step over runs this worker claimed, up to global position ``reach`` (no
        collective in it); ``batch_size``: the global batch of the phase."""
        self.peer.at_step(attempt.index)
        self._strategy().claimed(reach, batch_size)
        self._strategy().begin_step(1.0, attempt.index, False)
        self.fire("compute", attempt.index)
        return attempt

    def offer(self, attempt: Attempt) -> Iterator[Step]:
        """Hand the attempt to the user's loop body as a Step; returns that Step. If the user
        leaves the loop meanwhile, the attempt is forgotten."""
        step = Step(attempt, self.backward)
        try:
            yield step
        except GeneratorExit:
            self.abort(attempt)
            raise
        return step

    # -- the user's backward --------------------------------------------------------------

    def backward(self, attempt: Attempt, loss: torch.Tensor) -> None:
        """``step.backward(loss)``: never raises for a peer's failure; the attempt is marked failed."""
        try:
            if self._strategy().lockstep:  # a decoupled step has no collective a peer could time out in
                self._check_peers_waited()
            if attempt.local_batch_size > 0:
                strategy = self._strategy()
                if (
                    attempt.carried
                ):  # its control row leaves during backward (the carrying bucket is on the CPU)
                    attempt.loss = _mean_of(loss)
                if loss.dim() == 1 and self._can_split(attempt) and isinstance(strategy, SupportsNoSync):
                    params = [p for p in self.model.parameters() if p.requires_grad]
                    attempt.split_sqnorm = split_backward(loss, params, strategy.no_sync)
                else:
                    (loss.mean() if loss.dim() == 1 else loss).backward()
                if not attempt.carried:
                    attempt.loss = _mean_of(loss)
            self.fire("allreduce", attempt.index)
            self.gradients_done(attempt)
        except CommError as exc:
            attempt.error = attempt.error or exc

    def _check_peers_waited(self) -> None:
        comm = self.peer.comm  # a newer version dropped a lost peer: this attempt's backward would be wasted
        if comm.abandoned:
            raise comm.abandoned_error("backward", "grad")
        idle = time.perf_counter() - self._collectives_done_at
        if self.membership.peers_gave_up(idle):
            raise CommError(
                f"this worker was busy outside the step's collectives for {idle:.1f}s and its "
                "peers' collectives timed out meanwhile; the step is retried in new groups"
            )

    def _can_split(self, attempt: Attempt) -> bool:
        return self.peer.view.size == 1 and attempt.measure and attempt.local_batch_size >= 2

    def gradients_done(self, attempt: Attempt) -> None:
        """Finish the step's communication: the gradients, plus the one control message (carried
        in the last bucket, or launched once that bucket is on its way, overlapping its allreduce)."""
        if attempt.synchronized:
            return
        strategy = self._strategy()
        if not strategy.lockstep:
            strategy.synchronize()
            attempt.synchronized = True
            return
        try:
            waiting_since = time.perf_counter()
            strategy.launch_all()
            pending = (
                None if attempt.carried else self.control.send(attempt.decisions, self._measurements(attempt))
            )
            buffers = average_buffers_async(self._buffers, self.peer.comm) if self._buffers_before else None
            fetch_seconds = self.ahead.load_ahead()
            strategy.synchronize()
            # the part of the allreduce that loading did not hide: what the plan costs this step
            # (where loading outlasts every plan's allreduce, the plan no longer matters here)
            attempt.allreduce_wait = max(0.0, time.perf_counter() - waiting_since - fetch_seconds)
            attempt.topology = self.peer.comm.topology
            if pending is None:  # the rows came back with the gradients
                attempt.stats = agree(cast(SupportsCarry, self._carrier).carried())
            else:
                attempt.stats = pending.wait()
            if buffers is not None:
                buffers.wait()
        except CommError:
            strategy.abort_step()
            raise
        finally:
            self._collectives_done_at = time.perf_counter()
        attempt.synchronized = True

    def _measurements(self, attempt: Attempt) -> Measurements:
        b = float(attempt.local_batch_size)
        split = attempt.split_sqnorm is not None
        local = attempt.split_sqnorm if split else self._strategy().local_sqnorm()
        return Measurements(
            local_batch=b,
            local_sqnorm=local,
            sqnorm_batch=b / 2 if split else b,
            loss=attempt.loss,
            compute_seconds=time.perf_counter() - attempt.started,
            previous_global_sqnorm=self.monitors.own_share(self.peer.view.version),
            previous_allreduce_wait=self._last_allreduce_wait,
            previous_monitor_seconds=self._last_monitor_seconds,
        )

    # -- finish -----------------------------------------------------------------------------

    def finish(self, attempt: Attempt) -> Committed | Failed:
        """Wait for the step's collectives; commit if all succeeded (see module doc)."""
        if not attempt.failed:
            try:
                self.gradients_done(attempt)  # the user may have called loss.backward() directly
            except CommError as exc:
                attempt.error = exc
        if attempt.error is not None:
            self.abort(attempt)
            return Failed(attempt.error)
        stats = attempt.stats
        assert stats is not None
        self.check_consensus(stats.decisions, attempt.index)
        self.fire("commit", attempt.index)  # the peers commit this step whatever happens here now
        self._update()
        self.monitors.update(stats, self._strategy().global_sqnorm_share(), self.peer.view.version)
        self._last_allreduce_wait = math.nan if attempt.allreduce_wait is None else attempt.allreduce_wait
        self._last_monitor_seconds = self._strategy().norm_seconds if attempt.measure else math.nan
        return Committed(stats, max(self.peer.view.version, stats.version_seen))

    def commit_local(self, attempt: Attempt) -> None:
        """A decoupled step commits on this worker alone: nothing can fail between workers."""
        self.gradients_done(attempt)
        self._update()

    def abort(self, attempt: Attempt) -> None:
        """Forget the attempt; the retry starts from clean gradients, not this attempt's."""
        self._last_allreduce_wait = self._last_monitor_seconds = math.nan  # the retry may run elsewhere
        self.ahead.drop_ahead()  # a retry reads the same batch, not the next one
        self._strategy().abort_step()
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, before in zip(self._buffers, self._buffers_before):
                buffer.copy_(before)

    def _update(self) -> None:
        self.optimizer.step()
        self._strategy().after_update()
        if self.clear_grads:
            self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
