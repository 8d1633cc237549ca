"""Every TAIJI_* environment variable: its name, default and typed accessor.

The launcher writes these into each worker's environment; workers read them only
through this module, so the contract between the two lives in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {raw!r}")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    parse: Callable[[str], T]
    help: str

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        source = os.environ if environ is None else environ
        raw = source.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"environment variable {self.name}={raw!r} is invalid: {exc}") from None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        source = os.environ if environ is None else environ
        return bool(source.get(self.name))


JOB_ID = EnvVar("TAIJI_JOB_ID", "", str, "id of the job this worker belongs to")
WORKER_ID = EnvVar("TAIJI_WORKER_ID", "", str, "stable id of this worker across cluster versions")
STORE_HOST = EnvVar("TAIJI_STORE_HOST", "127.0.0.1", str, "host of the job's TCPStore")
STORE_PORT = EnvVar("TAIJI_STORE_PORT", 0, int, "port of the job's TCPStore; 0 = not launched by taiji")
STORE_URL = EnvVar(
    "TAIJI_STORE_URL",
    "",
    str,
    "the job store as a URL (etcd:// or, with TLS, etcds://HOST:PORT,...); "
    "empty: the TCPStore at STORE_HOST:STORE_PORT",
)
ETCD_CA = EnvVar(
    "TAIJI_ETCD_CA",
    "",
    str,
    "CA bundle that signs the etcd servers' certificates (etcds:// stores; default: the system's)",
)
ETCD_CERT = EnvVar("TAIJI_ETCD_CERT", "", str, "client certificate for an etcds:// store that asks for one")
ETCD_KEY = EnvVar("TAIJI_ETCD_KEY", "", str, "the key of TAIJI_ETCD_CERT")
SECRET = EnvVar("TAIJI_SECRET", "", str, "job secret authenticating control and peer traffic")
LAUNCHER_PID = EnvVar("TAIJI_LAUNCHER_PID", 0, int, "pid of the launcher; workers exit when it dies")
TIMEOUT = EnvVar("TAIJI_TIMEOUT", 60.0, float, "seconds any collective or store wait may take")
TOPOLOGY = EnvVar(
    "TAIJI_TOPOLOGY",
    "ring",
    str,
    "how gradients are allreduced: ring, tree, star or hierarchical (`taiji run --topology`)",
)


def _cuda_backend(raw: str) -> str:
    if raw not in ("nccl", "gloo"):
        raise ValueError("expected nccl (one GPU per worker) or gloo (workers sharing a GPU)")
    return raw


CUDA_BACKEND = EnvVar(
    "TAIJI_CUDA_BACKEND",
    "nccl",
    _cuda_backend,
    "process groups for CUDA tensors: nccl (one GPU per worker) or gloo (workers sharing "
    "a GPU; `taiji run --cuda-backend`)",
)
BUCKET_MB = EnvVar("TAIJI_BUCKET_MB", 25.0, float, "SyncSGD gradient bucket size in MB")
CONTROL_COMPACT_AT = EnvVar(
    "TAIJI_CONTROL_COMPACT_AT",
    0,
    int,
    "from this many workers on, the step's control message travels compact: a sum-"
    "allreduce of the sums plus a slot per worker (monitor/compact.py); 0: never, the default (on "
    "loopback gloo at 2-32 workers the allgather costs less: benchmarks/control_message.py)",
)
DEBUG_COLLECTIVES = EnvVar(
    "TAIJI_DEBUG_COLLECTIVES",
    False,
    _parse_bool,
    "check shapes and dtypes across ranks before each collective and name mismatching ranks",
)
LOG_LEVEL = EnvVar("TAIJI_LOG_LEVEL", "", str, "level for the 'taiji' logger set up by taiji.init()")
RUN_DIR = EnvVar("TAIJI_RUN_DIR", "", str, "directory for this job's logs and metrics")
FAULTS = EnvVar(
    "TAIJI_FAULTS",
    "",
    str,
    'JSON list of injected faults, e.g. [{"action": "kill", "rank": 1, "step": 5, '
    '"phase": "allreduce"}] (tests only)',
)
HOME = EnvVar("TAIJI_HOME", "", str, "where `taiji run` registers running jobs (default ~/.taiji)")
RECOVERY_TIMEOUT = EnvVar(
    "TAIJI_RECOVERY_TIMEOUT", 120.0, float, "seconds a worker waits for a new cluster config after a failure"
)
HEARTBEAT = EnvVar(
    "TAIJI_HEARTBEAT", 0.25, float, "seconds between a worker's liveness heartbeats to the launcher (0: none)"
)
BEAT_DIR = EnvVar(
    "TAIJI_BEAT_DIR",
    "",
    str,
    "where a worker's heartbeat file goes: its host's launcher or agent reads it (set by them)",
)
GLOO_SOCKET_IFNAME = EnvVar(
    "GLOO_SOCKET_IFNAME",
    "",
    str,
    "network interface gloo's groups use (taiji honours it; default: the advertised host)",
)
TORCH_CPP_LOG_LEVEL = EnvVar(
    "TORCH_CPP_LOG_LEVEL",
    "",
    str,
    "torch's C++ log level; taiji's commands quiet it for themselves (they say "
    "what failed in one line), never for the workers they start",
)
MALLOC_TUNING = EnvVar(
    "TAIJI_MALLOC_TUNING",
    True,
    _parse_bool,
    "keep freed CPU memory mapped between steps (glibc malloc thresholds; runtime/allocator.py)",
)
MIN_NP = EnvVar("TAIJI_MIN_NP", 1, int, "the launcher's --min-np (policies clamp Resize to it)")
MAX_NP = EnvVar("TAIJI_MAX_NP", 0, int, "the launcher's --max-np; 0 = unknown (not launched by taiji)")
CHECKPOINT_DIR = EnvVar(
    "TAIJI_CHECKPOINT_DIR",
    "",
    str,
    "`taiji run --checkpoint-dir`: where a Job without its own taiji.Checkpoint checkpoints",
)
CHECKPOINT_EVERY = EnvVar(
    "TAIJI_CHECKPOINT_EVERY", "", str, "`taiji run --checkpoint-every`: a duration (10m) or a number of steps"
)
RESUME = EnvVar(
    "TAIJI_RESUME", "", str, "`taiji run --resume`: auto (the latest complete checkpoint) or a path"
)

SLURM_DIR = EnvVar(
    "TAIJI_SLURM_DIR",
    "",
    str,
    "`--slurm`: the directory all nodes share where the launcher leaves the job's address and "
    "secret for the other tasks (default: $SLURM_SUBMIT_DIR)",
)
# Slurm's own: inside a Slurm job, Slurm signals every process of a step (scancel --signal, a
# time limit's --signal, preemption); launch/slurm.py reads the rest of the allocation
SLURM_JOB_ID = EnvVar("SLURM_JOB_ID", "", str, "set by Slurm in its jobs' processes")

# the torchrun contract the launcher also writes; a joiner reads its provisional rank from it
RANK = EnvVar("RANK", 0, int, "torchrun-compatible rank (provisional for a joiner)")
WORLD_SIZE = EnvVar("WORLD_SIZE", 1, int, "torchrun-compatible world size (provisional for a joiner)")

# Ray's own variable: the cluster `taiji run --ray` (no ADDRESS) connects to; unset: the one on this machine
RAY_ADDRESS = EnvVar("RAY_ADDRESS", "", str, "the Ray cluster (HOST:PORT) `taiji run --ray` uses by default")
RAY_RAYLET_PID = EnvVar(
    "RAY_RAYLET_PID",
    0,
    int,
    "set by Ray in its workers: the node's raylet, which the "
    "job's actor watches (its death ends the node's agent and workers at once)",
)
RAY_DEDUP_LOGS = EnvVar(
    "RAY_DEDUP_LOGS",
    True,
    _parse_bool,
    "Ray folds like lines from many nodes into one; `taiji run --ray` turns it off unless set",
)

ALL: tuple[EnvVar, ...] = (
    JOB_ID,
    WORKER_ID,
    STORE_HOST,
    STORE_PORT,
    STORE_URL,
    ETCD_CA,
    ETCD_CERT,
    ETCD_KEY,
    SECRET,
    LAUNCHER_PID,
    TIMEOUT,
    TOPOLOGY,
    BUCKET_MB,
    DEBUG_COLLECTIVES,
    LOG_LEVEL,
    RUN_DIR,
    FAULTS,
    RECOVERY_TIMEOUT,
    HEARTBEAT,
    BEAT_DIR,
    GLOO_SOCKET_IFNAME,
    HOME,
    MIN_NP,
    MAX_NP,
    MALLOC_TUNING,
    TORCH_CPP_LOG_LEVEL,
    CHECKPOINT_DIR,
    CHECKPOINT_EVERY,
    RESUME,
    SLURM_DIR,
    CONTROL_COMPACT_AT,
)

_quieted_cpp_logs = False


def quiet_cpp_logs() -> None:
    """A taiji command (not a worker), before torch loads: no C++ log lines and stack frames from
    its store connections; it reports what failed itself. A level the user set is kept."""
    global _quieted_cpp_logs
    if not TORCH_CPP_LOG_LEVEL.is_set():
        os.environ[TORCH_CPP_LOG_LEVEL.name] = "FATAL"
        _quieted_cpp_logs = True


def for_children(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` (a copy of this process's) as the user had it: what ``quiet_cpp_logs`` set is
    not passed on to the workers."""
    if _quieted_cpp_logs:
        environ.pop(TORCH_CPP_LOG_LEVEL.name, None)
    return environ
