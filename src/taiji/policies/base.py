"""The policy API: what a policy sees (Context), what it may ask for (decisions), and its hooks.

Policies decide, the runtime acts. A policy never touches the model, the optimizer or the
cluster; it returns decisions, and the Job applies them at the step boundary, identically on
every worker. Every input in the Context is agreed by all workers (it comes from the step's
control message or from state that is synced), so deterministic policies reach the same
decisions everywhere; the runtime checks that they did (see ``policies.runner``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TaijiError


@dataclass(frozen=True)
class Resize:
    """Ask the launcher for ``size`` workers. It lands at a later step boundary, once joiners are
    ready (grow) or at once (shrink); ``Context.size`` changes when it has landed."""

    size: int


@dataclass(frozen=True)
class SetBatchSize:
    """Use global batch ``batch_size`` from the next step on (mid-epoch is fine: the sampler
    continues from the same cursor, so every sample is still seen exactly once)."""

    batch_size: int


@dataclass(frozen=True)
class ScaleLR:
    """Multiply every parameter group's learning rate by ``factor`` (and the LR scheduler's base
    rates, so a scheduler does not undo it)."""

    factor: float


@dataclass(frozen=True)
class SetStrategy:
    """Switch the synchronisation strategy to the Job's strategy named ``name`` (built-ins:
    "sync_sgd", "model_averaging", "pair_averaging"; or a name given in ``Job(strategies=...)``).
    Switching into an exact strategy (SyncSGD) first makes all replicas identical."""

    name: str


@dataclass(frozen=True)
class SetTopology:
    """Allreduce gradients with plan ``name`` from the next step on, on every worker: "ring",
    "tree", "star" or "hierarchical" (taiji/comm/topology.py)."""

    name: str


@dataclass(frozen=True)
class Stop:
    """End training after this step boundary, on every worker."""

    reason: str = ""


Decision = Resize | SetBatchSize | ScaleLR | SetStrategy | SetTopology | Stop
"""What a policy may return: one of the decisions above (every worker applies it at the same step)."""
DECISION_TYPES = (Resize, SetBatchSize, ScaleLR, SetStrategy, SetTopology, Stop)


@dataclass(frozen=True)
class Metrics:
    """Globally agreed statistics of the last committed step (None = not measured)."""

    samples: int = 0  # global batch of the last step
    loss: float | None = None  # mean loss over the global batch
    gns: float | None = None  # gradient noise scale B_noise (smoothed)
    grad_sqnorm: float | None = None  # |G|² estimate (smoothed)
    trace_sigma: float | None = None  # tr Σ estimate (smoothed)
    grad_variance: float | None = None  # mean |g_r − ḡ|² across workers
    straggler: float = 1.0  # slowest / median worker compute time
    worker_step_seconds: tuple[float, ...] = ()  # each worker's own wall time per step, by rank
    step_seconds: float | None = None  # rank 0's clock between the last two control messages
    samples_per_s: float | None = None  # global batch / step_seconds
    # the workers' mean wait, after backward, for the gradients' allreduce of the step before the
    # last (it rides the next control message): the cost of the allreduce plan, not of compute
    allreduce_seconds: float | None = None


@dataclass(frozen=True)
class Context:
    """What a policy sees at a step boundary; identical on every worker."""

    step: int  # committed steps so far (= index of the next step)
    epoch: int
    cursor: int  # samples of this epoch consumed so far
    num_samples: int  # samples per epoch
    size: int  # workers in the current cluster
    version: int  # cluster config version (changes on every resize or failure)
    batch_size: int  # global batch size of the next step
    lr: float  # learning rate of the first parameter group
    strategy: str  # name of the current synchronisation strategy
    time: float  # rank 0's clock (Unix seconds) at the last step's control message
    metrics: Metrics = field(default_factory=Metrics)
    min_size: int = 1  # the launcher's --min-np / --max-np (max_size None = unknown)
    max_size: int | None = None
    elastic: bool = False  # running under `taiji run` (Resize has an effect)
    strategies: tuple[str, ...] = ()  # names SetStrategy may use
    topology: str = "ring"  # how gradients are allreduced now (SetTopology changes it)

    def replace(self, **changes: Any) -> Context:
        """A copy with ``changes`` applied (the Context itself is frozen)."""
        return replace(self, **changes)


class PolicyError(TaijiError):
    """A policy raised, or returned something that is not a decision."""


HOOKS = ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train")

HookResult = Decision | Iterable[Decision] | None


class Policy:
    """Subclass and override any hook; each may return a decision, a list of them, or None.

    Hooks run at step boundaries on every worker with the same Context:
    ``before_train`` once when training starts; ``before_epoch``/``after_epoch`` around each
    epoch; ``before_step`` before every step and ``after_step`` after every committed step;
    ``after_train`` at the end (only ``Stop`` is meaningful there).

    State: whatever the policy keeps in instance attributes that JSON can represent is part
    of the synced training state, so a worker that joins later continues the policy where the
    others are. Override ``state_dict``/``load_state_dict`` for anything else. Attributes
    whose names start with ``_`` are treated as configuration/caches and not synced.
    """

    @property
    def name(self) -> str:
        """The name in log lines, run-log events and consensus errors (the class name)."""
        return type(self).__name__

    def before_train(self, ctx: Context) -> HookResult:
        """Called once when training starts (also after a resume)."""
        return None

    def before_epoch(self, ctx: Context) -> HookResult:
        """Called at the start of each epoch."""
        return None

    def before_step(self, ctx: Context) -> HookResult:
        """Called before every step, after the boundary's other decisions."""
        return None

    def after_step(self, ctx: Context) -> HookResult:
        """Called after every committed step (decoupled strategies: at sync points)."""
        return None

    def after_epoch(self, ctx: Context) -> HookResult:
        """Called at the end of each epoch."""
        return None

    def after_train(self, ctx: Context) -> HookResult:
        """Called once at the end of training (only ``Stop`` is meaningful there)."""
        return None

    def state_dict(self) -> dict:
        """The policy's synced state: its public attributes that JSON can represent."""
        state = {}
        for key, value in vars(self).items():
            if key.startswith("_"):
                continue
            try:
                json.dumps(value, allow_nan=True)
            except (TypeError, ValueError):
                continue  # not representable: configuration built again by the joiner's script
            state[key] = value
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore the state ``state_dict`` returned (a joiner, a resume)."""
        for key, value in state.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.state_dict().items())})"
