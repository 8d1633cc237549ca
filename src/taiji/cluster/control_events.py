"""What the launcher's driver feeds the membership controller (events) and what it carries out
(actions): plain frozen data, shared by the controller and the driver (cluster/controller.py)."""

from __future__ import annotations

from dataclasses import dataclass

from . import spec

# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Proposal:
    size: int
    source: str = "user"
    placement: tuple[tuple[str, int], ...] = ()  # (host address, workers) wanted there; () = any hosts


@dataclass(frozen=True)
class WorkerReady:
    id: str


@dataclass(frozen=True)
class WorkerExited:
    id: str
    code: int
    training: bool = False  # it was inside an elastic training loop when it exited


@dataclass(frozen=True)
class FailureReported:
    """A worker's collective failed in ``version`` as it tried step ``step``; it waits for a newer config."""

    id: str
    version: int
    step: int = -1


@dataclass(frozen=True)
class FatalReported:
    """A worker hit an error no peer can recover from (a policy raised, workers disagree on
    decisions): the whole job stops, with that worker's message as the root cause."""

    id: str
    message: str


@dataclass(frozen=True)
class JobDone:
    """Rank 0 finished the training loop: exits from now on are the job ending."""


@dataclass(frozen=True)
class Beat:
    """The driver saw worker ``id``'s heartbeat counter move at time ``at``."""

    id: str
    at: float


@dataclass(frozen=True)
class HostJoined:
    """An agent on ``address`` offers ``slots`` worker slots (a verified registration)."""

    address: str
    slots: int


@dataclass(frozen=True)
class HostBeat:
    """The driver saw the agent of host ``address`` beat at time ``at``."""

    address: str
    at: float


@dataclass(frozen=True)
class HostLost:
    """The agent of host ``address`` left (or was declared gone): its workers are gone with it."""

    address: str
    reason: str


@dataclass(frozen=True)
class Tick:
    pass


Event = (
    Proposal
    | WorkerReady
    | WorkerExited
    | FailureReported
    | FatalReported
    | JobDone
    | Beat
    | HostJoined
    | HostBeat
    | HostLost
    | Tick
)


# -- actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawn:
    workers: tuple[spec.WorkerSpec, ...]  # each with the host it is placed on

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(w.id for w in self.workers)


@dataclass(frozen=True)
class Kill:
    id: str
    reason: str


@dataclass(frozen=True)
class Publish:
    config: spec.ClusterConfig
    reason: str


@dataclass(frozen=True)
class Log:
    level: str  # "info" | "warning" | "error"
    message: str


@dataclass(frozen=True)
class RefuseHost:
    """Turn away the agent of host ``address`` (the job has as many hosts as it takes)."""

    address: str
    reason: str


@dataclass(frozen=True)
class Finish:
    code: int
    reason: str
    failed_worker: str | None = None


Action = Spawn | Kill | Publish | Log | RefuseHost | Finish
