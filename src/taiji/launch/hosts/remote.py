"""The job's other hosts, as its controller sees them: their agents, the workers placed there, and
the events they bring.

An agent registers in the store (``hosts/N``), gets an ``AgentChannel`` (signed orders out, events
back: launch/hosts/agent_channel.py), beats (a lease in etcd, a counter in a TCP store) and holds a
tether to the controller (launch/hosts/tether.py) whose closing says at once that it is gone. The
``Driver`` turns the controller's decisions into orders here (``spawn``, ``kill``, ``refuse``,
``release``) and feeds the controller what this part reports (``events``); launch/takeover.py
builds one from a running job's store for the agent that takes the job over.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...cluster import controller as ctl
from ...cluster.follow import PrefixFollower
from ...cluster.store import JobStore
from ...errors import LaunchError, StoreError
from ..supervisor import describe_exit
from . import agent_channel
from .agent_channel import AgentChannel
from .tether import TetherServer


@dataclass
class RemoteWorker:
    host: str
    rank: int
    exit_code: int | None = None
    tail: tuple[str, ...] = ()


class RemoteHosts:
    """The agents of the hosts other than ``here`` that serve the job, and their workers."""

    def __init__(self, job: JobStore, here: str, say: Callable[[str], None]):
        self.job, self.here, self.say = job, here, say
        self._wake: Callable[[], None] = lambda: None
        # etcd: every key the agents write followed by one watch (a lease running out wakes the
        # controller); a TCP store is read per look
        self.watched = (
            PrefixFollower(job.another_connection(), agent_channel.FROM_AGENTS, lambda key: self._wake())
            if job.can_watch
            else None
        )
        self.agents: dict[str, AgentChannel] = {}
        self.workers: dict[str, RemoteWorker] = {}
        self.tether: TetherServer | None = None
        self.early: list[ctl.Event] = []  # hosts that joined beyond --nnodes MIN while the job gathered
        self._registrations_seen = 0

    def open_tether(self, secret: bytes, on_lost: Callable[[], None] = lambda: None) -> str:
        """Listen for the agents' tethers; returns the address they connect to. ``on_lost``: called
        when one closes (wakes the controller's wait: a lost host is acted on at once, not next tick)."""
        self.tether = TetherServer(self.here, secret, on_lost)
        self._wake = on_lost
        return self.tether.address

    # -- a running job's hosts, taken over ------------------------------------------------

    def adopt(self, address: str, session: str, lease_ttl: float) -> None:
        """Serve the agent registered at ``address`` (its events read from the start: exits written
        while nobody controlled the job are not lost)."""
        self.agents[address] = AgentChannel(self.job, address, session, lease_ttl, self.watched)

    def place(self, worker_id: str, host: str, rank: int) -> None:
        """A running worker of ``host``'s agent."""
        self.workers[worker_id] = RemoteWorker(host, rank)

    def skip_past_registrations(self) -> None:
        """React only to registrations written from now on."""
        self._registrations_seen, _ = agent_channel.registrations_after(self.job, 0)

    # -- orders -----------------------------------------------------------------------------

    def spawn(self, host: str, workers: list[tuple[str, int]], size: int) -> None:
        """Start ``workers`` (id, rank) on ``host``: one record of orders to its agent."""
        for worker_id, rank in workers:
            self.workers[worker_id] = RemoteWorker(host, rank)
        self.agents[host].send(
            *({"op": "spawn", "id": wid, "rank": rank, "size": size} for wid, rank in workers)
        )

    def kill(self, worker_id: str) -> bool:
        """Order the worker's agent to kill it; False if it is not a worker of another host."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return False
        if worker.exit_code is None and worker.host in self.agents:
            self.agents[worker.host].send({"op": "kill", "id": worker_id})
        return True

    def refuse(self, address: str, reason: str) -> None:
        """The controller refused host ``address``: tell its agent why."""
        channel = self.agents.pop(address, None)
        if channel is not None:
            self._refuse(channel, reason)

    def release(self, addresses: set[str]) -> None:
        """The controller dropped these hosts: tell their agents to stop (if they can still hear)."""
        for address in addresses & set(self.agents):
            channel = self.agents.pop(address)
            try:
                channel.send({"op": "stop", "reason": "the launcher declared this host lost"})
            except StoreError:
                pass
            for worker in self.workers.values():
                if worker.host == address and worker.exit_code is None:
                    worker.exit_code = -9  # gone with its host

    def stop(self, wait: float) -> None:
        """The job is over: stop every agent, waiting up to ``wait`` seconds for their byes."""
        agent_channel.stop_agents(self.agents, wait, self.say)
        self.agents.clear()

    def close(self) -> None:
        if self.tether is not None:
            self.tether.close()
        if self.watched is not None:
            self.watched.close()

    # -- what the controller reads ----------------------------------------------------------

    def running(self) -> list[str]:
        return [wid for wid, worker in self.workers.items() if worker.exit_code is None]

    def beat_counts(self) -> dict[str, int]:
        """Their running workers' heartbeat counts, from their agents' summaries as last read."""
        counts = {wid: n for channel in self.agents.values() for wid, n in channel.worker_beats.items()}
        return {wid: counts.get(wid, 0) for wid in self.running()}

    def events(
        self, state: ctl.ControllerState, now: float, rang: bool, look_at_beats: bool
    ) -> list[ctl.Event]:
        """Registrations and agents' events (when the doorbell rang), closed tethers, and (when
        ``look_at_beats``) the agents' beats."""
        events: list[ctl.Event] = []
        found = []
        if rang:
            self._registrations_seen, found = agent_channel.registrations_after(
                self.job, self._registrations_seen
            )
        for record in found:
            address, slots = str(record.get("address")), int(record.get("slots", 0))
            channel = AgentChannel(
                self.job, address, str(record.get("session", "")), state.bounds.host_timeout, self.watched
            )
            if address == self.here or address in self.agents:
                why = "the controller runs there" if address == self.here else "another agent serves it"
                self._refuse(channel, f"host {address} is in the job already ({why})")
                continue
            self.agents[address] = channel
            self.say(f"host {address} joined (agent pid {record.get('pid')}, {slots} slot(s))")
            events.append(ctl.HostJoined(address, slots))
        for address, session in self.tether.lost() if self.tether is not None else []:
            if address in self.agents and self.agents[address].session == session:
                events.append(
                    ctl.HostLost(
                        address,
                        "its agent's tether to the controller closed: the agent's "
                        "process is gone, and its workers with it",
                    )
                )
        for address, channel in list(self.agents.items()):
            # where the agents' keys are watched, each tick (a local look: that watch may run behind
            # the doorbell's)
            for event in channel.new_events() if rang or self.watched is not None else []:
                op = event.get("op")
                if op == "exit":
                    events.append(self._exited(event, state))
                elif op == "leave":
                    events.append(ctl.HostLost(address, f"its agent is stopping: {event.get('reason', '')}"))
            liveness = channel.liveness() if look_at_beats else "quiet"
            if liveness == "beat":
                events.append(ctl.HostBeat(address, now))
            elif liveness == "expired":
                events.append(
                    ctl.HostLost(
                        address, f"its agent's lease expired (not renewed for {channel.lease_ttl:g}s)"
                    )
                )
        return events

    def gather(
        self,
        count: int,
        state: ctl.ControllerState,
        job_id: str,
        tick: Callable[[], int | None],
        beat_every: int,
    ) -> tuple[ctl.Host, ...]:
        """Before the start (`--nnodes MIN:MAX`): wait for ``count`` agents to join (--join-timeout).
        ``tick`` waits one of the driver's ticks and returns a signal received meanwhile (which
        ends the wait), if any; the agents' beats are looked at every ``beat_every`` ticks."""
        joined: dict[str, ctl.Host] = {}
        timeout = state.bounds.join_timeout
        deadline = time.monotonic() + timeout
        self.say(f"waiting for {count} more host(s) to join (--nnodes) before the job starts")
        ticks = 0
        while len(joined) < count:
            received = tick()
            ticks += 1
            if received is not None:
                raise LaunchError(
                    f"job {job_id}: {signal.Signals(received).name} received while "
                    f"waiting for hosts ({len(joined) + 1} of {count + 1} there)"
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"job {job_id}: only {len(joined) + 1} of the {count + 1} hosts --nnodes "
                    f"asks for joined within --join-timeout {timeout:g}s: start "
                    "`taiji join` on the others (see above), or lower the MIN of --nnodes"
                )
            for event in self.events(
                state, time.monotonic(), rang=True, look_at_beats=ticks % beat_every == 0
            ):
                if isinstance(event, ctl.HostJoined) and len(joined) >= count:
                    self.early.append(event)  # beyond MIN in the same tick: the controller decides
                elif isinstance(event, ctl.HostJoined):
                    joined[event.address] = ctl.Host(event.address, event.slots)
                elif isinstance(event, ctl.HostLost):
                    joined.pop(event.address, None)
                    self.agents.pop(event.address, None)
        return tuple(joined.values())

    def _exited(self, event: dict, state: ctl.ControllerState) -> ctl.Event:
        wid, code = str(event["id"]), int(event["code"])
        worker = self.workers.get(wid)
        if worker is not None:
            worker.exit_code, worker.tail = code, tuple(event.get("tail", ()))
            if code != 0 and wid not in state.killed:
                self.say(f"worker {wid} (rank {worker.rank} on host {worker.host}) {describe_exit(code)}")
        return ctl.WorkerExited(wid, code, self.job.is_training(wid))

    def _refuse(self, channel: AgentChannel, reason: str) -> None:
        self.say(f"refused host {channel.address}: {reason}")
        channel.send({"op": "refuse", "reason": reason})
