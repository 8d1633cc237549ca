"""One scheduled job's launcher as the daemon sees it from outside: the ``taiji run`` command
line it is started with, and what its files say once it is gone (whether its run log ended, the
latest checkpoint it can resume from)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ...errors import TaijiError
from ...metrics.runlog import EVENTS_FILE
from ...sched.livejob import LiveJob
from .hosts import launcher_id

log = logging.getLogger(__name__)


def launcher_args(job: LiveJob, workers: int, where: Path, checkpoint_grace: float) -> list[str]:
    """``taiji run``'s arguments for ``job`` on ``workers`` workers, its run directory under
    ``where`` (its directory in the state directory), resuming from its checkpoints if it has any."""
    return [
        "-np",
        str(workers),
        "--min-np",
        str(job.min_np),
        "--max-np",
        str(job.max_np),
        "--job-id",
        launcher_id(job.id),
        "--run-dir",
        str(where / "run"),
        "--checkpoint-dir",
        job.checkpoint_dir,
        "--resume",
        "auto",
        "--checkpoint-grace",
        f"{checkpoint_grace:g}",
        *(["--checkpoint-every", job.checkpoint_every] if job.checkpoint_every else []),
        "--",
        *job.command,
    ]


def outcome_of_adopted(where: Path) -> tuple[str, str]:
    """A re-adopted job's launcher is gone: it finished if its run log (under ``where``) says it ended."""
    events = where / "run" / EVENTS_FILE
    try:
        ended = any(json.loads(line).get("kind") == "end" for line in events.read_text().splitlines() if line)
    except (OSError, ValueError):
        ended = False
    return ("finished", "") if ended else ("failed", "its launcher is gone and its run log has no end")


def latest_checkpoint(directory: str) -> int | None:
    """The step of the latest complete checkpoint in ``directory`` (None: none, or unreadable)."""
    if not directory:
        return None
    from ...checkpoint.storage import Storage

    try:
        return Storage(directory).listing().latest
    except (OSError, TaijiError, ValueError) as exc:
        log.warning("cannot list the checkpoints in %s (%s)", directory, exc)
        return None
