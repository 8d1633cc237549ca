"""What every synchronisation strategy provides to the training loop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import torch

from ..cluster.spec import ClusterView
from ..comm.communicator import Communicator
from ..comm.default import default_communicator

CommSource = Callable[[], Communicator]


class Directory(Protocol):
    """Where workers of a job find each other (the job store): strategies that talk to peers
    directly publish and look up their addresses here."""

    def set(self, name: str, value: str | bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def has(self, name: str) -> bool: ...


@runtime_checkable
class SupportsNoSync(Protocol):
    """A strategy that can accumulate gradients locally for a while (micro-batches, the
    one-worker two-half GNS split) and synchronise only on the last backward."""

    def no_sync(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class SupportsCarry(Protocol):
    """A strategy whose step ends in a sum-allreduce that can carry the step's control rows too
    (each worker's row in its own zeroed slot, so the sum is the allgather): one collective a
    step instead of two. ``carry(width, row_of)`` after ``begin_step``: True if this step will
    (``row_of()`` is called just before the last collective is launched, after this worker's
    gradient norms are taken); ``carried()`` after ``synchronize``: every worker's row in rank order."""

    def carry(self, width: int, row_of: Callable[[], list[float]]) -> bool: ...
    def carried(self) -> list[list[float]]: ...


class Strategy(ABC):
    """How replicas agree. The loop calls ``begin_step`` before backward and
    ``synchronize`` after it; only when ``synchronize`` returns may the step commit, and
    ``after_update`` right after the optimizer step of a committed step.

    ``exact``: replicas hold identical state after every step (SyncSGD). Otherwise replicas
    differ between averaging rounds, and switching into an exact strategy first makes them equal.
    ``lockstep``: all workers run the same global steps together (every step ends with the
    control message). A strategy that is not lockstep lets each worker run at its own pace, and
    all workers meet only at sync points (``sync_point``), at least every ``phase_steps`` global
    batches when that is set (otherwise every ``sync_every`` samples of the Job: an epoch).
    """

    name: str = "strategy"
    norm_seconds: float = 0.0  # of this step, on the monitors' gradient norms (monitor_every="auto")
    exact: bool = True
    lockstep: bool = True
    phase_steps: int | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "global_sqnorm" in vars(cls):  # renamed: an override would be ignored without a word
            raise TypeError(
                f"{cls.__name__}.global_sqnorm: strategies now report global_sqnorm_share() "
                "(this worker's share of the averaged gradient's squared norm; the workers' "
                "shares sum to it), see taiji.Strategy"
            )

    @abstractmethod
    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> Strategy:
        """Bind to ``model``; ``comm`` gives the communicator of the current cluster version."""

    @abstractmethod
    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        """Start step ``step``, in which this worker's gradient carries ``weight`` (its share b_r/B);
        ``measure_norms``: take the squared gradient norms the monitors need this step."""

    @abstractmethod
    def synchronize(self) -> None:
        """Finish the step's communication; raises CommError if any collective failed."""

    @abstractmethod
    def abort_step(self) -> None:
        """Forget the step in flight (after a failure), leaving the strategy ready for a retry."""

    def after_update(self) -> None:
        """The optimizer has applied this worker's update of a committed step."""

    def cluster_changed(self, view: ClusterView, directory: Directory | None = None) -> None:
        """The Job joined a cluster version (at start and after every transition). ``directory``
        is the job store, for strategies that talk to peers directly."""

    def claimed(self, position: int, batch_size: int) -> None:
        """A decoupled step is about to train samples that end at global ``position`` (epoch·N +
        offset: a clock every worker shares, in samples) while the global batch is ``batch_size``."""

    def sync_point(self) -> None:
        """Every worker of the current cluster reached a sync point of decoupled training (a
        strategy that is not lockstep): collectives on the current groups are allowed here, but
        nothing may be applied yet. Raises CommError if one failed; the sync point is retried."""

    def commit_sync_point(self) -> None:
        """Every worker agreed at the sync point: apply what ``sync_point`` prepared."""

    def detach(self) -> None:
        """Remove whatever the strategy installed on the model."""

    def launch_all(self) -> None:
        """Start any communication of the step not started yet, without waiting for it."""

    def local_sqnorm(self) -> float | None:
        """This worker's squared gradient norm before averaging, if the strategy measured it."""
        return None

    def global_sqnorm_share(self) -> float | None:
        """This worker's share of the averaged gradient's squared norm, if the strategy measured
        it: the shares of the step's workers sum to the norm (each measures a part of it)."""
        return None


def resolve_comm_source(comm: CommSource | Communicator | None) -> CommSource:
    if comm is None:
        return default_communicator
    if isinstance(comm, Communicator):
        return lambda: comm
    return comm
