"""Keys followed by a watch (etcd), each by a daemon thread on a connection of its own: every key
under a prefix (``PrefixFollower``: what the launcher knows of every agent's liveness without
reading each one per look), or one integer key (``KeyFollower``: the doorbell, an agent's orders'
count)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

log = logging.getLogger(__name__)

RETRY_S = 0.2


class Watchable(Protocol):
    def follow(self, name: str, stop: threading.Event) -> Iterator[bytes | None]: ...
    def follow_under(self, name: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]: ...


class _Follower:
    """A daemon thread that follows ``name`` on a connection of its own (``_take``), starting over
    after a failure; ``close`` stops it."""

    def __init__(self, job: Watchable, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, args=(job, name), name=f"taiji-follow-{name}", daemon=True
        )
        self._thread.start()

    def _take(self, job: Watchable, name: str) -> None:
        raise NotImplementedError

    def _failed(self) -> None:
        """After a failure, before the watch starts over."""

    def _follow(self, job: Watchable, name: str) -> None:
        while not self._stop.is_set():
            try:
                self._take(job, name)
            except Exception as exc:  # noqa: BLE001 - a frozen view would hide a host's loss or a doorbell
                log.warning("following %s failed (%s): retrying", name, exc)
                self._failed()
                self._stop.wait(RETRY_S)

    def close(self) -> None:
        self._stop.set()  # noticed at the stream's next reopen; a daemon thread, never waited for


class PrefixFollower(_Follower):
    """Every key under ``name`` and its latest value (``values``), kept by a daemon thread on a
    connection of its own; ``on_delete`` is called with a key's name when it is deleted (a lease
    running out deletes its keys)."""

    def __init__(self, job: Watchable, name: str, on_delete: Callable[[str], None] = lambda key: None):
        self.values: dict[str, bytes] = {}
        self._on_delete = on_delete
        super().__init__(job, name)

    def _take(self, job: Watchable, name: str) -> None:
        for key, value in job.follow_under(name, self._stop):
            if value is not None:
                self.values[key] = value
            elif self.values.pop(key, None) is not None:
                self._on_delete(key)


class KeyFollower(_Follower):
    """An integer key's latest value, followed through a watch by a daemon thread."""

    def __init__(self, job: Watchable, name: str):
        self.value = 0
        super().__init__(job, name)

    def _take(self, job: Watchable, name: str) -> None:
        for raw in job.follow(name, self._stop):
            self.value = int(raw or 0)

    def _failed(self) -> None:
        self.value += 1  # meanwhile the launcher re-reads what the doorbell guards
