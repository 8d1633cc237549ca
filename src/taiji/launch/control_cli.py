"""`taiji resize`, `taiji status` and `taiji ls`: running jobs' launchers on this host, asked
through their control sockets (launch/control_socket.py), found in the job registry
(launch/registry.py). They answer in a fraction of a second: no torch."""

from __future__ import annotations

import re
import time
from typing import Any

from ..errors import ConfigError, StoreError
from . import registry
from .control_socket import request


def parse_placement(text: str | None) -> dict[str, int]:
    """``HOST=K,HOST=K`` -> {host: K}; ConfigError naming what is wrong."""
    placement: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        host, sep, count = part.strip().rpartition("=")
        if not sep or not host or not re.fullmatch(r"[0-9]+", count):
            raise ConfigError(f"--placement wants HOST=K,... (e.g. 10.0.0.1=2,10.0.0.2=1), got {part!r}")
        if host in placement:
            raise ConfigError(f"--placement names {host} twice")
        placement[host] = int(count)
    return placement


def resize_job(job_id: str | None, size: int, placement: str | None = None) -> int:
    if size < 1:
        raise ConfigError(f"cannot resize to {size} workers")
    where = parse_placement(placement)
    if where and sum(where.values()) != size:
        raise ConfigError(
            f"--placement puts {sum(where.values())} workers on hosts, not the {size} asked for"
        )
    entry = registry.find_job(job_id)
    if where:  # the launcher would refuse in its log only: say so here
        hosts = {
            address: slots
            for address, slots, _ in request(registry.control_socket(entry.job), {"op": "status"}).get(
                "hosts"
            )
            or []
        }
        for address, count in where.items():
            if address not in hosts:
                raise ConfigError(
                    f"--placement names {address}, not one of job {entry.job}'s hosts: "
                    f"{', '.join(hosts) or 'none reported'} (`taiji status` lists them)"
                )
            if count > hosts[address]:
                raise ConfigError(
                    f"--placement puts {count} workers on {address}, which has {hosts[address]} slot(s)"
                )
    request(
        registry.control_socket(entry.job),
        {"op": "resize", "size": size, "source": "taiji resize", **({"placement": where} if where else {})},
    )
    print(f"taiji: asked job {entry.job} for {size} worker(s); the launcher logs what it does")
    return 0


def _progress_line(progress: dict[str, Any] | None) -> str:
    if not progress:
        return "no progress reported yet"
    age = time.time() - progress.get("time", time.time())
    return (
        f"step {progress['step']} (epoch {progress['epoch']}), global batch {progress['batch_size']}, "
        f"{progress['samples_per_s']:.0f} samples/s, reported by rank 0 at v{progress['version']} "
        f"{age:.0f}s ago"
    )


def job_status(job_id: str | None) -> int:
    entry = registry.find_job(job_id)
    status = request(registry.control_socket(entry.job), {"op": "status"})
    workers = status["workers"]
    print(
        f"job {entry.job}: cluster v{status['version']}, {len(workers)} worker(s): {', '.join(workers)}"
        + (f"; joining: {', '.join(status['joiners'])}" if status["joiners"] else "")
    )
    print(f"  {_progress_line(status.get('progress'))}")
    print(
        f"  wanted {status['desired']} (min {status['min_np']}, max {status['max_np']}), "
        f"{status['failures']} failure(s); launcher pid {entry.pid}, command: {' '.join(entry.command)}"
    )
    hosts = status.get("hosts") or []
    if len(hosts) > 1:
        print("  hosts: " + ", ".join(f"{address} {used}/{slots}" for address, slots, used in hosts))
    return 0


def list_jobs() -> int:
    """Every job on this host: running ones with their cluster and progress; stale entries pruned."""
    stale = registry.prune()
    for entry in stale:
        print(
            f"taiji: job {entry.job} is not running (its launcher, pid {entry.pid}, exited); "
            "removed its entry"
        )
    jobs = registry.all_jobs()
    if not jobs:
        print("no job is running on this host")
        return 0
    print(f"{'JOB':<12} {'STATE':<10} {'WORKERS':>7} {'VERSION':>7} {'STEP':>8}  {'AGE':>7}  COMMAND")
    for entry in jobs:
        try:
            status = request(registry.control_socket(entry.job), {"op": "status"}, timeout=1.0)
            state, workers, version = "running", str(len(status["workers"])), f"v{status['version']}"
            step = str((status.get("progress") or {}).get("step", "-"))
        except StoreError:
            state, workers, version, step = "no answer", "?", "?", "?"
        age = f"{time.time() - entry.started:.0f}s" if entry.started else "?"
        print(
            f"{entry.job:<12} {state:<10} {workers:>7} {version:>7} {step:>8}  {age:>7}  "
            + " ".join(entry.command)
        )
    return 0
