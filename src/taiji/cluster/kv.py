"""What a job store is built on: the key-value interface every store has (``KeyValue``, a subset of
``torch.distributed.Store``) and the abilities only some have, each a small Protocol a store is
checked against (``isinstance``) rather than probed by name: leases and watches (etcd), a
connection of its own per thread (etcd's HTTP session), a polling pace of its own."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch.distributed as dist


class KeyValue(Protocol):
    """The subset of ``torch.distributed.Store`` taiji relies on."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...
    def set_timeout(self, timeout: datetime.timedelta) -> None: ...
    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None: ...


@runtime_checkable
class SupportsLease(Protocol):
    """Keys that vanish unless their lease is renewed (an agent's liveness)."""

    def hold(self, key: str, value: str, ttl: float) -> int: ...
    def renew(self, lease: int) -> bool: ...
    def release(self, lease: int) -> None: ...


@runtime_checkable
class SupportsWatch(Protocol):
    """A key's value (or every key's under a prefix, with its name) now and at each change (None:
    deleted), until ``stop``: no polling; or one key's value now and every change under a prefix
    (``changes_from``: a stream of new records whose events carry them)."""

    def changes(self, key: str, stop: threading.Event) -> Iterator[bytes | None]: ...
    def changes_under(self, prefix: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]: ...
    def changes_from(
        self, key: str, prefix: str, stop: threading.Event
    ) -> Iterator[tuple[str, bytes | None]]: ...


@runtime_checkable
class SupportsTransactions(Protocol):
    """Several keys written at once, only if other keys hold what is expected (b"": absent)."""

    def put_if(self, expected: dict[str, bytes], puts: dict[str, str | bytes]) -> bool: ...


@runtime_checkable
class SupportsCountedPuts(Protocol):
    """Keys written together with a count of the keys under a prefix, in one write that cannot
    lose a race (``put_counted``), and the keys created under a prefix since a revision, oldest
    first (``created_after``): a stream many writers append to without contending for a counter."""

    def put_counted(self, puts: dict[str, str | bytes], prefix: str) -> int: ...
    def created_after(self, prefix: str, revision: int) -> tuple[int, list[tuple[str, bytes]]]: ...


@runtime_checkable
class SupportsConnections(Protocol):
    """The same store on a connection of its own (for a background thread)."""

    def another(self) -> KeyValue: ...


@runtime_checkable
class SupportsRendezvous(Protocol):
    """A store of its own for process groups' rendezvous, whose keys are written once (etcd: a
    group's keys read together, the missing ones waited for by a watch); a wait ends early once
    ``give_up()`` says why (the version it was for was abandoned)."""

    def rendezvous(self, give_up: Callable[[], str | None]) -> dist.Store: ...


@runtime_checkable
class SupportsPollInterval(Protocol):
    """How often a background thread may poll it (seconds), where that is not the default."""

    poll_interval: float
