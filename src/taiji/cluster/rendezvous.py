"""gloo's rendezvous on etcd, in few round trips and without polling.

Building a process group, each rank writes its address under the group's prefix
(``.../pg/v{N}/{channel}/.../{rank}``) and then, rank by rank, waits for each other rank's key and
reads it. On a store where every call is an HTTP round trip (etcd's gateway) and a wait polls,
that was 1 + 3n round trips per rank plus up to a poll's pause of lateness for each key: two group
builds cost a recovery on etcd 0.2-0.4 s where the TCPStore answers in a few ms.

Those keys are written once (a new version has a new prefix), so ``EtcdRendezvousStore`` writes
a rank's key and reads its group's whole prefix in one round trip (a transaction), keeps what it
read, and waits for the keys still missing with a watch of the prefix (woken as each key is
written), kept open for the group's next wait (gloo waits for one rank's key at a time). The watch
starts from now and the prefix is read once it is live: a watch from a past revision would get its
events only at etcd's next catch-up of lagging watches, up to 100 ms later, for each wait. Any
other call goes to etcd as it is. A wait also ends as soon as its version is abandoned (a newer one
dropped a rank it waits for, told by the worker's config watcher): a group build no longer waits
out the collective timeout for a dead rank's key.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Protocol

import torch.distributed as dist

from ..errors import StoreError

KEPT_GROUPS = 16  # the groups' keys remembered (a version's few groups, and the previous versions')
KEPT_WATCHES = 4  # the groups whose watch stays open between waits (the newest: the version being built)
RETRY_PAUSE_S = 0.05
GIVE_UP_CHECK_S = 0.25  # a wait asks this often whether to give up (its watch is reopened that often)


Watch = Generator[tuple[str, bytes] | None, None, None]  # None once live, then each (key, value) written


class PrefixKV(Protocol):
    """What the rendezvous needs of its store (cluster/etcd.py's EtcdKV)."""

    url: str

    def read_prefix(
        self, prefix: str, put: tuple[str, bytes] | None = None
    ) -> tuple[int, dict[str, bytes]]: ...
    def puts_under(self, prefix: str, quiet_s: float) -> Watch: ...
    def check(self, keys: list[str]) -> bool: ...
    def add(self, key: str, amount: int) -> int: ...
    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes: ...
    def delete_key(self, key: str) -> bool: ...
    def another(self) -> PrefixKV: ...


class RendezvousAbandoned(StoreError):
    """A rendezvous wait given up: the version it was for was abandoned."""


def _group_of(key: str) -> str:
    """The prefix a rendezvous key shares with its group's other keys (up to its last '/')."""
    return key[: key.rfind("/") + 1]


class EtcdRendezvousStore(dist.Store):
    """A ``torch.distributed.Store`` for process-group rendezvous on etcd (see module doc): for
    keys written once only. ``give_up()``, asked while a wait lasts, returns why to stop waiting
    (a peer's version was abandoned: the rank it waits for is lost) or None."""

    def __init__(self, kv: PrefixKV, timeout: float = 60.0, give_up: Callable[[], str | None] = lambda: None):
        super().__init__()
        self.kv = kv
        self._timeout = timeout
        self._give_up = give_up
        self._known: collections.OrderedDict[str, dict[str, bytes]] = collections.OrderedDict()
        self._watches: collections.OrderedDict[str, Watch] = collections.OrderedDict()
        self._lock = threading.Lock()  # a plan thread builds its groups beside the training thread

    def _remember(self, found: dict[str, bytes]) -> None:
        with self._lock:
            for key, value in found.items():
                self._known.setdefault(_group_of(key), {})[key] = value
                self._known.move_to_end(_group_of(key))
            while len(self._known) > KEPT_GROUPS:
                self._known.popitem(last=False)

    def _missing(self, keys: list[str]) -> list[str]:
        with self._lock:
            return [k for k in keys if k not in self._known.get(_group_of(k), {})]

    def set(self, key: str, value: Any) -> None:
        """Write ``key`` and read its group's keys written so far, in one round trip."""
        raw = value.encode() if isinstance(value, str) else bytes(value)
        self._remember(self.kv.read_prefix(_group_of(key), put=(key, raw))[1])

    def get(self, key: str) -> bytes:
        self.wait([key])
        with self._lock:
            return self._known[_group_of(key)][key]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        limit = self._timeout if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit
        while True:
            missing = self._missing(keys)
            if not missing:
                return
            group = _group_of(missing[0]) if len({_group_of(k) for k in missing}) == 1 else ""
            if not group:  # keys of several groups (gloo never asks so): one at a time
                for key in missing:
                    self.wait([key], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
                return
            why = self._give_up()
            if why:
                raise RendezvousAbandoned(f"gave up waiting for keys {missing}: {why}")
            if time.monotonic() >= deadline:
                raise StoreError(f"etcd at {self.kv.url}: wait timeout after {limit:g}s for keys {missing}")
            try:
                self._watch_for(group, missing, max(min(deadline - time.monotonic(), GIVE_UP_CHECK_S), 0.001))
            except StoreError:  # the watch broke: another, after a pause
                time.sleep(min(RETRY_PAUSE_S, max(deadline - time.monotonic(), 0.0)))

    def _watch_for(self, group: str, missing: list[str], quiet: float) -> None:
        """Follow ``group``'s watch (opened, and the prefix read, if none is kept) until ``missing``
        are known (the watch is kept for the next wait) or ``quiet`` passes without a write."""
        with self._lock:
            watch = self._watches.pop(group, None)
        if watch is None:
            watch = self.kv.puts_under(group, quiet)
            if next(watch, ()) is not None:
                return  # not live within ``quiet``
            self._remember(self.kv.read_prefix(group)[1])
        while self._missing(missing):
            put = next(watch, None)
            if put is None:
                return  # quiet: the caller asks whether to give up, and watches anew
            self._remember(dict([put]))
        with self._lock:
            self._watches[group] = watch
            while len(self._watches) > KEPT_WATCHES:
                self._watches.popitem(last=False)[1].close()

    def check(self, keys: list[str]) -> bool:
        missing = self._missing(keys)
        return not missing or self.kv.check(missing)

    def add(self, key: str, value: int) -> int:
        return self.kv.add(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self.kv.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        with self._lock:
            self._known.get(_group_of(key), {}).pop(key, None)
        return self.kv.delete_key(key)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout.total_seconds()

    def clone(self) -> EtcdRendezvousStore:  # a store for another thread: a connection of its own
        return EtcdRendezvousStore(self.kv.another(), self._timeout, self._give_up)

    def num_keys(self) -> int:
        return 0  # not kept (see EtcdC10dStore)
