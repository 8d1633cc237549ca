"""``FakeStore``: a job store's key-value part in memory, with ``torch.distributed.TCPStore``'s
semantics (blocking ``get`` and ``wait``, compare-and-set, atomic ``add``) and fault injection
(``drop()``), for unit tests of control-plane logic and in-process harnesses."""

from __future__ import annotations

import datetime
import threading
import time

from ..errors import StoreError


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class FakeStore:
    """In-memory store with TCPStore's semantics; ``drop()`` makes every call fail."""

    def __init__(self, timeout: float = 5.0):
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._timeout = timeout
        self._dropped = False

    def drop(self) -> None:
        with self._cond:
            self._dropped = True
            self._cond.notify_all()

    def _check_alive(self) -> None:
        if self._dropped:
            raise StoreError("fake store dropped (injected fault)")

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout.total_seconds()

    def set(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._check_alive()
            self._data[key] = _as_bytes(value)
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                self._check_alive()
                if key in self._data:
                    return self._data[key]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(f"fake store: wait timeout for key {key!r}")
                self._cond.wait(remaining)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        expected, desired = _as_bytes(expected), _as_bytes(desired)
        with self._cond:
            self._check_alive()
            current = self._data.get(key)
            if current is None:
                if expected == b"":
                    self._data[key] = desired
                    self._cond.notify_all()
                    return desired
                return expected
            if current == expected:
                self._data[key] = desired
                self._cond.notify_all()
                return desired
            return current

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            self._check_alive()
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def check(self, keys: list[str]) -> bool:
        with self._cond:
            self._check_alive()
            return all(k in self._data for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        with self._cond:
            while True:
                self._check_alive()
                if all(k in self._data for k in keys):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(f"fake store: wait timeout for keys {keys}")
                self._cond.wait(remaining)
