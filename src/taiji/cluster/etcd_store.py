"""etcd as a ``torch.distributed.Store`` (``EtcdC10dStore``): an ``EtcdKV`` connection (cluster/etcd.py)
with the abilities of cluster/kv.py — leases, watches, transactions, a connection per thread — so that
the job store and gloo's rendezvous run on the same etcd."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from .etcd import EtcdKV


class EtcdC10dStore(dist.Store):
    """A ``torch.distributed.Store`` on etcd, for gloo's rendezvous (process groups)."""

    poll_interval = 0.2  # background pollers (a worker's config watcher) look this often

    def __init__(self, kv: EtcdKV):
        super().__init__()
        self.kv = kv

    def set(self, key: str, value: Any) -> None:
        self.kv.set(key, value)

    def hold(self, key: str, value: str, ttl: float) -> int:
        lease = self.kv.grant_lease(ttl)
        self.kv.set(key, value, lease=lease)
        return lease

    def renew(self, lease: int) -> bool:
        return self.kv.renew_lease(lease)

    def release(self, lease: int) -> None:
        self.kv.revoke_lease(lease)

    def changes(self, key: str, stop: threading.Event) -> Iterator[bytes | None]:
        return self.kv.changes(key, stop)

    def changes_under(self, prefix: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]:
        return self.kv.changes_under(prefix, stop)

    def changes_from(
        self, key: str, prefix: str, stop: threading.Event
    ) -> Iterator[tuple[str, bytes | None]]:
        return self.kv.changes_from(key, prefix, stop)

    def put_counted(self, puts: dict[str, str | bytes], prefix: str) -> int:
        return self.kv.put_counted(puts, prefix)

    def created_after(self, prefix: str, revision: int) -> tuple[int, list[tuple[str, bytes]]]:
        return self.kv.created_after(prefix, revision)

    def get(self, key: str) -> bytes:
        return self.kv.get(key)

    def add(self, key: str, value: int) -> int:
        return self.kv.add(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self.kv.compare_set(key, expected, desired)

    def put_if(self, expected: dict[str, bytes], puts: dict[str, str | bytes]) -> bool:
        return self.kv.put_if(expected, puts)

    def check(self, keys: list[str]) -> bool:
        return self.kv.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.kv.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self.kv.delete_key(key)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.kv.set_timeout(timeout)

    def another(self) -> EtcdC10dStore:
        return EtcdC10dStore(self.kv.another())

    def rendezvous(self, give_up: Callable[[], str | None]) -> dist.Store:
        """This connection as a store for gloo's rendezvous (cluster/rendezvous.py)."""
        from .rendezvous import EtcdRendezvousStore

        return EtcdRendezvousStore(self.kv, self.kv.timeout, give_up)

    clone = another  # gloo clones its store for its own threads

    def num_keys(self) -> int:  # not kept: taiji never asks, and counting would scan every job's keys
        return 0
