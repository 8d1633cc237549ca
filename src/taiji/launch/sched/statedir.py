"""The live scheduler daemon's state directory (default ``$TAIJI_HOME/sched``, i.e. ``~/.taiji/sched``).

Its files: ``secret`` (0600; what clients sign requests with), ``daemon.json`` (the address and pid
of the running daemon), ``state.json`` (every job and outstanding ask, rewritten after each change)
and ``jobs/<id>/`` (each job's launcher log, run directory and, unless ``submit --checkpoint-dir``
named another, its checkpoints). Clients find the running daemon and sign their requests through
the first two.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ... import env
from ...errors import StoreError


def state_dir(path: str | None = None) -> Path:
    return Path(path) if path else Path(env.HOME.get() or Path.home() / ".taiji") / "sched"


def read_secret(directory: Path) -> bytes:
    path = directory / "secret"
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        raise StoreError(
            f"cannot read the scheduler's secret {path}: is a daemon set up here "
            f"(`taiji sched serve`), and is --state-dir right?"
        ) from None


def daemon_address(directory: Path) -> str:
    try:
        return str(json.loads((directory / "daemon.json").read_text())["address"])
    except (OSError, ValueError, KeyError):
        raise StoreError(
            f"no scheduler daemon is running for {directory} (no daemon.json); start one "
            f"with `taiji sched serve --slots N`"
        ) from None


def running_daemon_pid(directory: Path) -> int | None:
    """The pid in ``daemon.json`` if that process still runs (a SIGKILLed daemon leaves the file)."""
    try:
        pid = int(json.loads((directory / "daemon.json").read_text())["pid"])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, KeyError, TypeError):
        return None


def job_dir(directory: Path, job_id: str) -> Path:
    """Where the job's launcher log, run directory and (by default) checkpoints live."""
    return directory / "jobs" / job_id


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # readers never see half a file
