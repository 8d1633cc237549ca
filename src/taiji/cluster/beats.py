"""A host's heartbeats, kept on that host: each worker bumps a counter in a file of its own under
the directory its launcher or agent gave it (``TAIJI_BEAT_DIR``); that process reads the files
(no store round trip per worker) and tells the controller about all of them at once, one record
per host (launch/agent_channel.py). The job store's load then grows with hosts, not workers."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class BeatSink(Protocol):
    """Where a worker's heartbeat goes (runtime/liveness.py)."""

    def beat(self, worker_id: str, count: int) -> None: ...


class LocalBeats:
    """One host's heartbeat files: ``<directory>/<worker id>`` holds that worker's count."""

    def __init__(self, directory: Path):
        self.directory = directory

    @staticmethod
    def create(where: str | None = None) -> LocalBeats:
        """A fresh directory in ``where`` (default: /dev/shm, else the temporary directory) for the
        workers this process starts, removed by ``close``; those of processes that died without
        closing theirs (SIGKILL) are removed here."""
        where = where or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        for stale in Path(where).glob("taiji-beats-*-*"):
            if not _alive(stale.name.split("-")[2]):
                shutil.rmtree(stale, ignore_errors=True)
        return LocalBeats(Path(tempfile.mkdtemp(prefix=f"taiji-beats-{os.getpid()}-", dir=where)))

    def beat(self, worker_id: str, count: int) -> None:
        """A worker's side: write its count (one small write to a file in memory)."""
        path = self.directory / worker_id
        temporary = path.with_name(f".{worker_id}.{os.getpid()}")
        temporary.write_text(str(count))
        os.replace(temporary, path)  # a reader sees the old count or the new one, never half of one

    def counts(self, worker_ids: Iterable[str]) -> dict[str, int]:
        """The counts of ``worker_ids`` (0: not beaten yet)."""
        found = {}
        for worker_id in worker_ids:
            try:
                found[worker_id] = int((self.directory / worker_id).read_text() or 0)
            except (FileNotFoundError, ValueError):
                found[worker_id] = 0
        return found

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Is process ``pid`` running (or not ours to judge)?"""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def summary(seq: int, counts: dict[str, int]) -> str:
    """A host's heartbeat record: its agent's own beat number and each of its workers' counts."""
    return json.dumps({"seq": seq, "beats": counts}, separators=(",", ":"))


def read_summary(raw: bytes | None) -> tuple[int, dict[str, int]]:
    """``summary``'s (seq, counts); (0, {}) for a missing or unreadable record (heartbeats are not
    signed: a forged one can only keep a dead worker counted alive until its host's lease ends)."""
    try:
        record = json.loads(raw or b"{}")
        counts = record.get("beats", {})
        if isinstance(counts, dict):
            return int(record.get("seq", 0)), {str(k): int(v) for k, v in counts.items()}
    except (ValueError, TypeError, AttributeError):
        pass
    return 0, {}
