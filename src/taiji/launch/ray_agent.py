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
import subprocess
from typing import Sequence

from .supervisor import die_with_parent


class RayHostAgent:
    """One per (job, Ray node): ``run`` starts the agent and returns its exit code when it ends."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, argv: Sequence[str], secret_hex: str, env: dict[str, str]) -> int:
        """Run ``argv`` (`taiji join` with ``--secret-file -``) with ``secret_hex`` on its stdin."""
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, env={**os.environ, **env}, text=True,
                                     preexec_fn=functools.partial(die_with_parent, os.getpid()))
        assert self.proc.stdin is not None
        self.proc.stdin.write(secret_hex + "\n")
        self.proc.stdin.close()
        return self.proc.wait()
