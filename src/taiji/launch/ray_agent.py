"""The Ray actor that plays `taiji join`'s part on one Ray node for one job (`taiji run --ray`).

It runs the unchanged agent (`taiji join ... --secret-file -`) as its child, hands it the job's
secret on standard input (never in argv, so neither `ps` nor Ray's records show it) and returns
its exit code. The child dies with the actor (parent-death signal) and its workers die with the
child, so a Ray node that goes away takes the job's processes there with it, and the agent's
tether to the controller closes at once: the launcher drops the host without waiting for a
timeout. This module does not import Ray; launch/ray_hosts.py wraps the class as an actor.
"""
from __future__ import annotations

import functools
import os
import select
import subprocess
import threading
from typing import Sequence

from .. import env
from .supervisor import die_with_parent


class RayHostAgent:
    """One per (job, Ray node): ``run`` starts the agent and returns its exit code when it ends."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, argv: Sequence[str], secret_hex: str, environ: dict[str, str]) -> int:
        """Run ``argv`` (`taiji join` with ``--secret-file -``) with ``secret_hex`` on its stdin."""
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, env={**os.environ, **environ}, text=True,
                                     preexec_fn=functools.partial(die_with_parent, os.getpid()))
        assert self.proc.stdin is not None
        self.proc.stdin.write(secret_hex + "\n")
        self.proc.stdin.close()
        raylet = env.RAY_RAYLET_PID.get()
        if raylet:
            threading.Thread(target=self._watch_raylet, args=(raylet, self.proc), name="taiji-raylet-watch",
                             daemon=True).start()
        return self.proc.wait()

    @staticmethod
    def _watch_raylet(pid: int, agent: subprocess.Popen) -> None:
        """The node's raylet died (the node is leaving the cluster): end the agent now, not when Ray
        notices (a second or more later). Its workers die with it and its tether closes, so the
        controller drops the host at once."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            agent.kill()
            return
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        if agent.poll() is None:
            agent.kill()
