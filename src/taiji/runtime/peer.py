"""This worker's view of the job: its id, the current cluster version, and the
communicator of that version. ``taiji.init()`` creates the one default Peer."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch.distributed as dist

from .. import env
from ..cluster import spec
from ..cluster.auth import secret_from_env
from ..cluster.kv import SupportsRendezvous
from ..cluster.store import JobStore, connect_job
from ..comm.communicator import CommOptions, Communicator, reap_closed_groups
from ..comm.default import set_default_provider
from ..errors import ConfigError, StoreError
from ..log import set_prefix_source
from ..policies.base import Context
from .ahead import Ahead, worth_building_ahead
from .liveness import Heartbeat, watch_launcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerOptions:
    timeout: float = 60.0
    debug_collectives: bool = False
    topology: str = "ring"  # the grad channel's allreduce plan at the start (comm/topology.py)

    @staticmethod
    def from_env() -> PeerOptions:
        return PeerOptions(env.TIMEOUT.get(), env.DEBUG_COLLECTIVES.get(), env.TOPOLOGY.get())


class Member(Protocol):
    """What the training loop's parts need of this worker's Peer: its place in the current version
    and that version's communicator. (The store conversation is ``Membership``'s.)"""

    @property
    def view(self) -> spec.ClusterView: ...
    @property
    def comm(self) -> Communicator: ...
    @property
    def joined(self) -> bool: ...
    def transition(self, config: spec.ClusterConfig) -> bool: ...
    def at_step(self, step: int) -> None: ...


class Peer:
    """A worker: membership of the current cluster version and its communicator.

    A worker spawned to grow the job starts *joining*: it is not in any published config
    yet, so ``comm`` is None and ``rank``/``size`` are the launcher's provisional values
    until ``join()`` returns. Without a launcher (``job_store`` None) the job store is an
    in-memory one: the same calls work, nobody else reads them.
    """

    def __init__(
        self,
        raw_store: dist.Store,
        job_store: JobStore | None,
        worker_id: str,
        config: spec.ClusterConfig | None,
        options: PeerOptions = PeerOptions(),
        provisional: tuple[int, int] = (0, 1),
        make_comm: type[Communicator] = Communicator,
    ):
        self.raw_store = raw_store
        self._make_comm = make_comm  # tests inject failures through a Communicator subclass
        self.elastic = job_store is not None  # a launcher (controller) can change the membership
        self.job_store = job_store if job_store is not None else JobStore(raw_store, "solo")
        self.worker_id = worker_id
        self.options = options
        self.step = 0  # for log prefixes; the training loop tells it through ``at_step``
        self._context_source: Callable[[], Context] | None = None  # the running Job's
        # (a store written in Python must outlive the C++ stores wrapping it: kept here)
        self._rendezvous = (
            raw_store.rendezvous(self._abandoned) if isinstance(raw_store, SupportsRendezvous) else raw_store
        )
        self._comm_store = self._prefixed(self._rendezvous)
        self._clones: dict[str, tuple[dist.Store, dist.Store]] = {}  # (kept, prefixed): see ``_connection``
        self._provisional = provisional
        self.config: spec.ClusterConfig | None = None
        self.comm: Communicator = None  # type: ignore[assignment]
        self._view: spec.ClusterView | None = None  # of ``config``, made when first asked
        self._ahead = Ahead(self._connections)  # newer versions' groups, built while this one trains
        if config is not None:
            if config.rank_of(worker_id) is None:
                raise ConfigError(
                    f"worker {worker_id} is not a member of cluster v{config.version} "
                    f"(members: {list(config.ids)})"
                )
            self.transition(config)

    @property
    def joined(self) -> bool:
        """A member of the current config (False while joining and after leaving)."""
        return self.comm is not None

    @property
    def left(self) -> bool:
        return self.config is not None and self.comm is None

    @property
    def rank(self) -> int:
        if self.comm is not None:
            return self.comm.rank
        return -1 if self.left else self._provisional[0]

    @property
    def size(self) -> int:
        if self.comm is not None:
            return self.comm.size
        return self.config.size if self.config is not None else self._provisional[1]

    @property
    def version(self) -> int:
        return self.config.version if self.config is not None else 0

    @property
    def job_id(self) -> str:
        return self.job_store.job_id

    def at_step(self, step: int) -> None:
        self.step = step

    def show_context(self, source: Callable[[], Context] | None) -> None:
        """The running Job says where ``taiji.context()`` reads from (None: no Job running)."""
        self._context_source = source

    def context(self) -> Context | None:
        """The running Job's agreed Context as of its last step boundary, or None."""
        return None if self._context_source is None else self._context_source()

    @property
    def view(self) -> spec.ClusterView:
        """This worker's frozen view of its current cluster version (a member only), within the
        launcher's bounds (--min-np, --max-np)."""
        if self.config is None or not self.joined:
            raise ConfigError(f"worker {self.worker_id} is not a member of a cluster version")
        if self._view is None or self._view.version != self.config.version:
            self._view = spec.ClusterView.of(
                self.config,
                self.worker_id,
                min_size=max(env.MIN_NP.get(), 1),
                max_size=env.MAX_NP.get() or None,
                elastic=self.elastic,
            )
        return self._view

    def _abandoned(self) -> str | None:
        """Why the current version's groups can no longer form (None: they can)."""
        return self.comm.abandoned if self.comm is not None else None

    def transition(self, config: spec.ClusterConfig) -> bool:
        """Switch to ``config``'s groups (same topology; built ahead if they were); False (and no
        communicator) if this worker left."""
        topology = self.options.topology if self.comm is None else self.comm.topology
        if self.comm is not None:
            self.comm.close()
        rank = config.rank_of(self.worker_id)
        self.config = config
        built = self._ahead.take(config.version)
        if rank is None:
            self.comm = None  # type: ignore[assignment]
            return False
        self.comm = built or self._communicator(config, rank, topology)
        self.comm.set_topology(topology)
        return True

    def prepare(self, config: spec.ClusterConfig) -> bool:
        """Build a newer ``config``'s groups ahead, while training goes on in the current version
        (runtime/ahead.py), on store connections of their own; False if not worth it."""
        if not worth_building_ahead(self.config if self.joined else None, config, self.worker_id):
            return False
        rank, topology = (
            config.rank_of(self.worker_id),
            self.options.topology if self.comm is None else self.comm.topology,
        )
        return self._ahead.start(config.version, lambda: self._communicator(config, rank, topology))

    def prepared(self, version: int) -> bool:
        """Whether nothing is still being built ahead for ``version``."""
        return self._ahead.ready(version)

    def _communicator(self, config: spec.ClusterConfig, rank: int, topology: str) -> Communicator:
        return self._make_comm(
            self._comm_store,
            rank,
            config.size,
            config.version,
            CommOptions(
                timeout=self.options.timeout,
                debug=self.options.debug_collectives,
                host=config.workers[rank].host,
                hosts=tuple(w.host for w in config.workers),
                topology=topology,
            ),
            side_store=self._connection("side") if config.size > 1 else None,
        )

    def _prefixed(self, store: dist.Store) -> dist.Store:
        return dist.PrefixStore(f"taiji/{self.job_store.job_id}", store)

    def _connection(self, name: str) -> dist.Store:
        """The store on a connection of its own, made once per ``name``: ``side``, where a version's
        second group meets beside its first; ``ahead<n>``, where groups built ahead meet
        (``_connections``)."""
        if name not in self._clones:  # (the clone, kept alive: a store written in Python must outlive
            self._clones[name] = (
                kept := self._rendezvous.clone(),
                self._prefixed(kept),
            )  # the C++ ones wrapping it)
        return self._clones[name][1]

    def _connections(self) -> tuple[dist.Store, dist.Store]:
        n = len(self._clones)
        return self._connection(f"ahead{n}"), self._connection(f"ahead{n}-side")

    def _store(self) -> JobStore:
        if not self.elastic:
            raise ConfigError("this worker was not started by `taiji run`: there is no cluster to change")
        return self.job_store

    def propose_size(self, size: int, source: str = "training code") -> None:
        if size < 1:
            raise ConfigError(f"cannot resize to {size} workers")
        self._store().propose(size, source)

    def close(self) -> None:
        self._ahead.close()
        if self.comm is not None:
            self.comm.close()

    @staticmethod
    def solo(options: PeerOptions = PeerOptions()) -> Peer:
        """A one-worker job with no launcher: the same code path, no network."""
        config = spec.initial([spec.WorkerSpec("solo")])
        return Peer(dist.HashStore(), None, "solo", config, options)

    @staticmethod
    def from_env(options: PeerOptions | None = None) -> Peer:
        """Join the job whose store and identity the launcher put in the environment."""
        options = options or PeerOptions.from_env()
        job_id, worker_id = env.JOB_ID.get(), env.WORKER_ID.get()
        if not job_id or not worker_id:
            raise ConfigError(
                f"{env.STORE_PORT.name} is set but {env.JOB_ID.name} or "
                f"{env.WORKER_ID.name} is missing; start workers with `taiji run`."
            )
        url = env.STORE_URL.get() or f"tcp://{env.STORE_HOST.get()}:{env.STORE_PORT.get()}"
        raw, job_store = connect_job(url, job_id, secret_from_env(), options.timeout)
        try:  # `taiji run` starts its first workers before it publishes their config: wait for it
            config = job_store.read_config(wait=options.timeout)
        except StoreError as exc:
            raise StoreError(
                f"worker {worker_id}: cannot read the cluster config of job {job_id}: {exc}"
            ) from exc
        provisional = (env.RANK.get(), env.WORLD_SIZE.get())
        member = config if config.rank_of(worker_id) is not None else None
        return Peer(raw, job_store, worker_id, member, options, provisional)


_default: Peer | None = None
_default_lock = threading.Lock()


def _log_prefix() -> str:
    peer = _default
    return "[taiji]" if peer is None else f"[rank {peer.rank} v={peer.version} step={peer.step}]"


set_default_provider(lambda: default_peer().comm)
set_prefix_source(_log_prefix)


def current_peer() -> Peer | None:
    return _default


def default_peer() -> Peer:
    """The Peer of ``taiji.init()``; initialises a one-worker job if init() was not called."""
    return _default if _default is not None else init()


def init(options: PeerOptions | None = None) -> Peer:
    """Join the job started by ``taiji run``, or become a one-worker job when run directly.

    Idempotent: a second call returns the same Peer.
    """
    global _default
    with _default_lock:
        if _default is not None:
            return _default
        if env.STORE_PORT.get():
            launcher = env.LAUNCHER_PID.get()
            if launcher:
                watch_launcher(launcher)
            _default = Peer.from_env(options)
            _start_heartbeat(_default)
        else:
            _default = Peer.solo(options or PeerOptions.from_env())
        # gloo's threads must be stopped before interpreter teardown destroys the groups,
        # or the process can abort at exit ("terminate called without an active exception")
        atexit.register(shutdown)
        log.debug(
            "joined job %s as worker %s: rank %d of %d, v%d",
            _default.job_id,
            _default.worker_id,
            _default.rank,
            _default.size,
            _default.version,
        )
        return _default


_heartbeat: Heartbeat | None = None


def _start_heartbeat(peer: Peer) -> None:
    global _heartbeat
    interval = env.HEARTBEAT.get()
    if interval > 0:
        _heartbeat = Heartbeat.on_this_host(peer.worker_id, interval)


def shutdown() -> None:
    """Release the default Peer's process groups (optional; exiting does it too)."""
    global _default, _heartbeat
    with _default_lock:
        if _heartbeat is not None:
            _heartbeat.stop()
            _heartbeat = None
        if _default is not None:
            _default.close()
            _default = None
    reap_closed_groups()
