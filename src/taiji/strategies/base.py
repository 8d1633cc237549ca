"""What every synchronisation strategy provides to the training loop."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from ..comm.communicator import Communicator

CommSource = Callable[[], Communicator]


class Strategy(ABC):
    """How replicas agree. The loop calls ``begin_step`` before backward and
    ``synchronize`` after it; only when ``synchronize`` returns may the step commit, and
    ``after_update`` right after the optimizer step of a committed step.

    ``exact``: replicas hold identical state after every step (SyncSGD). Otherwise replicas
    differ between averaging rounds, and switching into an exact strategy first makes them equal.
    ``lockstep``: all workers run the same global steps together (every step ends with the
    control message). A strategy that is not lockstep lets each worker run at its own pace.
    """

    name: str = "strategy"
    exact: bool = True
    lockstep: bool = True

    @abstractmethod
    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> "Strategy":
        """Bind to ``model``; ``comm`` gives the communicator of the current cluster version."""

    @abstractmethod
    def begin_step(self, weight: float, step: int = 0) -> None:
        """Start step ``step``, in which this worker's gradient carries ``weight`` (its share b_r/B)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Finish the step's communication; raises CommError if any collective failed."""

    @abstractmethod
    def abort_step(self) -> None:
        """Forget the step in flight (after a failure), leaving the strategy ready for a retry."""

    def after_update(self) -> None:
        """The optimizer has applied this worker's update of a committed step."""

    def cluster_changed(self, peer: Any) -> None:
        """The Job joined a cluster version (at start and after every transition): ``peer`` is
        the worker's Peer (id, job store, config), for strategies that talk to peers directly."""

    def detach(self) -> None:
        """Remove whatever the strategy installed on the model."""

    def launch_all(self) -> None:
        """Start any communication of the step not started yet, without waiting for it."""

    measure_norms: bool = False

    def local_sqnorm(self) -> float | None:
        """This worker's squared gradient norm before averaging, if the strategy measured it."""
        return None

    def global_sqnorm(self) -> float | None:
        """The averaged gradient's squared norm, if the strategy measured it."""
        return None


def resolve_comm_source(comm: CommSource | Communicator | None) -> CommSource:
    if comm is None:
        from ..runtime.peer import default_peer
        return lambda: default_peer().comm
    if isinstance(comm, Communicator):
        return lambda: comm
    return comm
