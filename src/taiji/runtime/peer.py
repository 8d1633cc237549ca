"""This worker's view of the job: its id, the current cluster version, and the
communicator of that version. ``taiji.init()`` creates the one default Peer."""
from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import threading
from dataclasses import dataclass

import torch.distributed as dist

from .. import env
from ..cluster import spec
from ..cluster.store import JobStore, connect_store
from ..comm.communicator import CommOptions, Communicator
from ..errors import ConfigError, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerOptions:
    timeout: float = 60.0
    debug_collectives: bool = False

    @staticmethod
    def from_env() -> "PeerOptions":
        return PeerOptions(timeout=env.TIMEOUT.get(), debug_collectives=env.DEBUG_COLLECTIVES.get())


class Peer:
    """A worker: membership of the current cluster version and its communicator."""

    def __init__(self, raw_store: dist.Store, job_store: JobStore | None, worker_id: str,
                 config: spec.ClusterConfig, options: PeerOptions = PeerOptions()):
        rank = config.rank_of(worker_id)
        if rank is None:
            raise ConfigError(f"worker {worker_id} is not a member of cluster v{config.version} "
                              f"(members: {list(config.ids)})")
        self.raw_store = raw_store
        self.job_store = job_store
        self.worker_id = worker_id
        self.config = config
        self.options = options
        self.step = 0  # maintained by the training loop, for log prefixes
        job_prefix = dist.PrefixStore(f"taiji/{job_store.job_id}" if job_store else "taiji/solo", raw_store)
        self._comm_store = job_prefix
        host = config.workers[rank].host
        self.comm = Communicator(job_prefix, rank, config.size, config.version,
                                 CommOptions(timeout=options.timeout, debug=options.debug_collectives,
                                             host=host))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def version(self) -> int:
        return self.comm.version

    @property
    def job_id(self) -> str:
        return self.job_store.job_id if self.job_store else "solo"

    def close(self) -> None:
        self.comm.close()

    @staticmethod
    def solo(options: PeerOptions = PeerOptions()) -> "Peer":
        """A one-worker job with no launcher: the same code path, no network."""
        config = spec.initial([spec.WorkerSpec("solo")])
        return Peer(dist.HashStore(), None, "solo", config, options)

    @staticmethod
    def from_env(options: PeerOptions | None = None) -> "Peer":
        """Join the job whose store and identity the launcher put in the environment."""
        options = options or PeerOptions.from_env()
        job_id, worker_id = env.JOB_ID.get(), env.WORKER_ID.get()
        if not job_id or not worker_id:
            raise ConfigError(f"{env.STORE_PORT.name} is set but {env.JOB_ID.name} or "
                              f"{env.WORKER_ID.name} is missing; start workers with `taiji run`.")
        raw = connect_store(env.STORE_HOST.get(), env.STORE_PORT.get(), options.timeout)
        job_store = JobStore(raw, job_id)
        try:
            config = job_store.read_config()
        except StoreError as exc:
            raise StoreError(f"worker {worker_id}: cannot read the cluster config of job {job_id}: {exc}") from exc
        return Peer(raw, job_store, worker_id, config, options)


_default: Peer | None = None
_default_lock = threading.Lock()


def current_peer() -> Peer | None:
    return _default


def default_peer() -> Peer:
    """The Peer of ``taiji.init()``; initialises a one-worker job if init() was not called."""
    return _default if _default is not None else init()


def _exit_with_own_children() -> None:
    # the launcher starts each worker as the leader of its own process group: take the
    # worker's children (data-loader processes, ...) down with it
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def _watch_launcher(pid: int) -> None:
    """Exit this worker (and its children) when the launcher dies: nothing outlives its job."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    if fd is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _exit_with_own_children()
        return  # no pidfd support: rely on the launcher's parent-death signal

    def wait() -> None:
        select.select([fd], [], [])
        log.error("the launcher (pid %d) died; this worker exits so that nothing is orphaned", pid)
        _exit_with_own_children()
    threading.Thread(target=wait, name="taiji-launcher-watch", daemon=True).start()


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
                _watch_launcher(launcher)
            _default = Peer.from_env(options)
        else:
            _default = Peer.solo(options or PeerOptions.from_env())
        # gloo's threads must be stopped before interpreter teardown destroys the groups,
        # or the process can abort at exit ("terminate called without an active exception")
        atexit.register(shutdown)
        log.debug("joined job %s as worker %s: rank %d of %d, v%d", _default.job_id,
                  _default.worker_id, _default.rank, _default.size, _default.version)
        return _default


def shutdown() -> None:
    """Release the default Peer's process groups (optional; exiting does it too)."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
