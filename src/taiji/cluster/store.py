"""The job's versioned key-value store.

The launcher hosts a ``torch.distributed.TCPStore``; everything taiji keeps there lives
under a per-job prefix. Config versions are published with compare-and-set, so two
writers can never both publish ``v{N}``. ``FakeStore`` (cluster/fake_store.py) has the same
semantics in memory (plus fault injection) for unit tests of control-plane logic.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch.distributed as dist

from ..errors import AuthError, StoreError
from .auth import Signer, unsealed
from .kv import (
    KeyValue,
    SupportsConnections,
    SupportsCountedPuts,
    SupportsLease,
    SupportsPollInterval,
    SupportsTransactions,
    SupportsWatch,
)
from .listener import store_listener
from .spec import ClusterConfig

if TYPE_CHECKING:
    from .follow import KeyFollower

log = logging.getLogger(__name__)

LATEST_KEY = "config/latest"
DEFAULT_POLL_S = 0.05


def config_key(version: int) -> str:
    return f"config/v{version}"


class JobStore:
    """Typed access to one job's keys in a store (real TCPStore or FakeStore).

    With a ``signer`` (every process `taiji run` or `taiji join` starts has one), control records
    — configs, proposals, settings, bounds, agents' registrations, commands and exits — are sealed
    with the job secret and a record that fails its check is rejected: on a store anyone on the
    network can write to, a forged config or spawn command is refused instead of obeyed. Flags and
    counters (ready, failure reports, done, fatal, heartbeats, the doorbell, the election record)
    are not signed: forging them can stop or stall the job — which anyone who reaches an open
    store can do anyway — but cannot make it run anything or train with anyone else."""

    def __init__(self, kv: KeyValue, job_id: str, signer: Signer | None = None):
        self.kv = kv
        self.job_id = job_id
        self.signer = signer
        self._prefix = f"taiji/{job_id}/"

    def key(self, name: str) -> str:
        return self._prefix + name

    @property
    def poll_interval(self) -> float:
        """How often a background thread may look for a change here: a TCPStore answers a poll
        in microseconds, etcd over HTTP in a millisecond of this process's CPU."""
        return float(self.kv.poll_interval) if isinstance(self.kv, SupportsPollInterval) else DEFAULT_POLL_S

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except StoreError:
            raise
        except (dist.DistError, RuntimeError, ConnectionError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(
                f"job {self.job_id}: store {what} failed: {first} (is the store's host up and "
                "reachable from here?)"
            ) from exc  # (torch's messages go on with C++ frames)

    def set(self, name: str, value: str | bytes) -> None:
        self._call(f"set {name}", self.kv.set, self.key(name), value)

    def get(self, name: str) -> bytes:
        return self._call(f"get {name}", self.kv.get, self.key(name))

    def has(self, name: str) -> bool:
        return self._call(f"check {name}", self.kv.check, [self.key(name)])

    def add(self, name: str, amount: int) -> int:
        return self._call(f"add {name}", self.kv.add, self.key(name), amount)

    def put_record(self, name: str, record: dict) -> None:
        """Write a control record, sealed when this store has the job's signer."""
        self.set(name, self._sealed(name, record))

    def _sealed(self, name: str, record: dict) -> str | bytes:
        return self.signer.seal(self.key(name), record) if self.signer else json.dumps(record)

    def get_record(self, name: str, raw: bytes | None = None) -> dict:
        """Read a control record (``raw``: as read already); AuthError if it is not sealed with this job's
        secret."""
        raw = self.get(name) if raw is None else raw
        return self.signer.open(self.key(name), raw) if self.signer else unsealed(raw)

    def compare_set(self, name: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._call(f"compare_set {name}", self.kv.compare_set, self.key(name), expected, desired)

    def latest_version(self) -> int:
        """The newest published config version, or 0 if none is published yet."""
        if not self.has(LATEST_KEY):
            return 0
        return int(self.get(LATEST_KEY))

    # -- leases and watches, where the store has them (etcd; a TCPStore has neither) ---------

    @property
    def has_leases(self) -> bool:
        return isinstance(self.kv, SupportsLease)

    def _leases(self) -> SupportsLease:
        if not isinstance(self.kv, SupportsLease):
            raise StoreError(f"job {self.job_id}: this store has no leases (etcd has; a TCPStore has not)")
        return self.kv

    def hold(self, name: str, value: str, ttl: float) -> int:
        """Write ``name`` under a fresh lease of ``ttl`` seconds: it vanishes unless renewed."""
        return self._call(f"hold {name}", self._leases().hold, self.key(name), value, ttl)

    def renew(self, lease: int) -> bool:
        """Renew a lease; False once it has expired (its key is gone)."""
        return self._call("renew a lease", self._leases().renew, lease)

    def release(self, lease: int) -> None:
        self._call("revoke a lease", self._leases().release, lease)

    @property
    def can_watch(self) -> bool:
        return isinstance(self.kv, SupportsWatch)

    def follow(self, name: str, stop: threading.Event) -> Iterator[bytes | None]:
        """``name``'s value now and at each change (None: absent), until ``stop`` — a watch, no
        polling; on a connection of its own (``another_connection()``)."""
        if not isinstance(self.kv, SupportsWatch):
            raise StoreError(f"job {self.job_id}: this store cannot be watched (etcd can; poll a TCPStore)")
        changes = self.kv.changes(self.key(name), stop)
        try:
            yield from changes
        except (dist.DistError, RuntimeError, ConnectionError, OSError) as exc:
            raise StoreError(f"job {self.job_id}: watching {name} failed: {exc}") from exc

    def follow_under(self, name: str, stop: threading.Event) -> Iterator[tuple[str, bytes | None]]:
        """Every key under ``name`` (its name past the job's prefix) with its value now, then at each
        write or deletion (None), until ``stop``: one watch, on a connection of its own."""
        if not isinstance(self.kv, SupportsWatch):
            raise StoreError(f"job {self.job_id}: this store cannot be watched (etcd can; poll a TCPStore)")
        for key, value in self.kv.changes_under(self.key(name), stop):
            yield key[len(self._prefix) :], value

    def follow_configs(self, stop: threading.Event) -> Iterator[ClusterConfig]:
        """The newest published config (once there is one) and each newer one as it is published, until
        ``stop``: one watch of ``config/`` whose events carry the configs themselves (a publish writes
        ``config/v{N}`` and moves ``latest`` in one transaction), so no read follows a change; only a
        version the watch did not carry (the first, or one past a compaction) is read."""
        if not isinstance(self.kv, SupportsWatch):
            raise StoreError(f"job {self.job_id}: this store cannot be watched (etcd can; poll a TCPStore)")
        carried: dict[str, bytes] = {}
        newest, latest = 0, self.key(LATEST_KEY)
        for key, value in self.kv.changes_from(latest, self.key("config/"), stop):
            if key != latest:
                if value is not None:
                    carried[key] = value
                continue
            if int(value or 0) > newest:
                newest = int(value or 0)
                yield self.read_config(newest, raw=carried.get(self.key(config_key(newest))))
            carried.clear()

    def read_config(
        self, version: int | None = None, wait: float = 0.0, raw: bytes | None = None
    ) -> ClusterConfig:
        """Config ``version`` (``raw``: as read already; None: the latest, ``wait``: once one is
        published)."""
        if version is None:
            if wait > 0:  # the latest once one is published (`taiji run` starts workers before it publishes)
                self.wait_for_version(1, wait)
            version = self.latest_version() or (1 if wait > 0 else 0)
            if version == 0:
                raise StoreError(f"job {self.job_id}: no cluster config is published yet")
        try:
            return ClusterConfig.from_dict(self.get_record(config_key(version), raw))
        except AuthError as exc:
            raise AuthError(
                f"job {self.job_id}: cluster config v{version} is not signed with the job's "
                f"secret ({exc}); someone else wrote to the job store: stop the job and keep its "
                "store on a trusted network"
            ) from exc

    def publish(self, config: ClusterConfig) -> bool:
        """Publish ``config`` as the next version; False if another writer got there first.

        A writer first claims ``config/v{N}/owner`` with a unique token (CAS against absent);
        only the owner writes ``config/v{N}`` and then moves ``config/latest`` from ``N-1`` to
        ``N`` (CAS). Readers follow ``latest``, so they never see a rival or missing version.
        A store with transactions (etcd) does the three in one, on the same conditions.
        """
        token, name = uuid.uuid4().hex.encode(), config_key(config.version)
        owner, latest = self.key(name + "/owner"), self.key(LATEST_KEY)
        previous = b"" if config.version == 1 else str(config.version - 1).encode()
        desired = str(config.version).encode()
        if isinstance(self.kv, SupportsTransactions):
            return self._call(
                "publish",
                self.kv.put_if,
                {owner: b"", latest: previous},
                {owner: token, self.key(name): self._sealed(name, config.to_dict()), latest: desired},
            )
        if self._call("publish", self.kv.compare_set, owner, b"", token) != token:
            return False
        self.put_record(name, config.to_dict())
        return self._call("publish", self.kv.compare_set, latest, previous, desired) == desired

    # -- keys the launcher's driver watches (written by workers or `taiji resize`) -------

    def propose(self, size: int, source: str, placement: tuple[tuple[str, int], ...] = ()) -> int:
        """Ask for ``size`` workers (``placement``: so many on each host); returns the proposal's
        sequence number."""
        seq = self.add("proposal/seq", 1)
        placed = {"placement": [[host, int(count)] for host, count in placement]} if placement else {}
        self.put_record(f"proposal/{seq}", {"size": int(size), "source": source, **placed})
        self.ring()
        return seq

    def proposals_after(self, seen: int) -> tuple[int, list[dict]]:
        """Proposals with sequence numbers above ``seen`` that are fully written (one with a bad
        signature is logged and skipped)."""
        return self.records_after("proposal", seen)

    def append_record(self, stream: str, record: dict, ring: bool = True) -> int:
        """Append ``record`` to the numbered ``stream`` (``stream/1``, ``stream/2``, ...); ``ring``: for the
        launcher."""
        seq = self.add(f"{stream}/seq", 1)
        self.put_record(f"{stream}/{seq}", record)
        if ring:
            self.ring()
        return seq

    def enrol(self, stream: str, record: dict) -> int:
        """Append ``record`` to ``stream`` and ring the doorbell; its number there (1, 2, ...). Where a
        put can be counted (etcd), one transaction writes it under a fresh name, rings and counts the
        records: it cannot lose a race, where ``append_record``'s counter is a compare-and-set that
        every writer racing it retries. Read with ``enrolled_after``."""
        if not isinstance(self.kv, SupportsCountedPuts):
            return self.append_record(stream, record)
        name = f"{stream}/joined/{uuid.uuid4().hex}"
        return self._call(
            f"enrol in {stream}",
            self.kv.put_counted,
            {self.key(name): self._sealed(name, record), self.key("doorbell"): _bell_token()},
            self.key(f"{stream}/joined/"),
        )

    def enrolled_after(self, stream: str, seen: int) -> tuple[int, list[dict]]:
        """The records ``enrol`` added to ``stream`` since position ``seen`` (0: the start), in order, and
        the position now (a store revision where puts are counted, else a record's number)."""
        if not isinstance(self.kv, SupportsCountedPuts):
            return self.records_after(stream, seen)
        seen, found = self._call(f"read {stream}", self.kv.created_after, self.key(f"{stream}/joined/"), seen)
        return seen, self._opened((key[len(self._prefix) :], raw) for key, raw in found)

    def _opened(self, records: Iterable[tuple[str, bytes | None]]) -> list[dict]:
        """Records (name, value as read, or None: read it now) opened; those that fail their check are
        logged and skipped."""
        found = []
        for name, raw in records:
            try:
                found.append(self.get_record(name, raw))
            except AuthError as exc:
                log.warning("job %s: ignored %s: %s", self.job_id, name, exc)
        return found

    def records_after(self, stream: str, seen: int) -> tuple[int, list[dict]]:
        """The records of ``stream`` numbered above ``seen``, in order, up to the first one its
        writer has not finished; records that fail their signature check are logged and skipped."""
        latest = self.add(f"{stream}/seq", 0)
        for seq in range(seen + 1, latest + 1):
            if not self.has(f"{stream}/{seq}"):
                latest = seq - 1  # its writer has not set the value yet: next time
                break
        return latest, self._opened((f"{stream}/{seq}", None) for seq in range(seen + 1, latest + 1))

    def mark_ready(self, worker_id: str) -> None:
        self.set(f"worker/{worker_id}/ready", "1")
        self.ring()

    def is_ready(self, worker_id: str) -> bool:
        return self.has(f"worker/{worker_id}/ready")

    def set_training(self, worker_id: str, training: bool) -> None:
        self.set(f"worker/{worker_id}/training", "1" if training else "0")

    def is_training(self, worker_id: str) -> bool:
        return self.has(f"worker/{worker_id}/training") and self.get(f"worker/{worker_id}/training") == b"1"

    def failures_reported(self, version: int) -> bool:
        """Has any member reported a failed collective in ``version``?"""
        return self.add(f"failed/v{version}/count", 0) > 0

    def another_connection(self) -> JobStore:
        """The same job store on a connection of its own, for a background thread (whose
        blocking calls must not queue behind the training thread's); in-process stores are shared."""
        kv = self.kv
        if isinstance(kv, dist.TCPStore):
            return JobStore(connect_store(kv.host, kv.port), self.job_id, self.signer)
        if isinstance(kv, SupportsConnections):  # etcd: a connection (HTTP session) per thread
            return JobStore(kv.another(), self.job_id, self.signer)
        return self

    def report_failure(self, version: int, worker_id: str, step: int = -1) -> None:
        self.set(f"failed/v{version}/{worker_id}", str(step))
        self.add(f"failed/v{version}/count", 1)
        self.ring()

    def failure_reports(
        self, version: int, members: Iterable[str]
    ) -> dict[str, int]:  # member -> step it failed in
        if not self.failures_reported(version):
            return {}
        return {
            m: int(self.get(f"failed/v{version}/{m}")) for m in members if self.has(f"failed/v{version}/{m}")
        }

    def report_fatal(self, worker_id: str, message: str) -> None:
        """Stop the whole job: the first report is the one the launcher shows."""
        if self.add("fatal/count", 1) == 1:
            self.set("fatal", json.dumps({"worker": worker_id, "message": message}))
        self.ring()

    def fatal_report(self) -> dict | None:
        return json.loads(self.get("fatal")) if self.has("fatal") else None

    def set_done(self) -> None:
        self.set("done", "1")
        self.ring()

    # -- the doorbell: one key the launcher's driver polls every tick -------------------------

    def ring(self) -> None:
        """Say that something the launcher reacts to was written (after writing it). Where the doorbell is
        watched (etcd), a fresh token: an add there is a compare-and-set that every ringer racing it
        retries."""
        if self.can_watch:
            return self.set("doorbell", _bell_token())
        self.add("doorbell", 1)

    def follow_doorbell(self) -> KeyFollower | None:
        """Where the store can watch (etcd): the doorbell followed by a thread of its own (a tick reads a
        variable)."""
        from .follow import KeyFollower

        return KeyFollower(self.another_connection(), "doorbell") if self.can_watch else None

    def doorbell(self) -> int:
        """The doorbell: while it stays put, nothing the launcher reacts to was written
        (one read, no poll of all)."""
        return self.add("doorbell", 0)

    def is_done(self) -> bool:
        return self.has("done")

    def write_status(self, status: dict) -> None:
        self.set("status", json.dumps(status))

    def read_status(self) -> dict | None:
        return json.loads(self.get("status")) if self.has("status") else None

    def wait_for_version(self, version: int, timeout: float) -> None:
        """Block until config ``version`` is published (StoreError after ``timeout``)."""
        key = self.key(config_key(version))
        self._call(f"wait for config v{version}", self.kv.wait, [key], datetime.timedelta(seconds=timeout))


def _bell_token() -> str:
    """A watched doorbell's new value: any that differs from the last one."""
    return str(uuid.uuid4().int >> 66)


def host_store(
    host: str = "127.0.0.1", port: int = 0, timeout: float = 60.0, listener: socket.socket | None = None
) -> dist.TCPStore:
    """Start the embedded TCPStore server (the launcher's side). Port 0 picks a free port.

    It listens on ``host`` only: TCPStore binds every interface whatever host it is given, so
    the listening socket is bound here (or given: ``listener.store_listener``) and handed over
    (the store has no authentication)."""
    listener = listener or store_listener(host, port)
    bound_port = listener.getsockname()[1]
    fd = listener.detach()  # the store owns the descriptor from here on
    try:
        return dist.TCPStore(
            host,
            bound_port,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout),
            master_listen_fd=fd,
            use_libuv=True,
        )
    except (RuntimeError, OSError) as exc:
        os.close(fd)
        raise StoreError(f"cannot start the job store on {host}:{bound_port}: {exc}") from exc


def open_store(url: str, timeout: float = 60.0, credentials: tuple[str, str] | None = None) -> dist.Store:
    """A client of the job store at ``url``: ``tcp://HOST:PORT`` (the launcher's TCPStore) or
    ``etcd://HOST:PORT[,HOST:PORT...]`` (``etcds://``: TLS) (as the job's etcd user when ``credentials`` are
    given); both are ``torch.distributed.Store``s (gloo rendezvous)."""
    from .etcd import is_etcd_url

    if is_etcd_url(url):
        from .etcd import EtcdKV
        from .etcd_store import EtcdC10dStore

        try:
            kv = EtcdKV(url, timeout, credentials)  # authenticating reaches the cluster too
            kv.reachable()
            store = EtcdC10dStore(kv)
        except StoreError as exc:
            raise StoreError(
                f"cannot reach the job store {url}: {exc}. Is the launcher (or the etcd cluster) "
                "running, and is this host on its network?"
            ) from exc
        return store
    address = url[len("tcp://") :] if url.startswith("tcp://") else url
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise StoreError(f"bad job store address {url!r}: expected tcp://HOST:PORT or etcd://HOST:PORT")
    return connect_store(host.strip("[]"), int(port), timeout)


def connect_job(
    url: str, job_id: str, secret: bytes | None, timeout: float = 60.0
) -> tuple[dist.Store, JobStore]:
    """The store at ``url`` and job ``job_id``'s view of it: records signed and checked with the
    job secret, and on etcd as the job's own user (when the cluster has auth on)."""
    credentials = None
    from .etcd import is_etcd_url, job_credentials

    if is_etcd_url(url) and secret is not None:
        credentials = job_credentials(job_id, secret)
    raw = open_store(url, timeout, credentials)
    return raw, JobStore(raw, job_id, Signer(secret) if secret is not None else None)


def connect_store(host: str, port: int, timeout: float = 60.0) -> dist.TCPStore:
    """Connect to the job's TCPStore (a worker's or an agent's side), within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    why = _unreachable(host, port, deadline)
    try:
        if why is None:
            return dist.TCPStore(
                host,
                port,
                is_master=False,
                use_libuv=True,
                timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 1.0)),
            )
    except (RuntimeError, OSError) as exc:
        why = str(exc).splitlines()[0]  # (torch's messages go on with C++ stack frames)
    raise StoreError(
        f"cannot reach the job store at {host}:{port} within {timeout:g}s ({why}): is the "
        "job's launcher running there, and can this host reach that address?"
    )


def _unreachable(host: str, port: int, deadline: float) -> str | None:
    """Why nothing answers at ``host:port`` until ``deadline`` (None: something listens there). A
    refused connection is tried again (the launcher may be starting); no answer at all is not."""
    while True:
        try:
            socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.05)).close()
            return None
        except ConnectionRefusedError:
            if time.monotonic() + 0.2 > deadline:
                return "connection refused: nothing listens on that port"
            time.sleep(0.2)
        except OSError as exc:
            return "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
