"""taiji: adaptive, elastic distributed training on PyTorch."""
from __future__ import annotations

from .comm.communicator import Communicator, Handle
from .data.datasets import load_fashion_mnist, load_idx_classification
from .data.sampler import ElasticSampler, SamplerState
from .errors import (CollectiveTimeout, CommError, ConfigError, ConsensusError, LaunchError,
                     MismatchError, PeerLost, StoreError, TaijiError)
from .log import configure_logging
from .policies import Context, Policy, PolicyError, Resize, ScaleLR, SetBatchSize, SetStrategy, Stop
from .runtime.job import Job, Step
from .runtime.peer import Peer, init, shutdown
from .runtime.peer import default_peer as peer
from .strategies.base import Strategy
from .strategies.model_averaging import ModelAveraging
from .strategies.sync_sgd import SyncSGD

__version__ = "0.1.0"


def rank() -> int:
    """This worker's rank in the current cluster version (0 = oldest worker)."""
    return peer().rank


def size() -> int:
    """Number of workers in the current cluster version."""
    return peer().size


def version() -> int:
    """The current cluster version (grows by one with every membership change)."""
    return peer().version


def resize(n: int) -> None:
    """Ask the launcher for ``n`` workers; returns at once. The change lands at a later step
    boundary of every worker's Job loop (``taiji.version()`` moves); joiners boot while the
    others keep training. Above --max-np it is clamped, below --min-np refused (both logged)."""
    peer().propose_size(n)


def allreduce(tensor, op: str = "sum", *, async_op: bool = False):
    """Reduce ``tensor`` in place over the current cluster (sum, avg, min, max)."""
    return peer().comm.allreduce(tensor, op, channel="grad", async_op=async_op)


def broadcast(tensor, src: int = 0, *, async_op: bool = False):
    return peer().comm.broadcast(tensor, src, async_op=async_op)


def allgather(tensor, *, async_op: bool = False):
    return peer().comm.allgather(tensor, async_op=async_op)


def barrier() -> None:
    peer().comm.barrier()


__all__ = [
    "CollectiveTimeout", "CommError", "Communicator", "ConfigError", "ConsensusError",
    "ElasticSampler", "Handle", "Job", "LaunchError", "MismatchError", "Peer", "PeerLost",
    "SamplerState", "Step", "Context", "Policy", "PolicyError", "Resize", "ScaleLR", "SetBatchSize", "SetStrategy", "Stop", "StoreError", "Strategy", "SyncSGD", "ModelAveraging", "TaijiError", "allgather",
    "allreduce", "barrier", "resize", "broadcast", "configure_logging", "init", "load_fashion_mnist",
    "load_idx_classification", "peer", "rank", "shutdown", "size", "version",
]
