"""How the launcher and the agents of other hosts talk: signed records in the job store.

Keys (under the job's prefix), each record sealed with the job secret (cluster/auth.py):
- ``job/spec``: the workers' settings (``WorkerSettings``), written once by the launcher; an
  agent that cannot verify it holds the wrong secret and leaves before writing anything;
- ``hosts/N``: agents' registrations ``{address, slots, pid}``;
- ``agent/<address>/cmd/N``: the launcher's orders to one agent: ``spawn`` (id, rank, size),
  ``kill`` (id), ``stop`` (the job is over, or the host was declared lost);
- ``agent/<address>/events/N``: what the agent saw: ``exit`` (id, code, last lines), ``leave``
  (the agent is stopping), ``bye`` (it stopped its workers after a ``stop``);
- ``agent/<address>/beat``: a counter the agent bumps while it runs (its lease).

A stream is polled with one atomic add per look (``records_after``), which on the launcher's
host is a local round trip.
"""
from __future__ import annotations

from ..cluster.store import JobStore
from .worker_env import WorkerSettings

SPEC = "job/spec"
REGISTRATIONS = "hosts"


def publish_settings(job: JobStore, settings: WorkerSettings) -> None:
    job.put_record(SPEC, settings.to_dict())


def read_settings(job: JobStore) -> WorkerSettings:
    """The job's worker settings; AuthError if they are not signed with our secret."""
    return WorkerSettings.from_dict(job.get_record(SPEC))


def register(job: JobStore, address: str, slots: int, pid: int) -> int:
    return job.append_record(REGISTRATIONS, {"address": address, "slots": int(slots), "pid": int(pid)})


def registrations_after(job: JobStore, seen: int) -> tuple[int, list[dict]]:
    return job.records_after(REGISTRATIONS, seen)


class AgentChannel:
    """One host's streams: the launcher's commands to its agent, and the agent's events back."""

    def __init__(self, job: JobStore, address: str):
        self.job = job
        self.address = address
        self._base = f"agent/{address}"
        self.commands_seen = 0
        self.events_seen = 0
        self.beats_seen = 0
        self.beats_sent = 0

    def send(self, command: dict) -> None:
        self.job.append_record(f"{self._base}/cmd", command)

    def new_commands(self) -> list[dict]:
        self.commands_seen, found = self.job.records_after(f"{self._base}/cmd", self.commands_seen)
        return found

    def report(self, event: dict) -> None:
        self.job.append_record(f"{self._base}/events", event)

    def new_events(self) -> list[dict]:
        self.events_seen, found = self.job.records_after(f"{self._base}/events", self.events_seen)
        return found

    def beat(self) -> None:
        self.beats_sent += 1  # a plain write of our own counter: one round trip on any store
        self.job.set(f"{self._base}/beat", str(self.beats_sent))

    def beat_moved(self) -> bool:
        """Has the agent beaten since the last look?"""
        count = self.job.add(f"{self._base}/beat", 0)
        moved, self.beats_seen = count != self.beats_seen, count
        return moved
