"""Where the live scheduler's jobs run: the effects behind :class:`~taiji.launch.sched.daemon.Daemon`.

Two kinds, one interface (:class:`JobHosts`):

- :class:`LocalHost` (``taiji sched serve --slots N``): one host, the daemon's. Each job's launcher
  is a child of the daemon in a session of its own; its status and resizes go through the
  launcher's control socket; a restarted daemon finds the launchers still running in the registry.
- :class:`AgentHosts` (``taiji sched serve --hosts FILE``): every host runs ``taiji sched agent``,
  which polls the daemon over its signed request channel with what it runs (processes, exit
  codes, its launchers' status) and gets orders back: start a job's launcher, join a job with this
  host, forward a resize to a launcher, signal a job. A job starts on one host (its *home*, where
  its launcher and store run) and grows onto others with placed resizes: before the first worker
  goes to a host, the daemon has that host's agent run ``taiji join`` for the job (offering its
  slots, which the job does not grow onto by itself: ``--no-grow-on-join``), and sends the
  resize once the job lists the host. A host whose agent is silent for ``host_timeout`` is down.

Jobs' secrets never travel: every agent derives a job's secret from the daemon's (:func:`job_secret`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...cluster import auth
from ...errors import ConfigError, StoreError
from .. import control_socket, registry
from ..options import CheckpointFlags

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
HOST_TIMEOUT_S = 10.0
FENCE_S = 30.0  # an agent that has not reached the daemon this long stops its launchers
CHECKPOINT_GRACE_S = CheckpointFlags.grace  # taiji run's --checkpoint-grace default (the daemon passes it on)
JOIN_WINDOW_S = 10.0  # a join ordered this recently counts as under way (its agent reports it next poll)
TAIJI = [sys.executable, "-m", "taiji.launch.cli"]


def launcher_id(job_id: str) -> str:
    return f"sched-{job_id}"


def launcher_status(job_id: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A scheduled job's launcher status on this host (None: starting, or busy: read again later)."""
    try:
        return control_socket.request(
            registry.control_socket(launcher_id(job_id)), {"op": "status"}, timeout=timeout
        )
    except StoreError:
        return None


def launcher_store(job_id: str) -> str:
    """HOST:PORT of a scheduled job's store, from this host's registry ("": its launcher is not up)."""
    entry = next((e for e in registry.all_jobs() if e.job == launcher_id(job_id) and e.running), None)
    return f"{entry.host}:{entry.port}" if entry is not None else ""


def job_secret(daemon_secret: bytes, job_id: str) -> bytes:
    """A scheduled job's secret, derived on every host from the daemon's (nothing secret on the wire)."""
    return auth.derive(daemon_secret, f"sched-job/{job_id}")


class JobHosts(Protocol):
    addresses: tuple[str, ...]

    def launch(self, job_id: str, host: int, run_args: list[str], cwd: str, log_path: Path) -> None: ...
    def status(self, job_id: str) -> dict[str, Any] | None: ...
    def resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None: ...
    def outcome(self, job_id: str) -> int | None: ...
    def home_lost(self, job_id: str) -> bool: ...
    def running(self, job_id: str) -> bool: ...
    def signal(self, job_id: str, sig: int) -> bool: ...
    def forget(self, job_id: str) -> None: ...
    def adopt(self, job_id: str, host: int) -> None: ...
    def note(self, job_id: str) -> str: ...
    def poll_hosts(self, now: float) -> list[tuple[int, bool]]: ...


class Sessions:
    """Processes started in sessions of their own (a whole launcher with its workers is signalled
    as one), by key."""

    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, key: str, argv: list[str], cwd: str, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            self.children[key] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd or None,
                start_new_session=True,
            )

    def code(self, key: str) -> int | None:
        child = self.children.get(key)
        return child.poll() if child is not None else None

    def signal(self, key: str, sig: int, pid: int | None = None) -> bool:
        child = self.children.get(key)
        pid = child.pid if child is not None else pid
        if pid is None:
            return False
        try:
            os.killpg(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def stop(self, keys: list[str], grace: float = STOP_GRACE_S) -> None:
        """SIGTERM them all at once, SIGKILL what is left after ``grace``, reap."""
        keys = [k for k in keys if self.code(k) is None and k in self.children]
        for key in keys:
            self.signal(key, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self.code(k) is None for k in keys):
            time.sleep(0.1)
        for key in keys:
            if self.code(key) is None:
                self.signal(key, signal.SIGKILL)
            try:
                self.children[key].wait(5.0)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not exit after SIGKILL", key, self.children[key].pid)


class LocalHost:
    """One host: the daemon's own."""

    def __init__(self, address: str = "127.0.0.1"):
        self.addresses = (address,)
        self.sessions = Sessions()

    def launch(self, job_id: str, host: int, run_args: list[str], cwd: str, log_path: Path) -> None:
        self.sessions.start(job_id, TAIJI + ["run", *run_args], cwd, log_path)

    def status(self, job_id: str) -> dict[str, Any] | None:
        return launcher_status(job_id)

    def resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None:
        control_socket.request(
            registry.control_socket(launcher_id(job_id)),
            {"op": "resize", "size": size, "source": "taiji sched"},
        )

    def outcome(self, job_id: str) -> int | None:
        return self.sessions.code(job_id)

    def home_lost(self, job_id: str) -> bool:
        return False  # the daemon's own host

    def running(self, job_id: str) -> bool:
        if job_id in self.sessions.children:
            return self.sessions.code(job_id) is None
        return self._adopted_pid(job_id) is not None

    def signal(self, job_id: str, sig: int) -> bool:
        return self.sessions.signal(job_id, sig, self._adopted_pid(job_id))

    def forget(self, job_id: str) -> None:
        self.sessions.children.pop(job_id, None)

    def adopt(self, job_id: str, host: int) -> None:
        pass  # found through the registry

    def note(self, job_id: str) -> str:
        return ""

    def poll_hosts(self, now: float) -> list[tuple[int, bool]]:
        return []

    @staticmethod
    def _adopted_pid(job_id: str) -> int | None:
        """A launcher this daemon did not start (a previous daemon did) that still runs."""
        running = [e.pid for e in registry.all_jobs() if e.job == launcher_id(job_id) and e.running]
        return running[0] if running else None


@dataclass
class AgentView:
    """What the daemon knows of one host's agent, from its last poll."""

    seen: float = float("-inf")
    boot: str = ""
    processes: dict[str, int | None] = field(default_factory=dict)  # "JOB/launcher|join" -> exit code
    launchers: dict[str, dict[str, Any]] = field(default_factory=dict)  # job -> {"status", "store"}
    orders: list[dict[str, Any]] = field(default_factory=list)
    up: bool | None = None  # None: not judged yet (every host starts down until its agent polls)
    stopping: dict[str, float] = field(default_factory=dict)  # stray job -> when it was first told to stop
    ending: set[str] = field(
        default_factory=set
    )  # jobs already told to stop when they ended (not strays yet)

    def running(self, key: str) -> bool:
        return key in self.processes and self.processes[key] is None


class AgentHosts:
    """Many hosts, each driven by its ``taiji sched agent`` (see the module's doc). Times are the
    daemon's monotonic clock."""

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        host_timeout: float = HOST_TIMEOUT_S,
        fence_s: float = FENCE_S,
        checkpoint_grace: float = CHECKPOINT_GRACE_S,
    ):
        self.addresses = tuple(address for address, _ in hosts)
        self.slots = {address: slots for address, slots in hosts}
        self.host_timeout = host_timeout
        self.fence_s = fence_s  # an agent silent this long stops its launchers (0: never)
        self.checkpoint_grace = checkpoint_grace  # what a stopped launcher may take to checkpoint and exit
        self.agents = {address: AgentView() for address in self.addresses}
        self.homes: dict[str, int] = {}  # job -> its launcher's host (jobs not ended)
        self.joined: dict[str, dict[int, float]] = {}  # job -> host -> when it was told to join
        self.pending: dict[str, tuple[int, tuple[int, ...]]] = {}  # resizes waiting for their hosts to join
        self.launching: dict[str, float] = {}  # job -> when its launch was ordered (not reported yet)
        self.errors: dict[str, str] = {}  # job -> the last order that failed for it, and where

    # -- the agents' side -------------------------------------------------------------------------

    def on_poll(self, now: float, report: dict[str, Any]) -> dict[str, Any]:
        """An agent's poll: take its report, hand it its orders (and stop its strays)."""
        address = str(report.get("host", ""))
        if address not in self.agents:
            return {
                "ok": False,
                "refused": True,
                "error": f"host {address!r} is not one of this daemon's hosts "
                f"({', '.join(self.addresses)}): check --host and the --hosts file",
            }
        if int(report.get("slots", 0)) != self.slots[address]:
            return {
                "ok": False,
                "refused": True,
                "error": f"host {address} offers {report.get('slots')} slot(s) but the --hosts file gives it "
                f"{self.slots[address]}: start the agent with --slots {self.slots[address]}",
            }
        agent = self.agents[address]
        if agent.boot and agent.boot != report.get("boot"):
            log.warning(
                "host %s: its agent restarted (it stopped what the previous one had left there)", address
            )
        agent.seen, agent.boot = now, str(report.get("boot", ""))
        agent.processes = {str(k): v for k, v in dict(report.get("processes", {})).items()}
        agent.launchers = {str(k): dict(v) for k, v in dict(report.get("launchers", {})).items()}
        for failed in report.get("failed", []):
            job, text = str(failed.get("job", "")), str(failed.get("error", ""))
            self.errors[job] = f"on {address}: {text}"
            log.warning("host %s: job %s: %s", address, job, text)
        self._stop_strays(now, address, agent)
        orders, agent.orders = agent.orders, []
        return {"ok": True, "orders": orders, "fence_s": self.fence_s}

    def _strays(self, address: str, agent: AgentView) -> list[tuple[str, str]]:
        """(job, role) of what runs there for no job of ours: a job that ended (say, failed while
        its host was cut off) or is unknown, or a launcher that is not where its job's is."""
        here = self.addresses.index(address)
        strays = []
        for key in [k for k in agent.processes if agent.running(k)]:
            job, _, role = key.partition("/")
            if job not in self.homes or (role == "launcher" and self.homes[job] != here):
                strays.append((job, role))
        return strays

    def _stop_strays(self, now: float, address: str, agent: AgentView) -> None:
        strays = {job for job, _ in self._strays(address, agent)}
        for job in strays:
            first = agent.stopping.setdefault(job, now)
            if first == now and job not in agent.ending:
                log.warning(
                    "host %s still runs job %s, which is not running here for this daemon: stopping it",
                    address,
                    job,
                )
                agent.orders.append({"op": "signal", "job": job, "sig": int(signal.SIGTERM)})
            elif now - first > STOP_GRACE_S:
                agent.orders.append({"op": "signal", "job": job, "sig": int(signal.SIGKILL)})
        for job in set(agent.stopping) - strays:
            del agent.stopping[job]
        agent.ending &= strays

    def poll_hosts(self, now: float) -> list[tuple[int, bool]]:
        """Hosts whose agent came or went since the last call (every host at the first call);
        pending resizes whose hosts joined. A host comes up only once no stray launcher runs there
        (it would hold a slot the pool would give out)."""
        changed = []
        for index, address in enumerate(self.addresses):
            agent = self.agents[address]
            stray_launchers = any(role == "launcher" for _, role in self._strays(address, agent))
            up = now - agent.seen < self.host_timeout and (agent.up or not stray_launchers)
            if up != agent.up:
                agent.up = up
                changed.append((index, up))
                if up or agent.seen > float("-inf"):
                    log.info(
                        "host %s is %s",
                        address,
                        "up (its agent polls)"
                        if up
                        else f"down (its agent has been silent for {self.host_timeout:g}s)",
                    )
        for job_id, (size, placement) in list(self.pending.items()):
            self._send_resize(job_id, size, placement)
        return changed

    # -- the daemon's side ------------------------------------------------------------------------

    def launch(self, job_id: str, host: int, run_args: list[str], cwd: str, log_path: Path) -> None:
        address = self.addresses[host]
        extra = ["--nproc-per-node", str(self.slots[address]), "--no-grow-on-join"]
        self.homes[job_id] = host
        self.joined[job_id] = {}
        self.launching[job_id] = time.monotonic()
        self.agents[address].orders.append(
            {"op": "launch", "job": job_id, "args": extra + run_args, "cwd": cwd, "log": str(log_path)}
        )

    def _home_agent(self, job_id: str) -> AgentView | None:
        host = self.homes.get(job_id)
        return None if host is None else self.agents[self.addresses[host]]

    def status(self, job_id: str) -> dict[str, Any] | None:
        agent = self._home_agent(job_id)
        if agent is None or not agent.up:
            return None
        return (agent.launchers.get(job_id) or {}).get("status")

    def resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None:
        if self._home_agent(job_id) is None:
            raise StoreError(f"job {job_id} has no launcher this daemon knows of")
        self._send_resize(job_id, size, placement)

    def _send_resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None:
        """Joins first: the resize goes to the launcher once the job lists every host it names."""
        agent = self._home_agent(job_id)
        if agent is None:
            self.pending.pop(job_id, None)
            return
        status = self.status(job_id) or {}
        launcher = agent.launchers.get(job_id) or {}
        listed = {str(h[0]) for h in status.get("hosts", [])}
        missing = [h for h, n in enumerate(placement) if n and self.addresses[h] not in listed]
        if missing:
            self.pending[job_id] = (size, placement)
            store = launcher.get("store")
            told = self.joined.setdefault(job_id, {})
            for host in missing:
                there = self.agents[self.addresses[host]]
                joining = (
                    there.running(f"{job_id}/join")
                    or time.monotonic() - told.get(host, float("-inf")) < JOIN_WINDOW_S
                )
                if store and there.up and not joining:  # (a down host's agent cannot take the order)
                    told[host] = time.monotonic()
                    there.orders.append({"op": "join", "job": job_id, "store": store})
            return
        self.pending.pop(job_id, None)
        wanted = {self.addresses[h]: n for h, n in enumerate(placement) if n or self.addresses[h] in listed}
        agent.orders.append(
            {
                "op": "control",
                "job": job_id,
                "request": {"op": "resize", "size": size, "placement": wanted, "source": "taiji sched"},
            }
        )

    def outcome(self, job_id: str) -> int | None:
        """The launcher's exit code; None while it runs or its agent has not reported since this
        daemon started; a lost home host's code for a host that went silent."""
        agent = self._home_agent(job_id)
        if agent is None:
            return None
        code = agent.processes.get(f"{job_id}/launcher")
        if code is None and agent.up is False and agent.seen > float("-inf"):
            if self.fence_s and not self.home_lost(job_id):
                return None  # its agent, if alive, is about to stop it (fence): not over yet
            return 128 + signal.SIGKILL  # its host is lost: so are the job's launcher and store
        return code

    def home_lost(self, job_id: str) -> bool:
        """Its launcher's host went silent long enough ago that its agent, if alive, has stopped the
        launcher (fenced) and the launcher has had its checkpoint grace: the job may resume
        elsewhere without two copies of it training at once."""
        agent = self._home_agent(job_id)
        if agent is None or agent.up is not False or agent.seen == float("-inf") or not self.fence_s:
            return False
        fenced_by = agent.seen + self.fence_s + self.checkpoint_grace + STOP_GRACE_S
        return agent.processes.get(f"{job_id}/launcher") is None and time.monotonic() > fenced_by

    def running(self, job_id: str) -> bool:
        """True while its launcher may still run (its agent has not reported yet, or reports it)."""
        agent = self._home_agent(job_id)
        if agent is None:
            return False
        if agent.seen == float("-inf"):
            return True
        if f"{job_id}/launcher" in agent.processes:
            self.launching.pop(job_id, None)
        elif time.monotonic() - self.launching.get(job_id, float("-inf")) < self.host_timeout + 5.0:
            return bool(agent.up)  # ordered, and its agent has not reported it yet
        return agent.running(f"{job_id}/launcher") and self.outcome(job_id) is None

    def note(self, job_id: str) -> str:
        """Why an order for the job failed, where (for its end's reason)."""
        return self.errors.get(job_id, "")

    def adopt(self, job_id: str, host: int) -> None:
        """A job a previous daemon started: its agents report it (and its joins) at their next poll."""
        self.homes[job_id] = host
        self.joined[job_id] = {}

    def signal(self, job_id: str, sig: int) -> bool:
        """Signal the job's launcher (it stops its workers on every host; the joins end with the job)."""
        agent = self._home_agent(job_id)
        if agent is None:
            return False
        self.pending.pop(job_id, None)  # (a job being stopped grows nowhere)
        agent.orders.append({"op": "signal", "job": job_id, "sig": int(sig)})
        return True

    def forget(self, job_id: str) -> None:
        """The job ended: drop what was still to be sent for it, stop what is left of it on other
        hosts (its joins); from now on anything of it an agent reports is a stray."""
        home = self.homes.pop(job_id, None)
        told = self.joined.pop(job_id, {})
        for host, address in enumerate(self.addresses):
            agent = self.agents[address]
            agent.orders = [o for o in agent.orders if o.get("job") != job_id or o.get("op") == "signal"]
            if host != home and (host in told or agent.running(f"{job_id}/join")):
                agent.orders.append({"op": "signal", "job": job_id, "sig": int(signal.SIGTERM)})
                agent.ending.add(job_id)
            agent.orders.append({"op": "forget", "job": job_id})
        self.pending.pop(job_id, None)
        self.launching.pop(job_id, None)
        self.errors.pop(job_id, None)


def read_hosts_file(path: str) -> list[tuple[str, int]]:
    """``ADDRESS SLOTS`` per line (``#`` comments); every host the same slots (the policies assume
    identical hosts, as Pollux's cluster is)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the --hosts file {path}: {exc.strerror}") from None
    hosts: list[tuple[str, int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) < 1:
            raise ConfigError(f"{path}:{number}: expected 'ADDRESS SLOTS' (SLOTS >= 1), got {line.strip()!r}")
        if any(fields[0] == known for known, _ in hosts):
            raise ConfigError(f"{path}:{number}: host {fields[0]} is listed twice")
        hosts.append((fields[0], int(fields[1])))
    if not hosts:
        raise ConfigError(f"the --hosts file {path} lists no host ('ADDRESS SLOTS' per line)")
    if len({slots for _, slots in hosts}) > 1:
        raise ConfigError(
            f"the hosts in {path} have different slots ({sorted({s for _, s in hosts})}): the "
            "scheduler's policies assume identical hosts; give each the same count"
        )
    return hosts
