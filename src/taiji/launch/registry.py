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
    process or it has exited and waits to be reaped (a zombie): with the pid it names one
    process, even after pids wrap around."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass(frozen=True)
class JobEntry:
    job: str
    host: str
    port: int
    pid: int
    command: tuple[str, ...]
    started: float = 0.0  # wall-clock time the launcher started
    pid_start: int | None = None

    @property
    def running(self) -> bool:
        start = process_start_time(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    @staticmethod
    def of_this_process(
        job_id: str, host: str, port: int, command: tuple[str, ...], started: float
    ) -> JobEntry:
        return JobEntry(job_id, host, port, os.getpid(), command, started, process_start_time(os.getpid()))


def register(entry: JobEntry) -> Path:
    return _write(job_file(entry.job), entry)


def _write(path: Path, entry: JobEntry) -> Path:
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
        return JobEntry(
            str(data["job"]),
            str(data["host"]),
            int(data["port"]),
            int(data["pid"]),
            tuple(data.get("command", ())),
            float(data.get("started", 0.0)),
            data.get("pid_start"),
        )
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
            raise StoreError(
                f"job {job_id} is not running (its launcher, pid {entry.pid}, exited); "
                "removed its stale entry"
            )
        if entry is not None:
            return entry
    prune()
    running = [e.job for e in all_jobs()]
    if job_id is None and len(running) == 1:
        return find_job(running[0])
    if job_id is None:
        raise StoreError(
            "name the job with --job ID: "
            + (f"running jobs: {running}" if running else "no job is running on this host")
        )
    raise StoreError(
        f"no running job {job_id!r} (running: {running or 'none'}); job ids are printed "
        "by `taiji run` when it starts, and `taiji ls` lists them"
    )


# -- `taiji join` agents on this host (found by `taiji drain`) ----------------------------


def agents_dir() -> Path:
    return Path(env.HOME.get() or Path.home() / ".taiji") / "agents"


def agent_file(job_id: str, host: str) -> Path:
    return agents_dir() / f"{job_id}@{host}.json"


def register_agent(entry: JobEntry) -> Path:
    """An agent's entry: ``host`` is the address it joined as, ``port`` 0."""
    return _write(agent_file(entry.job, entry.host), entry)


def unregister_agent(job_id: str, host: str) -> None:
    agent_file(job_id, host).unlink(missing_ok=True)


def running_agents(job_id: str | None = None) -> list[JobEntry]:
    """The agents running on this host (of ``job_id`` if given), oldest first; stale entries are removed."""
    if not agents_dir().exists():
        return []
    found = []
    for path in agents_dir().glob("*.json"):
        entry = _read(path)
        if entry is None:
            continue
        if not entry.running:
            path.unlink(missing_ok=True)
        elif job_id is None or entry.job == job_id:
            found.append(entry)
    return sorted(found, key=lambda e: (e.started, e.job, e.host))
