"""WorkerParts: the one assembly of a worker's training parts, for every entry point.

A ``taiji.Job``, ``taiji.Optimizer`` and the framework integrations (which drive a Job) train through
the same parts: the worker's ``Membership`` in the job, the replicated ``TrainState``, the fault plan's
``fire``, the ``ControlChannel`` that carries each step's agreement, the ``StepEngine``, the
``Transitions`` that move every worker to a new cluster at one step boundary, and the
``Checkpointer``. ``WorkerParts.build`` wires them in one order, from what the entry point owns (its
model, optimizer, strategy, monitors, reporter) and what only it can answer (``Callbacks``). The
entry point builds what is its own on top (a Job's decoupled phases) and then calls
``durable.resume()``: a resume loads every part registered with the state by then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import env
from ..checkpoint.config import Checkpoint
from ..monitor.monitors import Monitors
from ..strategies.base import Strategy
from .batches import LoadsAhead
from .checkpointing import Checkpointer
from .control import ControlChannel, Signals
from .engine import StepEngine
from .faults import for_worker
from .membership import Membership, membership_for
from .peer import Peer
from .reporting import Reporter
from .state import Stateful, TrainState
from .transitions import Transitions


@dataclass(frozen=True)
class Callbacks:
    """What the parts ask of the entry point that owns them."""

    cluster_changed: Callable[[], None]  # after every (re)sync: the strategy learns the new cluster
    check_consensus: Callable[[Sequence[float], int], None]  # the step's decision fingerprints agree
    exact: Callable[[], bool]  # is the current strategy exact (replicas identical after each step)
    request_stop: Callable[[], None]  # a preemption notice: stop at the next boundary


@dataclass(frozen=True)
class DataShape:
    """The samples an epoch holds and the global batch to start with (1 and 1: the user's own loop)."""

    num_samples: int = 1
    batch_size: int = 1


@dataclass(frozen=True)
class WorkerParts:
    """The parts one worker trains with (see module doc)."""

    peer: Peer
    membership: Membership
    state: TrainState
    fire: Callable[[str, int], None]
    signals: Signals
    control: ControlChannel
    engine: StepEngine
    transitions: Transitions
    durable: Checkpointer

    @staticmethod
    def build(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: Strategy,
        peer: Peer,
        *,
        callbacks: Callbacks,
        monitors: Monitors,
        reporter: Reporter,
        data: DataShape = DataShape(),
        parts: Mapping[str, Stateful] | None = None,
        lr_scheduler: Any = None,
        ahead: LoadsAhead | None = None,
        clear_grads: bool = True,
        recovery_timeout: float | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> WorkerParts:
        """The parts over ``model``/``optimizer``, trained by ``strategy`` (already attached to the model)."""
        membership = membership_for(peer)
        state = TrainState(
            model,
            optimizer,
            data.num_samples,
            data.batch_size,
            strategy.name,
            parts or {},
            has_state=peer.joined,
        )
        if lr_scheduler is not None:
            state.register("lr_scheduler", lr_scheduler)
        fire = for_worker(peer.job_store, lambda: (peer.rank, peer.worker_id))
        signals = Signals()
        control = ControlChannel(peer, membership, signals)
        engine = StepEngine(
            model,
            optimizer,
            peer,
            membership,
            control,
            monitors,
            callbacks.check_consensus,
            fire,
            lr_scheduler=lr_scheduler,
            ahead=ahead,
            clear_grads=clear_grads,
        )
        engine.use(strategy)
        timeout = env.RECOVERY_TIMEOUT.get() if recovery_timeout is None else recovery_timeout
        transitions = Transitions(
            peer, membership, state, reporter, fire, timeout, changed=callbacks.cluster_changed
        )
        durable = Checkpointer(
            Checkpoint.resolve(checkpoint), state, peer, callbacks.exact, callbacks.request_stop
        )
        return WorkerParts(peer, membership, state, fire, signals, control, engine, transitions, durable)
