"""How the launcher and the agents of other hosts talk: signed records in the job store.

Keys (under the job's prefix), each record sealed with the job secret (cluster/auth.py):
- ``job/spec``: the workers' settings (``WorkerSettings``), written once by the launcher; an
  agent that cannot verify it holds the wrong secret and leaves before writing anything;
- ``hosts/N`` (etcd: ``hosts/joined/<token>``, each written with a count of them by one transaction
  that cannot conflict): agents' registrations ``{address, slots, pid, session}``;
- ``agent/<address>/<session>/cmd/N``: the controller's orders to one agent: ``spawn`` (id, rank,
  size), ``kill`` (id), ``stop`` (the job is over, or the host was declared lost), ``refuse``
  (another agent holds that address);
- ``from-agent/<address>/<session>/events/N``: what the agent saw: ``exit`` (id, code, last lines),
  ``leave`` (the agent is stopping), ``bye`` (it stopped its workers after a ``stop``);
- ``from-agent/<address>/<session>/summary``: the agent's heartbeat summary, one record per host,
  rewritten every beat: its own beat number and each of its workers' heartbeat counts, which
  they write to files on their host (cluster/beats.py), not to the store;
- ``from-agent/<address>/<session>/alive`` (etcd): a key under a lease the agent renews a few
  times per TTL; etcd deletes it when the lease runs out (``host_timeout``), and the launcher
  drops the host in one version. On every store an agent is alive while its beat number moves:
  the controller drops a host silent for ``host_timeout`` (the lease is the other way to go: it
  runs out up to a renewal period sooner, or up to etcd's half-second expiry sweep later). On etcd
  the launcher follows every ``from-agent/`` key with one watch (and reads an agent's events only
  once their count moved), reading a summary from the store itself only once the watch has shown
  it unchanged for ``CONFIRM_AFTER_S`` (a watch that runs behind must not pass for a silent
  agent); on a TCP store (no leases, no watches) it reads each host's summary per look.
Besides these keys, each agent holds a tether to the controller (launch/hosts/tether.py): a TCP
connection whose closing says at once that the process at the other end is gone.
Each registration has a session of its own, so an agent that joins again at the same address
never replays an earlier agent's orders.

A stream is polled with one atomic add per look (``records_after``), which on the launcher's
host is a local round trip; on etcd an agent watches its orders' count instead. The store's
load at steady state grows with hosts, not workers: per host one summary write per beat, plus
its lease's renewals (etcd) or the launcher's read of the summary per look (TCP store).
"""

from __future__ import annotations

import time
from dataclasses import asdict

from ...cluster import beats
from ...cluster.controller import Bounds
from ...cluster.follow import KeyFollower, PrefixFollower
from ...cluster.store import JobStore
from ...errors import StoreError
from ..worker_env import WorkerSettings

SPEC = "job/spec"
BOUNDS = "job/bounds"
CONTROLLER = "controller"
CONTROLLER_BEAT = "controller/beat"
OWNER = "controller/owner"
REGISTRATIONS = "hosts"
FROM_AGENTS = "from-agent/"  # what agents write (their summaries, leases and events): the launcher's to watch
STOP_POLL_S = 0.02  # how often a stopping launcher looks for its agents' byes
RENEWALS_PER_TTL = 3  # an agent renews its lease this often per TTL (etcd)
CONFIRM_AFTER_S = (
    0.5  # a watched summary unchanged this long (two agent beats; a quarter of the lease's TTL if
)
# that is shorter, so that it comes before the controller's judgment) is read from the store itself


def publish_settings(job: JobStore, settings: WorkerSettings) -> None:
    job.put_record(SPEC, settings.to_dict())


def read_settings(job: JobStore) -> WorkerSettings:
    """The job's worker settings; AuthError if they are not signed with our secret."""
    return WorkerSettings.from_dict(job.get_record(SPEC))


def publish_bounds(job: JobStore, bounds: Bounds) -> None:
    job.put_record(BOUNDS, asdict(bounds))


def read_bounds(job: JobStore) -> Bounds:
    return Bounds(**job.get_record(BOUNDS))


def publish_controller(
    job: JobStore, address: str, pid: int, slots: int, survivable: bool, tether: str = ""
) -> None:
    """Who runs the controller now. ``survivable``: the store outlives that host (an etcd cluster
    of the user's), so an agent may take over when its beat stops. ``tether``: where agents hold
    their tether to it (launch/hosts/tether.py)."""
    job.put_record(
        CONTROLLER,
        {"host": address, "pid": int(pid), "slots": int(slots), "survivable": survivable, "tether": tether},
    )


def read_controller(job: JobStore) -> dict:
    return job.get_record(CONTROLLER)


def beat_controller(job: JobStore, count: int) -> None:
    job.set(CONTROLLER_BEAT, str(count))


def controller_beat(job: JobStore) -> int:
    return job.add(CONTROLLER_BEAT, 0)


def owner(job: JobStore) -> bytes:
    """The election record (``term:host``; empty before any takeover)."""
    return job.get(OWNER) if job.has(OWNER) else b""


def elect(job: JobStore, address: str, seen: bytes) -> bool:
    """Try to become the job's next controller, having judged dead the one of term ``seen`` (the
    owner record when its beat last moved): a compare-and-set from ``seen`` to a value naming us.
    Exactly one contender wins; one that judged an older controller (someone took over since)
    loses."""
    term = int(seen.split(b":", 1)[0]) if seen else 0
    mine = f"{term + 1}:{address}".encode()
    return job.compare_set(OWNER, seen, mine) == mine


def register(job: JobStore, address: str, slots: int, pid: int, session: str) -> int:
    """The agent's registration, and its host's number in the job (1, 2, ...): on etcd one write
    that cannot lose a race (``JobStore.enrol``), however many agents register at once."""
    return job.enrol(
        REGISTRATIONS, {"address": address, "slots": int(slots), "pid": int(pid), "session": session}
    )


def registrations_after(job: JobStore, seen: int) -> tuple[int, list[dict]]:
    """Registrations since position ``seen`` (0: every one), and the position now."""
    return job.enrolled_after(REGISTRATIONS, seen)


def stop_agents(channels: dict[str, AgentChannel], wait: float, say) -> None:
    """Tell every agent the job is over and wait (up to ``wait`` seconds) until each says bye."""
    waiting = {}
    for address, channel in channels.items():
        try:
            channel.send({"op": "stop", "reason": "the job is over"})
            waiting[address] = channel
        except StoreError:
            pass
    deadline = time.monotonic() + wait
    while waiting and time.monotonic() < deadline:
        for address, channel in list(waiting.items()):
            try:
                if any(e.get("op") == "bye" for e in channel.new_events()):
                    del waiting[address]
            except StoreError:
                del waiting[address]
        time.sleep(STOP_POLL_S)
    for address in waiting:
        say(f"the agent of host {address} did not confirm that it stopped its workers")


class LeaseExpired(StoreError):
    """The agent's lease ran out (it could not renew it in time): the launcher has dropped its host."""


class StoreGone(StoreError):
    """The job's store died with its controller (the controller's tether closed and the store no
    longer answers): nothing to wait for."""


class AgentChannel:
    """One host's streams: the launcher's commands to its agent, and the agent's events back."""

    def __init__(
        self,
        job: JobStore,
        address: str,
        session: str,
        lease_ttl: float = Bounds.host_timeout,
        watched: PrefixFollower | None = None,
    ):
        self.job = job
        self.address = address
        self.session = session
        self._base = f"agent/{address}/{session}"
        self._live = f"{FROM_AGENTS}{address}/{session}"
        self.watched = watched  # the launcher's watch of every agent's keys (etcd)
        self.worker_beats: dict[str, int] = {}  # its workers' heartbeat counts, as last read
        self.lease_ttl = lease_ttl
        self.commands_seen = 0
        self.events_seen = 0
        self.beats_seen = 0
        self._moved_at = time.monotonic()  # when its beat number last moved, as the launcher saw it
        self.beats_sent = 0
        self._lease: int | None = None
        self._renewed = float("-inf")
        self._alive_seen = False
        self._commands_seq: KeyFollower | None = None  # the agent's watch of its orders (etcd)

    def send(self, *commands: dict) -> None:
        """Orders to the agent, in one record (the agent reads them in order); nothing rings the
        launcher's doorbell: the agent is their reader."""
        self.job.append_record(
            f"{self._base}/cmd", commands[0] if len(commands) == 1 else {"orders": commands}, ring=False
        )

    def new_commands(self) -> list[dict]:
        """The agent's new orders. Where the store can watch (etcd), the orders' count is followed
        by a watch and the stream read only once it moved past what was read (no HTTP round trip
        per tick); a TCP store is asked every time (a local round trip on the launcher's host)."""
        if self.job.can_watch and self._commands_seq is None:
            self._commands_seq = KeyFollower(self.job.another_connection(), f"{self._base}/cmd/seq")
        if self._commands_seq is not None and self._commands_seq.value <= self.commands_seen:
            return []
        self.commands_seen, found = self.job.records_after(f"{self._base}/cmd", self.commands_seen)
        return [order for record in found for order in record.get("orders", [record])]

    def report(self, event: dict) -> None:
        self.job.append_record(f"{self._live}/events", event)

    def new_events(self) -> list[dict]:
        """The agent's new events; where the launcher watches its keys, read only once their count moved."""
        if (
            self.watched is not None
            and int(self.watched.values.get(f"{self._live}/events/seq", 0)) <= self.events_seen
        ):
            return []
        self.events_seen, found = self.job.records_after(f"{self._live}/events", self.events_seen)
        return found

    def beat(self, worker_beats: dict[str, int]) -> None:
        """Say the agent is alive and how its workers' heartbeats stand (``worker_beats``, read from
        their files): one summary write, and on etcd its lease renewed (a few times per TTL)."""
        self.beats_sent += 1  # a plain write of our own record: one round trip on any store
        if self.job.has_leases and self._lease is None:  # the leased key before the first summary: a
            # launcher whose watch shows a summary has been shown the key (revision order)
            self._lease, self._renewed = (
                self.job.hold(f"{self._live}/alive", "1", self.lease_ttl),
                time.monotonic(),
            )
        self.job.set(f"{self._live}/summary", beats.summary(self.beats_sent, worker_beats))
        if self.job.has_leases:
            now = time.monotonic()
            if now - self._renewed < self.lease_ttl / RENEWALS_PER_TTL:
                return
            elif not self.job.renew(self._lease):
                raise LeaseExpired(
                    f"host {self.address}: its lease in the job store expired (not renewed for "
                    f"{self.lease_ttl:g}s: the store was out of reach), so the launcher has dropped "
                    "this host"
                )
            self._renewed = now

    def leave(self) -> None:
        """The agent stops: end its lease now rather than when it runs out."""
        if self._commands_seq is not None:
            self._commands_seq.close()
        if self._lease is not None:
            self.job.release(self._lease)
            self._lease = None

    def liveness(self) -> str:
        """What the launcher sees of the agent since its last look: ``"beat"`` (its beat number moved:
        alive), ``"quiet"`` (no sign: the controller judges the silence, alike on every store), or
        ``"expired"`` (etcd: its lease ran out: gone); its workers' heartbeat counts, from its
        newest summary, are left in ``worker_beats``."""
        summary = self._read("summary")  # first: a summary shown means its leased key was shown before
        if self.job.has_leases:
            if self._read("alive") is not None:
                self._alive_seen = True
            elif self._alive_seen:
                return "expired"
        now = time.monotonic()
        seq, counts = beats.read_summary(summary)
        if (
            seq <= self.beats_seen
            and self.watched is not None
            and now - self._moved_at > min(CONFIRM_AFTER_S, self.lease_ttl / 4)
        ):
            seq, counts = beats.read_summary(self._read("summary", fresh=True))
        if seq <= self.beats_seen:
            return "quiet"
        self.beats_seen, self.worker_beats, self._moved_at = seq, counts, now
        return "beat"

    def _read(self, name: str, fresh: bool = False) -> bytes | None:
        """One of its keys: from the launcher's watch where there is one (unless ``fresh``), else
        the store."""
        key = f"{self._live}/{name}"
        if self.watched is not None and not fresh:
            return self.watched.values.get(key)
        return self.job.get(key) if self.job.has(key) else None
