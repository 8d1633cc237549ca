"""The contract between a host's launcher (or agent) and the workers it starts: their environment.

``WorkerSettings`` is what every worker of a job shares, whatever its host; the launcher
publishes it (signed, without the secret) for agents, which start their workers with the same
settings. ``worker_env`` adds one worker's identity, rank and host.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from .. import env

if TYPE_CHECKING:
    from ..cluster.controller import ControllerState
    from .supervisor import Supervisor


@dataclass(frozen=True)
class WorkerSettings:
    job_id: str
    store_host: str
    store_port: int
    command: tuple[str, ...]
    store_url: str = ""  # etcd://...: the job store is etcd (else the TCPStore at host:port)
    interpreter: str = ""  # the launcher's Python: an agent runs its own in its place
    timeout: float = env.TIMEOUT.default
    heartbeat: float = env.HEARTBEAT.default
    recovery_timeout: float = env.RECOVERY_TIMEOUT.default
    min_np: int = 1
    max_np: int = 1
    run_dir: str = ""
    debug_collectives: bool = False
    topology: str = "ring"  # the grad channel's allreduce plan (comm/topology.py)
    cuda_backend: str = "nccl"  # process groups for CUDA tensors (gloo: workers sharing a GPU)
    checkpoint_dir: str = ""  # every Job's default checkpoints (`--checkpoint-dir`, `--checkpoint-every`)
    checkpoint_every: str = ""
    resume: str = ""  # auto | a checkpoint's path (`--resume`)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> WorkerSettings:
        known = {f.name for f in fields(WorkerSettings)}
        values = {k: v for k, v in data.items() if k in known}
        values["command"] = tuple(values.get("command", ()))
        return WorkerSettings(**values)

    def command_here(self) -> tuple[str, ...]:
        """The worker command as this host runs it: the launcher's interpreter replaced by ours
        (another host's Python may live elsewhere)."""
        if self.command and self.interpreter and self.command[0] == self.interpreter:
            return (sys.executable,) + self.command[1:]
        return self.command


def worker_env(
    settings: WorkerSettings,
    secret: bytes,
    worker_id: str,
    rank: int,
    size: int,
    *,
    host: str,
    local_rank: int,
    local_size: int,
    host_rank: int = 0,
) -> dict[str, str]:
    """The environment of worker ``worker_id``, started on ``host`` by this process (whose death
    the worker watches)."""
    environ = env.for_children(dict(os.environ))
    environ.update(
        {
            env.JOB_ID.name: settings.job_id,
            env.WORKER_ID.name: worker_id,
            env.STORE_HOST.name: settings.store_host,
            env.STORE_PORT.name: str(settings.store_port),
            env.STORE_URL.name: settings.store_url,
            env.SECRET.name: secret.hex(),
            env.LAUNCHER_PID.name: str(os.getpid()),
            env.TIMEOUT.name: str(settings.timeout),
            env.HEARTBEAT.name: str(settings.heartbeat),
            env.RECOVERY_TIMEOUT.name: str(settings.recovery_timeout),
            env.MIN_NP.name: str(settings.min_np),
            env.MAX_NP.name: str(settings.max_np),
            env.RUN_DIR.name: settings.run_dir,
            env.TOPOLOGY.name: settings.topology,
            env.CUDA_BACKEND.name: settings.cuda_backend,
            env.CHECKPOINT_DIR.name: settings.checkpoint_dir,
            env.CHECKPOINT_EVERY.name: settings.checkpoint_every,
            env.RESUME.name: settings.resume,
            # the torchrun contract, for scripts that read it
            "RANK": str(rank),
            "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size),
            "GROUP_RANK": str(host_rank),
            "MASTER_ADDR": settings.store_host,
            "MASTER_PORT": str(settings.store_port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # env:// init joins our store instead of hosting one
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.debug_collectives:
        environ[env.DEBUG_COLLECTIVES.name] = "1"
    if "OMP_NUM_THREADS" not in os.environ:  # a host's workers must not oversubscribe its cores
        environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(local_size, 1)))
    return environ


def local_start(
    settings: WorkerSettings,
    secret: bytes,
    worker_id: str,
    rank: int,
    size: int,
    *,
    host: str,
    slots: int,
    local_rank: int,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The command and environment of a worker this process starts on its own host (``slots``:
    that host's)."""
    return settings.command_here(), worker_env(
        settings, secret, worker_id, rank, size, host=host, local_rank=local_rank, local_size=min(slots, size)
    )


# What describes the launcher's host, session or software layout rather than the job: not carried to
# another host's workers (each host has its own), and taiji's and Ray's own variables, which each
# host sets for itself. Everything else in the launcher's environment is (`forwarded_environment`).
NOT_FORWARDED = frozenset(
    {
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "DISPLAY",
        "XAUTHORITY",
        "MAIL",
        "TMPDIR",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOW",
        "LS_COLORS",
        "PS1",
        "DBUS_SESSION_BUS_ADDRESS",
        "PATH",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "VIRTUAL_ENV",
        "PYTHONHOME",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
    }
)
NOT_FORWARDED_PREFIXES = ("TAIJI_", "RAY_", "SLURM_", "SSH_", "XDG_", "CONDA_")


def forwarded_environment(environ: dict[str, str]) -> dict[str, str]:
    """The part of the launcher's ``environ`` that another host's workers get (`taiji run --ray`):
    what the user exported for the job, as srun's default ``--export=ALL`` carries it to every
    task, less ``NOT_FORWARDED`` (the launcher's host, session and paths; the devices Ray assigns)
    and ``NOT_FORWARDED_PREFIXES`` (taiji's, Ray's, Slurm's and the shell's own)."""
    return {
        name: value
        for name, value in env.for_children(dict(environ)).items()
        if name not in NOT_FORWARDED and not name.startswith(NOT_FORWARDED_PREFIXES)
    }


@dataclass(frozen=True)
class StartedAhead:
    """What `taiji run` made before it imported torch (launch/run.py): the store's bound socket,
    the job's secret, the supervisor holding the first workers it started ahead, and the
    controller's first state those workers were started from."""

    listener: socket.socket
    secret: bytes
    sup: Supervisor
    state: ControllerState
