"""Keys under a prefix, followed by one watch (etcd): what the launcher knows of every agent's
liveness without reading each one per look."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Iterator, Protocol

log = logging.getLogger(__name__)

RETRY_S = 0.2


class Watchable(Protocol):
    def follow_under(self, name: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]: ...


class PrefixFollower:
    """Every key under ``name`` and its latest value (``values``), kept by a daemon thread on a
    connection of its own; ``on_delete`` is called with a key's name when it is deleted (a lease
    running out deletes its keys)."""

    def __init__(self, job: Watchable, name: str, on_delete: Callable[[str], None] = lambda key: None):
        self.values: dict[str, bytes] = {}
        self._on_delete = on_delete
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(job, name), name=f"taiji-follow-{name}",
                                        daemon=True)
        self._thread.start()

    def _follow(self, job: Watchable, name: str) -> None:
        while not self._stop.is_set():
            try:
                for key, value in job.follow_under(name, self._stop):
                    if value is not None:
                        self.values[key] = value
                    elif self.values.pop(key, None) is not None:
                        self._on_delete(key)
            except Exception as exc:  # noqa: BLE001 - a frozen view would hide a host's loss
                log.warning("following %s failed (%s): retrying", name, exc)
                self._stop.wait(RETRY_S)

    def close(self) -> None:
        self._stop.set()  # noticed at the stream's next reopen; a daemon thread, never waited for
