"""Membership: which cluster version this worker trains in, and how it moves to the next.

Two roles, two objects: the ``Peer`` (runtime/peer.py; the loop's parts see it as a ``Member``) is
this worker's place in its current version and that version's communicator, and moves to a new
version (``transition``); ``Membership`` is the conversation with the job store about versions —
joining, failure reports, reading and waiting for the configs to move to. ``SoloMembership`` is a
one-worker job with no launcher (nothing can change); ``ElasticMembership`` is a worker started
by ``taiji run``: a watcher thread
follows the published configs (so no step pays a store round trip to ask "is there a newer
version?"), and failures are reported to the launcher, whose next config the worker waits for.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Protocol

from ..cluster.spec import ClusterConfig
from ..cluster.store import JobStore, config_key
from ..errors import ConfigError, StoreError
from .peer import Peer

log = logging.getLogger(__name__)

# how often the watcher looks for a newer config: it bounds how late a resize is noticed (a step
# boundary later at most) and how long closing the watcher takes. Short, non-blocking checks: a
# store wait that times out would log a warning every time, and cannot be interrupted to close.
WATCH_POLL_S = 0.05
# while this worker has waited for a collective longer than STUCK_AFTER_S (a peer may be lost), the
# watcher looks every STUCK_POLL_S: the version that drops the lost peer ends the wait that soon
STUCK_AFTER_S, STUCK_POLL_S = 0.02, 0.01


class Membership(Protocol):
    def join(self, timeout: float) -> ClusterConfig: ...
    def watch(self) -> None: ...
    def newest_version(self) -> int: ...
    def peers_gave_up(self, idle_seconds: float) -> bool: ...
    def read_config(self, version: int) -> ClusterConfig: ...
    def wait_for_newer(self, timeout: float) -> ClusterConfig: ...
    def report_failure(self) -> None: ...
    def report_fatal(self, message: str) -> None: ...
    def set_training(self, training: bool) -> None: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...


class _PeerMembership:
    """What both kinds share: the job store, and this worker's identity on it (its Peer)."""

    def __init__(self, peer: Peer):
        self.peer = peer
        self._store = peer.job_store

    def report_fatal(self, message: str) -> None:
        """No peer can recover from this: the launcher stops the whole job with it as the root
        cause (before the peers mistake this worker's exit for a crash to recover from)."""
        try:
            self._store.report_fatal(self.peer.worker_id, message)
            self._store.set_training(self.peer.worker_id, False)
        except StoreError:
            log.warning("could not tell the launcher about: %s", message)

    def set_training(self, training: bool) -> None:
        self._store.set_training(self.peer.worker_id, training)

    def finish(self) -> None:
        if self.peer.rank == 0:
            self._store.set_done()


class SoloMembership(_PeerMembership):
    """One worker, no launcher: the cluster never changes."""

    def join(self, timeout: float) -> ClusterConfig:
        raise ConfigError("a one-worker job without `taiji run` has no cluster to join")

    def watch(self) -> None:
        return None

    def read_config(self, version: int) -> ClusterConfig:
        raise ConfigError("this worker was not started by `taiji run`: there is no cluster to change")

    def newest_version(self) -> int:
        return self.peer.version

    def wait_for_newer(self, timeout: float) -> ClusterConfig:
        raise ConfigError("a collective failed in a one-worker job: there is no launcher to recover with")

    def report_failure(self) -> None:
        return None

    def peers_gave_up(self, idle_seconds: float) -> bool:
        return False

    def close(self) -> None:
        return None


class ElasticMembership(_PeerMembership):
    """A worker of a job started by ``taiji run`` (see module doc)."""

    def __init__(self, peer: Peer, watch_store: JobStore | None = None):
        super().__init__(peer)
        self._newest = peer.version
        self._doom_checked = (peer.version, peer.version)  # (our version, newest looked at for lost members)
        self._closed = threading.Event()
        self._given_store = watch_store
        self._watcher: threading.Thread | None = None  # started by the first question it answers
        self._moved = threading.Condition()  # notified by the watcher when ``_newest`` moves
        self._newest_config: ClusterConfig | None = None  # read by the watcher
        self._considered = peer.version  # the newest version the watcher has looked at (``_consider``)
        self._report_lock = threading.Lock()  # failure reports, one at a time, on their own connection
        self._report_store: JobStore | None = None

    def _start_watching(self) -> None:
        # the watcher blocks in store waits: on its own connection, so the training thread's
        # store calls never queue behind it
        self._watch_store = self._given_store or self.peer.job_store.another_connection()
        self._watcher = threading.Thread(target=self._watch, name="taiji-config-watch", daemon=True)
        _watching.add(self)
        self._watcher.start()

    def _watch(self) -> None:
        store = self._watch_store
        with self._report_lock:  # the failure reports' connection, made now rather than at a failure
            self._connect_reporter()
        pause, polled = min(WATCH_POLL_S * 4, max(WATCH_POLL_S, store.poll_interval)), 0.0
        while not self._closed.wait(0 if store.can_watch else STUCK_POLL_S):
            try:
                if (
                    store.can_watch
                ):  # etcd: a stream of the configs themselves, no polling and no read per change
                    for config in store.follow_configs(self._closed):
                        self._saw(config.version, config)  # the training thread may be waiting for it
                        self._consider(store)  # (the config just carried is not read again)
                    continue
                comm = self.peer.comm
                if time.monotonic() - polled < pause and (comm is None or comm.waiting_for() < STUCK_AFTER_S):
                    continue
                polled = time.monotonic()
                following = max(self._newest, self.peer.version) + 1
                if store.has(config_key(following)):
                    newest = max(following, store.latest_version())
                    self._saw(newest, store.read_config(newest))
                self._consider(store)
            except StoreError:
                # the launcher is gone or restarting: the training thread finds out itself
                self._closed.wait(pause)

    def _saw(self, version: int, config: ClusterConfig | None = None) -> None:
        with self._moved:
            if version > self._newest:
                self._newest, self._newest_config = version, config
                self._moved.notify_all()

    def _consider(self, store: JobStore) -> None:
        """Look at the versions newer than ours not looked at yet. One that dropped members of ours
        as lost means our version's collectives can never complete: abandon them now (comm.abandon)
        rather than at gloo's timeout. Else the newest, a planned change, has its groups built ahead
        (Peer.prepare: runtime/ahead.py); only then is it the newest to move to (``newest_version``)."""
        newest, comm, config = self._newest, self.peer.comm, self.peer.config
        if comm is not None and config is not None and comm.version == config.version and not comm.abandoned:
            ours, looked = self._doom_checked
            start, lost = (looked + 1 if ours == config.version else config.version + 1), ()
            for version in range(start, newest + 1):
                known = self._newest_config
                read = known if known is not None and known.version == version else store.read_config(version)
                lost = read.dooms(config.ids)
                if lost:
                    comm.abandon(f"cluster v{version} dropped lost worker(s) {', '.join(lost)}")
                    break
            if not lost and start <= newest and self._newest_config is not None:
                self.peer.prepare(self._newest_config)
            self._doom_checked = (config.version, max(newest, start - 1))
        self._considered = newest

    def newest_version(self) -> int:
        """The newest version to move to at the next step boundary: the newest the watcher looked
        at, once the groups it builds ahead for it are built (until then, ours)."""
        self.watch()
        version, ours = self._considered, self.peer.version
        return ours if version > ours and not self.peer.prepared(version) else max(version, ours)

    def watch(self) -> None:
        """Start following the published configs (idempotent). Every worker watches (not only the
        lead, whose control row tells the others of a resize): a worker stuck in a collective of a
        version that lost a member learns it from the watcher."""
        if self._watcher is None and not self._closed.is_set():
            self._start_watching()

    def read_config(self, version: int) -> ClusterConfig:
        return self._store.read_config(version)

    def join(self, timeout: float) -> ClusterConfig:
        """A joiner: say ready, then wait until a published config includes this worker; that config."""
        store, peer = self._store, self.peer
        store.mark_ready(peer.worker_id)
        version = max(store.latest_version(), 1)
        deadline = time.monotonic() + timeout
        while True:
            store.wait_for_version(version, max(deadline - time.monotonic(), 0.001))
            config = store.read_config(version)
            if config.rank_of(peer.worker_id) is not None:
                return config
            version += 1

    def wait_for_newer(self, timeout: float) -> ClusterConfig:
        """Block until a config newer than ours is published; return the latest one. Where the
        store can watch (etcd), the watcher's stream tells at once; else a store wait (TCPStore's
        is answered by the server when the key appears)."""
        store, peer = self._store, self.peer
        self.watch()
        try:
            if store.can_watch:
                with self._moved:
                    if not self._moved.wait_for(lambda: self._newest > peer.version, timeout):
                        raise StoreError(f"config v{peer.version + 1} not published")
                    newest, config = self._newest, self._newest_config
                # the watcher carries each config as `latest` moves to it
                return (
                    config if config is not None and config.version == newest else store.read_config(newest)
                )
            store.wait_for_version(peer.version + 1, timeout)
        except StoreError as exc:
            raise StoreError(
                f"[rank {peer.rank} v={peer.version}] worker {peer.worker_id}: no new cluster "
                f"config within {timeout:g}s after a failure ({exc}). Is the launcher alive?"
            ) from exc
        # `config/v{N+1}` is written before `latest` moves: never read back an older version
        return store.read_config(max(store.latest_version(), peer.version + 1))

    def report_failure(self) -> None:
        """Tell the launcher that a collective of our version failed here — unless a newer version
        is known already (the launcher has moved on without it). Sent by a thread of its own, on a
        connection of its own: waiting for the next config does not wait for the report's round
        trips (five on etcd), and the launcher, if it needs the report, gets it as soon."""
        version = self.peer.version
        self.watch()
        if self._newest > version:
            return
        threading.Thread(
            target=self._send_report, args=(version, self.peer.step), name="taiji-failure-report", daemon=True
        ).start()

    def _send_report(self, version: int, step: int) -> None:
        with self._report_lock:
            store = self._connect_reporter()
            try:
                if store is None:
                    raise StoreError("no connection to the job store")
                store.report_failure(version, self.peer.worker_id, step)
            except StoreError as exc:  # the wait for the next config tells the training thread
                log.warning("could not report the failure of cluster v%d: %s", version, exc)

    def _connect_reporter(self) -> JobStore | None:
        """(Under ``_report_lock``.) On etcd a new connection authenticates, which costs etcd
        tens of ms of CPU (bcrypt; far more on a loaded host): not while a failure is handled."""
        if self._report_store is None:
            try:
                self._report_store = self._store.another_connection()
            except StoreError as exc:
                log.warning("no connection for failure reports yet: %s", exc)
        return self._report_store

    def peers_gave_up(self, idle_seconds: float) -> bool:
        """After ``idle_seconds`` in user code (an evaluation on this rank alone): did a peer's
        collective time out on this version meanwhile? Then this worker's next collective would
        only time out too. One store round trip, asked only after a gap a peer could time out in."""
        if idle_seconds < self.peer.options.timeout / 2:
            return False
        try:
            return self._store.failures_reported(self.peer.version)
        except StoreError:
            return False  # the next collective tells

    def close(self) -> None:
        self._closed.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            # a thread still inside a store call while the interpreter exits aborts the process
            # (an etcd watch notices the stop only when its stream is reopened: not waited for, it is a
            # daemon thread in pure-Python socket code, which an exiting interpreter leaves alone)
            watcher.join(WATCH_POLL_S * 5)
        _watching.discard(self)


_watching: weakref.WeakSet[ElasticMembership] = weakref.WeakSet()


@atexit.register
def _stop_watchers() -> None:
    for membership in list(_watching):
        membership.close()


def membership_for(peer: Peer) -> Membership:
    if peer.elastic:
        return ElasticMembership(peer)
    return SoloMembership(peer)
