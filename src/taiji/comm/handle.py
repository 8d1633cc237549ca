"""A collective in flight: ``Handle.wait()`` gives its result or raises CommError, and ends at
once (PeerLost) when its communicator's version is abandoned (comm/communicator.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..errors import CollectiveTimeout, CommError, PeerLost, TaijiError
from .failures import collective_error, where
from .teardown import Pending
from .topology import PlanWork

T = TypeVar("T")

REAP_DELAY_S = 1.0  # a closed version's groups are destroyed this long after close()


class Waited(Protocol):
    """What a Handle needs of the communicator whose collective it waits for."""

    rank: int
    size: int
    version: int

    @property
    def options(self) -> Any: ...
    def wait_unless_abandoned(self, work: Any, sliced: bool = True) -> bool: ...
    def leave_behind(self, pending: Pending) -> None: ...
    def abandoned_error(self, op: str, channel: str) -> PeerLost: ...


def comm_where(comm: Waited) -> str:
    return where(comm.rank, comm.version)


def comm_error(comm: Waited, exc: BaseException, op: str, channel: str) -> TaijiError:
    return collective_error(
        exc, op, channel, rank=comm.rank, size=comm.size, version=comm.version, timeout=comm.options.timeout
    )


def when_done(work: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` (on any thread) once ``work`` — a gloo/NCCL Work or a plan's — ends."""
    if isinstance(work, PlanWork):
        work.add_done_callback(callback)
    else:
        work.get_future().add_done_callback(lambda _: callback())


class Handle(Generic[T]):
    """An asynchronous collective in flight. ``wait()`` returns its result or raises CommError
    (also after its communicator was closed: then within about a second)."""

    def __init__(
        self, work: Any, finish: Callable[[], T], comm: Waited, op: str, channel: str, sliced: bool = True
    ):
        self._pending = work if work is None or isinstance(work, Pending) else Pending(work)
        self._sliced = sliced  # a gloo Work: waited in short slices (see Communicator.wait_unless_abandoned)
        self._finish, self._comm, self._op, self._channel = finish, comm, op, channel
        self._result: T | None = None
        self._done = False

    def wait(self) -> T:
        if not self._done:
            pending = self._pending
            work = pending.work if pending is not None else None
            if work is not None and not pending.orphaned:
                if not work.is_completed() and not self._comm.wait_unless_abandoned(work, self._sliced):
                    del work
                    self._comm.leave_behind(pending)
                    raise self._comm.abandoned_error(self._op, self._channel)
                try:
                    work.wait()
                except CommError:
                    raise  # a plan's own (its communicator closed under it)
                except RuntimeError as exc:
                    raise comm_error(self._comm, exc, self._op, self._channel) from exc
                finally:
                    # a Work keeps its group's connections alive: hold it no longer than needed
                    pending.work = work = None
            elif pending is not None and pending.orphaned:
                self._wait_orphaned(pending)
            self._result = self._finish()
            self._done = True
        return self._result  # type: ignore[return-value]

    def _wait_orphaned(self, pending: Pending) -> None:
        limit = REAP_DELAY_S + 2 * self._comm.options.timeout + 5.0
        assert pending.done is not None
        if not pending.done.wait(limit):
            raise CollectiveTimeout(
                f"{comm_where(self._comm)} {self._op} on channel '{self._channel}' "
                f"still in flight {limit:g}s after its communicator was closed",
                channel=self._channel,
                op=self._op,
                version=self._comm.version,
            )
        if pending.error is not None:
            raise comm_error(self._comm, pending.error, self._op, self._channel) from pending.error

    def is_completed(self) -> bool:
        pending = self._pending
        if self._done or pending is None:
            return True
        if pending.orphaned:
            return pending.done is not None and pending.done.is_set()
        work = pending.work
        return work is None or work.is_completed()
