"""What `taiji run` was asked for: parsed options, with no I/O (the CLI builds it, the launcher reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import env
from ..cluster import controller as ctl


@dataclass(frozen=True)
class CheckpointFlags:
    directory: str = ""  # --checkpoint-dir (absolute, or a URL)
    every: str = ""  # --checkpoint-every
    resume: str = ""  # --resume: "", "auto" or a path
    grace: float = 60.0  # --checkpoint-grace: SIGTERM -> final checkpoint -> exit, at most


@dataclass(frozen=True)
class RunConfig:
    nproc: int
    command: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 0
    timeout: float = 60.0
    grace: float = 5.0
    job_id: str = ""
    debug_collectives: bool = False
    topology: str = "ring"
    cuda_backend: str = "nccl"  # process groups for CUDA tensors: nccl | gloo (workers sharing a GPU)
    run_dir: str = ""
    min_np: int = 0
    max_np: int = 0
    replace: bool = False
    join_timeout: float = 120.0
    max_failures: int = 3
    liveness_timeout: float = 5.0
    busy_timeout: float = 600.0
    nproc_per_node: int = 0  # this host's slots when other hosts may join; 0: one host
    store: str = "tcp"  # tcp | etcd | etcd://HOST:PORT[,HOST:PORT...]
    min_hosts: int = 1  # --nnodes MIN: hosts joined before the start
    max_hosts: int = 0  # --nnodes MAX: hosts at most (0: no limit)
    grow_on_join: bool = True  # grow onto a joining host's slots (off: only resizes place workers there)
    secret: bytes | None = None  # the job's secret (--secret-file); None: a new one
    checkpoint: CheckpointFlags = field(default_factory=CheckpointFlags)  # --checkpoint-*, --resume
    hosts_from: str = ""  # who starts the other hosts' agents: "" (`taiji join` by hand), "ray", "slurm"


@dataclass(frozen=True)
class JoinConfig:
    """What `taiji join` was asked for: the job to join and what this host offers."""

    job_id: str
    store_url: str  # tcp://HOST:PORT (the launcher's TCPStore) or etcd://HOST:PORT[,...]
    secret: bytes
    slots: int
    host: str
    timeout: float = 30.0
    grace: float = 5.0
    job_notice: bool = (
        False  # SIGTERM reaches the launcher too (one Slurm allocation): it stops the job, not us
    )


def heartbeat_interval(liveness_timeout: float) -> float:
    """Beat often enough that a stale heartbeat is told from a late one well within the timeout."""
    return max(min(env.HEARTBEAT.default, liveness_timeout / 8), 0.05)


@dataclass(frozen=True)
class DriverConfig:
    """What the controller's loop of one job (launch/driver.py) is configured with."""

    job_id: str
    nproc: int
    bounds: ctl.Bounds
    host: str = "127.0.0.1"
    port: int = 0
    timeout: float = 60.0
    grace: float = 5.0
    slots: int = 0  # workers this host takes; 0: up to max_np (one host)
    store: str = "tcp"  # tcp (hosted here) | etcd (a server started here) | etcd://HOST:PORT,... (the user's)
    min_hosts: int = 1  # hosts (this one included) that must have joined before the job starts
    secret: bytes | None = None  # the job's secret when given (a scheduler derives it); else a new one
    checkpoint: CheckpointFlags = field(default_factory=CheckpointFlags)  # the driver reads its grace
    hosts_from: str = ""  # RunConfig.hosts_from: "" when other hosts join by hand (the launcher says how)

    @property
    def output_prefix(self) -> str:
        """Before each line of a worker's output: many hosts print the host too."""
        return f"{self.host} " if self.slots else ""

    def first_state(self) -> ctl.ControllerState:
        """The controller's state before anything happened. With --nnodes the first config is
        placed once its hosts have joined (``Driver._start``); until then it holds what fits here."""
        first = min(self.nproc, self.slots) if self.min_hosts > 1 else self.nproc
        return ctl.initial_state(first, self.bounds, self.host, self.slots or None)
