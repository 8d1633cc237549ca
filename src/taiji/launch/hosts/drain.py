"""`taiji drain`: this host is being reclaimed. The `taiji join` agent running here gets the same
preemption notice as a SIGTERM: it asks the job to shrink off this host, its workers leave at
the next step boundary (a planned shrink: no failed step, no collective timeout), and it exits
once they are gone, or drops the host as lost when its ``--grace`` runs out first.

The command finds the agent in this host's registry (``$TAIJI_HOME/agents``), signals it and
waits for it to exit. The launcher's own host is not drained this way: SIGTERM to `taiji run`
stops the whole job with a final checkpoint (exit status 75, resumable).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ...errors import StoreError
from .. import registry

POLL_SECONDS = 0.05


def add_parser(sub: Any) -> None:
    drain = sub.add_parser(
        "drain",
        help="this host is being reclaimed: its `taiji join` workers leave the job at the next step boundary",
        usage="taiji drain [--job ID] [--wait SECONDS]",
    )
    drain.add_argument(
        "--job", default=None, help="the job whose agent to drain (needed when several run here)"
    )
    drain.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the agent to exit (default: %(default)s; 0: do not wait)",
    )


def pick(job_id: str | None) -> registry.JobEntry:
    """The one agent to drain, or an error that says what to do."""
    agents = registry.running_agents(job_id)
    if len(agents) == 1:
        return agents[0]
    if agents:
        listed = ", ".join(f"{a.job} (as {a.host}, pid {a.pid})" for a in agents)
        raise StoreError(f"several `taiji join` agents run on this host: {listed}; name one with --job ID")
    launcher = [e.job for e in registry.all_jobs() if e.running and (job_id is None or e.job == job_id)]
    hint = (
        f"; this host runs the launcher of {', '.join(launcher)}: SIGTERM to `taiji run` (kill -TERM "
        "its pid, see `taiji ls`) stops the whole job with a final checkpoint"
        if launcher
        else ""
    )
    wanted = f"of job {job_id} " if job_id else ""
    raise StoreError(
        f"no `taiji join` agent {wanted}runs on this host (registry {registry.agents_dir()}){hint}"
    )


def wait_gone(entry: registry.JobEntry, seconds: float, clock: Callable[[], float] = time.monotonic) -> bool:
    deadline = clock() + seconds
    while entry.running:
        if clock() >= deadline:
            return False
        time.sleep(POLL_SECONDS)  # another process's exit: nothing to wait on but its /proc entry
    return True


def main(args: argparse.Namespace) -> int:
    entry = pick(args.job)
    started = time.monotonic()
    try:
        os.kill(entry.pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"taiji drain: the agent of job {entry.job} (pid {entry.pid}) had already exited")
        return 0
    print(
        f"taiji drain: asked the agent of job {entry.job} on {entry.host} (pid {entry.pid}) to leave: "
        "its workers leave at the next step boundary",
        flush=True,
    )
    if args.wait <= 0:
        return 0
    if wait_gone(entry, args.wait):
        print(f"taiji drain: the agent left after {time.monotonic() - started:.2f}s")
        return 0
    print(
        f"taiji drain: the agent (pid {entry.pid}) still runs after {args.wait:g}s (--wait); its own --grace "
        "decides when it drops the host"
    )
    return 1
