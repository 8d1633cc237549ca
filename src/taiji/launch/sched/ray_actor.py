"""The Ray actor that holds one scheduled job's launcher on its home node (`taiji sched serve --ray`).

It is launch/hosts/ray/agent.py's per-node actor (the child in a session of its own, the secret on its
stdin, dying with the actor and with the node's raylet) running `taiji run` instead of `taiji
join`, plus what the daemon asks of a launcher on another machine: its status and a placed
resize (through the launcher's control socket on this node) and its store's address (for the
daemon's join actors). The daemon makes it a named, detached actor, so it outlives a daemon
that dies and a restarted daemon finds it by name. No Ray import here.
"""

from __future__ import annotations

from typing import Any

from ...errors import StoreError
from .. import control_socket, registry
from ..hosts.ray.agent import RayHostAgent
from .hosts import launcher_id, launcher_status, launcher_store


class RaySchedLauncher(RayHostAgent):
    """``run`` (inherited) starts the launcher; ``report`` and ``control`` run beside it (a threaded
    actor)."""

    def report(self, job_id: str) -> dict[str, Any]:
        """The launcher's exit code (None: running or not started), status and store address."""
        code = self.exit_code()
        running = self.proc is not None and code is None
        return {
            "code": code,
            "started": self.proc is not None,
            "status": launcher_status(job_id, timeout=1.0) if running else None,
            "store": launcher_store(job_id) if running else "",
        }

    def control(self, job_id: str, request: dict[str, Any]) -> dict[str, Any]:
        """Hand ``request`` (a placed resize) to the launcher; its reply, or {"ok": False, "error"}."""
        try:
            return control_socket.request(registry.control_socket(launcher_id(job_id)), request, timeout=5.0)
        except StoreError as exc:
            return {"ok": False, "error": str(exc)}
