"""Where `taiji run` registers its job on this host, so that `taiji status`, `taiji resize` and
`taiji ls` find it by id — and notice when its launcher is gone.

One JSON file per job under ``$TAIJI_HOME/jobs`` (default ``~/.taiji/jobs``), written when the
launcher starts and removed when it exits. A launcher that was SIGKILLed cannot remove its
entry: an entry whose process is gone (or whose pid now belongs to another process, told by
the process start time) is *stale*; readers say so and prune it. Standard library only: the
commands that read the registry must not import torch.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import env
from ..errors import StoreError


def jobs_dir() -> Path:
    return Path(env.HOME.get() or Path.home() / ".taiji") / "jobs"


def job_file(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.json"


def control_socket(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.sock"


def secret_file(job_id: str) -> Path:
    """The job's secret (0600): what another host's agent needs to join (`taiji join --secret-file`)."""
    return jobs_dir() / f"{job_id}.secret"


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if there is no such
    process: with the pid it names one process, even after pids wrap around."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass(frozen=True)
class JobEntry:
    job: str
    host: str
    port: int
    pid: int
    command: tuple[str, ...]
    started: float = 0.0        # wall-clock time the launcher started
    pid_start: int | None = None

    @property
    def running(self) -> bool:
        start = process_start_time(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    @staticmethod
    def of_this_process(job_id: str, host: str, port: int, command: tuple[str, ...], started: float) -> "JobEntry":
        return JobEntry(job_id, host, port, os.getpid(), command, started, process_start_time(os.getpid()))


def register(entry: JobEntry) -> Path:
    path = job_file(entry.job)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(entry)))
    tmp.replace(path)  # readers never see half an entry
    return path


def unregister(job_id: str) -> None:
    job_file(job_id).unlink(missing_ok=True)
    control_socket(job_id).unlink(missing_ok=True)
    secret_file(job_id).unlink(missing_ok=True)


def _read(path: Path) -> JobEntry | None:
    try:
        data = json.loads(path.read_text())
        return JobEntry(str(data["job"]), str(data["host"]), int(data["port"]), int(data["pid"]),
                        tuple(data.get("command", ())), float(data.get("started", 0.0)), data.get("pid_start"))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # being written, or not ours: not a job


def all_jobs() -> list[JobEntry]:
    """Every registered job, running or stale, oldest first."""
    if not jobs_dir().exists():
        return []
    entries = [e for e in (_read(p) for p in jobs_dir().glob("*.json")) if e is not None]
    return sorted(entries, key=lambda e: (e.started, e.job))


def prune() -> list[JobEntry]:
    """Remove the entries of jobs whose launcher is gone; return them."""
    stale = [e for e in all_jobs() if not e.running]
    for entry in stale:
        unregister(entry.job)
    return stale


def find_job(job_id: str | None) -> JobEntry:
    """The running job ``job_id`` (or the only running job when None), with errors that say what to do."""
    if job_id is not None:
        entry = _read(job_file(job_id))
        if entry is not None and not entry.running:
            unregister(job_id)
            raise StoreError(f"job {job_id} is not running (its launcher, pid {entry.pid}, exited); "
                             "removed its stale entry")
        if entry is not None:
            return entry
    prune()
    running = [e.job for e in all_jobs()]
    if job_id is None and len(running) == 1:
        return find_job(running[0])
    if job_id is None:
        raise StoreError("name the job with --job ID: " + (f"running jobs: {running}" if running
                                                            else "no job is running on this host"))
    raise StoreError(f"no running job {job_id!r} (running: {running or 'none'}); job ids are printed "
                     "by `taiji run` when it starts, and `taiji ls` lists them")
