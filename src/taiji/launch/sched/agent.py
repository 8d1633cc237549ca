"""``taiji sched agent``: one host's hands for a ``taiji sched serve --hosts FILE`` daemon.

It polls the daemon a few times a second over the daemon's signed request channel (so it needs
the daemon's secret file and nothing listens on this host) with what it runs here — each process
it started and its exit code, and for each job whose launcher runs here that launcher's status
and store address — and carries out the orders in the reply:

- ``launch``: start a job's launcher (``taiji run --host THIS --secret-file ...``) in a session of its own;
- ``join``: add this host to a job (``taiji join JOB@STORE --nproc-per-node SLOTS``);
- ``control``: hand a request (a placed resize) to a launcher running here;
- ``signal``: signal every process of a job here.

- ``forget``: the job ended; stop reporting what of it has exited.

A job's secret is derived from the daemon's (written 0600 under the agent's directory), so no
secret crosses the network. A daemon that stops answering changes nothing here at first: the
jobs go on, and a restarted daemon re-adopts them from this agent's next poll (and has it stop
whatever it runs for no job of the daemon's). After ``fence_s`` seconds without a reply (the
daemon's ``serve --fence``, told with every reply; 0: never) the agent **fences** this host: it
sends SIGTERM to the launchers it runs, which checkpoint and stop, because by then the daemon
counts this host lost and resumes those jobs from their checkpoints elsewhere — two copies of a
job must never train at once. Stopping the agent (SIGTERM, SIGINT) stops everything it
started; an agent that starts stops the launchers a previous agent of this host left behind
(it cannot report them, so the daemon could not count their slots).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ...cluster.auth import write_secret_file
from ...errors import ConfigError, StoreError
from .. import control_socket, registry
from .channel import ask
from .hosts import TAIJI, Sessions, job_secret, launcher_id, launcher_status, launcher_store

log = logging.getLogger(__name__)

POLL_S = 0.3


class SchedAgent:
    def __init__(self, daemon: str, secret: bytes, host: str, slots: int, directory: Path):
        if slots < 1:
            raise ConfigError(f"--slots must be at least 1, got {slots}")
        self.daemon, self.secret, self.host, self.slots, self.dir = daemon, secret, host, slots, directory
        self.sessions = Sessions()
        self.boot = uuid.uuid4().hex[:12]
        self.failed_starts: dict[str, int] = {}  # key -> 127: a process that could not be started
        self.failures: list[dict[str, str]] = []  # orders that failed: said to the daemon with the next poll
        self.stop = threading.Event()
        self._daemon_lost = False
        self.fence_s = 0.0  # the daemon's --fence, from its last reply (0: never fence)
        self.answered = time.monotonic()  # when the daemon last answered
        self.fenced = False

    def run(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log.info(
            "taiji sched agent: host %s with %d slot(s), polling the daemon at %s",
            self.host,
            self.slots,
            self.daemon,
        )
        self._stop_orphans()
        try:
            while not self.stop.is_set():
                self._poll()
                self.stop.wait(POLL_S)
        finally:
            running = [k for k in self.sessions.children if self.sessions.code(k) is None]
            if running:
                log.info("taiji sched agent: stopping %d process(es) it started", len(running))
            self.sessions.stop(running)
        return 0

    def _poll(self) -> None:
        report, self.failures = self.report(), []
        try:
            reply = ask(self.daemon, self.secret, report, timeout=5.0)
        except StoreError as exc:
            if not self._daemon_lost:
                log.warning(
                    "taiji sched agent: the daemon does not answer (%s); the jobs here go on, "
                    "and this agent keeps trying",
                    exc,
                )
            self._daemon_lost = True
            self.fence()
            return
        self.answered, self.fenced = time.monotonic(), False
        self.fence_s = float(reply.get("fence_s", 0.0) or 0.0)
        if self._daemon_lost:
            log.info("taiji sched agent: the daemon answers again")
        self._daemon_lost = False
        for order in reply.get("orders", []):
            try:
                self.execute(order)
            except (OSError, StoreError, ConfigError, KeyError, ValueError) as exc:
                self.failures.append(
                    {"job": str(order.get("job")), "error": f"{order.get('op')} failed: {exc}"}
                )
                log.warning("taiji sched agent: job %s: %s", order.get("job"), self.failures[-1]["error"])

    def fence(self) -> None:
        """Silent for longer than the fence: stop this host's launchers (the daemon resumes their
        jobs elsewhere from the checkpoint each writes now)."""
        if self.fenced or not self.fence_s or time.monotonic() - self.answered < self.fence_s:
            return
        self.fenced = True
        launchers = [
            k for k in self.sessions.children if k.endswith("/launcher") and self.sessions.code(k) is None
        ]
        log.warning(
            "taiji sched agent: no reply from the daemon for %gs: stopping the %d launcher(s) here (each "
            "checkpoints; the daemon resumes their jobs on the hosts it reaches)",
            self.fence_s,
            len(launchers),
        )
        for key in launchers:
            self.sessions.signal(key, signal.SIGTERM)

    def _stop_orphans(self) -> None:
        """Launchers a previous agent of this host started and left (killed, it could not stop
        them): this agent does not know them, so the daemon cannot count their slots — stop them."""
        for entry in registry.all_jobs():
            if entry.job.startswith(launcher_id("")) and entry.host == self.host and entry.running:
                log.warning(
                    "taiji sched agent: stopping job %s's launcher (pid %d), left by a previous agent here",
                    entry.job,
                    entry.pid,
                )
                try:
                    os.killpg(entry.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass

    def report(self) -> dict[str, Any]:
        processes: dict[str, int | None] = {**self.failed_starts}
        processes.update({key: self.sessions.code(key) for key in self.sessions.children})
        launchers = {}
        for key, code in processes.items():
            job, _, role = key.partition("/")
            if role == "launcher" and code is None:
                launchers[job] = {"status": launcher_status(job, timeout=1.0), "store": launcher_store(job)}
        return {
            "op": "agent",
            "host": self.host,
            "slots": self.slots,
            "boot": self.boot,
            "processes": processes,
            "launchers": launchers,
            "failed": self.failures,
        }

    def execute(self, order: dict[str, Any]) -> None:
        op, job = str(order["op"]), str(order["job"])
        if op == "launch":
            argv = TAIJI + [
                "run",
                "--host",
                self.host,
                "--secret-file",
                str(self._secret_file(job)),
                *[str(a) for a in order["args"]],
            ]
            self._start(f"{job}/launcher", argv, str(order.get("cwd", "")), Path(str(order["log"])))
        elif op == "join":
            argv = TAIJI + [
                "join",
                f"{launcher_id(job)}@{order['store']}",
                "--secret-file",
                str(self._secret_file(job)),
                "--nproc-per-node",
                str(self.slots),
                "--host",
                self.host,
            ]
            self._start(f"{job}/join", argv, "", self.dir / "jobs" / job / f"join-{self.host}.log")
        elif op == "control":
            control_socket.request(
                registry.control_socket(launcher_id(job)), dict(order["request"]), timeout=5.0
            )
        elif op == "signal":
            for key in (f"{job}/launcher", f"{job}/join"):
                if key in self.sessions.children and self.sessions.code(key) is None:
                    self.sessions.signal(key, int(order["sig"]))
        elif op == "forget":  # the job ended: what of it has exited need not be reported any more
            for key in (f"{job}/launcher", f"{job}/join"):
                self.failed_starts.pop(key, None)
                if key in self.sessions.children and self.sessions.code(key) is not None:
                    del self.sessions.children[key]
            (self.dir / "secrets" / f"{job}.secret").unlink(missing_ok=True)
        else:
            raise ValueError(f"unknown order {op!r} (is this agent older than its daemon?)")

    def _start(self, key: str, argv: list[str], cwd: str, log_path: Path) -> None:
        if key in self.sessions.children and self.sessions.code(key) is None:
            raise ValueError(f"{key} already runs here")
        try:
            self.sessions.start(key, argv, cwd, log_path)
        except OSError:
            self.failed_starts[key] = 127
            raise
        log.info("taiji sched agent: started %s", key)

    def _secret_file(self, job: str) -> Path:
        path = self.dir / "secrets" / f"{job}.secret"
        write_secret_file(path, job_secret(self.secret, job))
        return path


def run_agent(agent: SchedAgent) -> int:
    stop_on = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, lambda *_: agent.stop.set()) for s in stop_on}
    try:
        return agent.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
