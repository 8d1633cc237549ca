"""The Ray actor that plays `taiji join`'s part on one Ray node for one job (`taiji run --ray`).

It runs the unchanged agent (`taiji join ... --secret-file -`) as its child, hands it the job's
secret on standard input (never in argv, so neither `ps` nor Ray's records show it) and returns
its exit code. The child dies with the actor (parent-death signal) and its workers die with the
child, so a Ray node that goes away takes the job's processes there with it, and the agent's
tether to the controller closes at once: the launcher drops the host without waiting for a
timeout. Ray runs its workers, this actor included, at a low priority (``RAY_worker_niceness``,
15 by default): the agent, its workers and the raylet watch run at the raylet's instead, where
the node lets a process raise its priority (else it is said once: start the node with
``RAY_worker_niceness=0``). A detached actor (a job whose store outlives the launcher: its
agents must outlive the launcher to take over) has nobody left to end it once the launcher is
gone: it ends itself when its agent has exited. Ray is imported only inside the actor, for that;
launch/hosts/ray/nodes.py wraps the class as an actor.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
from collections.abc import Sequence

from .... import env
from ...supervisor import die_with_parent

log = logging.getLogger(__name__)


def _raise_priority(niceness: int | None) -> None:
    """Give the calling thread (Linux: a thread's own priority) the raylet's, where the node allows it."""
    if niceness is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
        except OSError:
            pass  # not allowed here: the agent's is checked and said by the actor


def _start_agent(parent: int, niceness: int | None) -> None:  # between fork and exec
    _raise_priority(niceness)
    die_with_parent(parent)


class RayHostAgent:
    """One per (job, Ray node): ``run`` starts the agent and returns its exit code when it ends.
    The agent runs in a session of its own: ``signal`` reaches it and everything it started."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(
        self,
        argv: Sequence[str],
        secret_hex: str,
        environ: dict[str, str],
        cwd: str = "",
        log_path: str = "",
        leave_when_done: bool = False,
    ) -> int:
        """Run ``argv`` (`taiji join`, or `taiji run`, with ``--secret-file -``) with ``secret_hex``
        on its stdin, in ``cwd`` (default: the actor's), its output appended to ``log_path``
        (default: the actor's, which Ray shows). ``leave_when_done``: the actor ends once this
        returns (after its caller, where one is left, has the exit code)."""
        raylet = env.RAY_RAYLET_PID.get()
        niceness = self._niceness_of(raylet)
        parent = os.getpid()
        out = None
        if log_path:
            os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
            out = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                env={**os.environ, **environ},
                cwd=cwd or None,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
                preexec_fn=lambda: _start_agent(parent, niceness),
            )
        finally:
            if out is not None:
                out.close()
        assert self.proc.stdin is not None
        self.proc.stdin.write((secret_hex + "\n").encode())
        self.proc.stdin.close()
        if niceness is not None and os.getpriority(os.PRIO_PROCESS, self.proc.pid) > niceness:
            log.warning(
                "the job's agent runs at Ray's worker priority (nice %d), not the node's (%d): under load "
                "its heartbeats and its workers' steps come late; start the node's Ray with "
                "RAY_worker_niceness=0",
                os.getpriority(os.PRIO_PROCESS, self.proc.pid),
                niceness,
            )
        if raylet:
            threading.Thread(
                target=self._watch_raylet,
                args=(raylet, self.proc, niceness),
                name="taiji-raylet-watch",
                daemon=True,
            ).start()
        code = self.proc.wait()
        if leave_when_done:
            import ray

            ray.get_runtime_context().current_actor.leave.remote()  # runs once this call has returned
        return code

    def leave(self) -> None:
        """End this actor (its agent has exited)."""
        import ray

        ray.actor.exit_actor()

    def exit_code(self) -> int | None:
        """The agent's exit code (None: not started yet, or running)."""
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> bool:
        """Signal the agent's session (the agent and its workers); False where it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    @staticmethod
    def _niceness_of(pid: int) -> int | None:
        """The priority of the node's raylet (None: unknown, or not above this process's)."""
        if not pid:
            return None
        try:
            niceness = os.getpriority(os.PRIO_PROCESS, pid)
        except OSError:
            return None
        return niceness if niceness < os.getpriority(os.PRIO_PROCESS, 0) else None

    @staticmethod
    def _watch_raylet(pid: int, agent: subprocess.Popen, niceness: int | None) -> None:
        """The node's raylet died (the node is leaving the cluster): end the agent now, not when Ray
        notices (a second or more later). Its workers die with it and its tether closes, so the
        controller drops the host at once."""
        _raise_priority(niceness)  # this thread only: woken at the raylet's priority, not a worker's
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            agent.kill()
            return
        try:
            poller = select.poll()  # not select(): a Ray worker may hold descriptors above 1024
            poller.register(fd, select.POLLIN)
            poller.poll()
        finally:
            os.close(fd)
        if agent.poll() is None:
            agent.kill()
