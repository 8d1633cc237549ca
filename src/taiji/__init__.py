"""taiji: adaptive, elastic distributed training on PyTorch.

The top level holds the user's API; the rest lives in ``taiji.policies``, ``taiji.errors``,
``taiji.data``, ``taiji.strategies``, ``taiji.monitor`` and ``taiji.comm``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .errors import TaijiError

if TYPE_CHECKING:
    from .checkpoint.config import Checkpoint
    from .checkpoint.reader import load_checkpoint
    from .policies.base import Context
    from .runtime.job import Job
    from .runtime.optimizer import Optimizer
    from .runtime.options import DataOptions, FaultOptions, MonitorOptions, SyncOptions
    from .runtime.peer import init, shutdown
    from .runtime.step import Step
    from .strategies.base import Strategy
    from .strategies.local_sgd import LocalSGD
    from .strategies.model_averaging import ModelAveraging
    from .strategies.pair_averaging import PairAveraging
    from .strategies.sync_sgd import SyncSGD

# The API is imported on first use: `taiji status`, `taiji ls` and `taiji resize` import this
# package too and must answer in well under a second, without loading torch.
_LAZY = {
    "Job": "runtime.job",
    "Optimizer": "runtime.optimizer",
    "init": "runtime.peer",
    "shutdown": "runtime.peer",
    "Step": "runtime.step",
    "Strategy": "strategies.base",
    "ModelAveraging": "strategies.model_averaging",
    "PairAveraging": "strategies.pair_averaging",
    "SyncSGD": "strategies.sync_sgd",
    "LocalSGD": "strategies.local_sgd",
    "Checkpoint": "checkpoint.config",
    "load_checkpoint": "checkpoint.reader",
    "DataOptions": "runtime.options",
    "MonitorOptions": "runtime.options",
    "FaultOptions": "runtime.options",
    "SyncOptions": "runtime.options",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'taiji' has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)  # taiji.policies, taiji.data, ...
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def _default_peer():  # noqa: ANN202
    from .runtime.peer import default_peer

    return default_peer()


__version__ = "0.1.0"


def rank() -> int:
    """This worker's rank in the current cluster version (0 = oldest worker)."""
    return _default_peer().rank


def size() -> int:
    """Number of workers in the current cluster version."""
    return _default_peer().size


def version() -> int:
    """The current cluster version (grows by one with every membership change)."""
    return _default_peer().version


def context() -> Context | None:
    """The agreed Context of the running Job's last step boundary (read-only), or None
    outside a Job's loop."""
    return _default_peer().context()


def resize(n: int) -> None:
    """Ask the launcher for ``n`` workers; returns at once. The change lands at a later step
    boundary of every worker's Job loop (``taiji.version()`` moves); joiners boot while the
    others keep training. Above --max-np it is clamped, below --min-np refused (both logged)."""
    _default_peer().propose_size(n)


# user collectives travel on their own channel: never queued behind (or mixed up with)
# the training's gradient and control traffic


def allreduce(tensor, op: str = "sum", *, async_op: bool = False):
    """Reduce ``tensor`` in place over the current cluster (sum, avg, min, max)."""
    return _default_peer().comm.allreduce(tensor, op, channel="user", async_op=async_op)


def broadcast(tensor, src: int = 0, *, async_op: bool = False):
    """Overwrite ``tensor`` with rank ``src``'s."""
    return _default_peer().comm.broadcast(tensor, src, channel="user", async_op=async_op)


def allgather(tensor, *, async_op: bool = False):
    """Every worker's ``tensor``, in rank order."""
    return _default_peer().comm.allgather(tensor, channel="user", async_op=async_op)


def barrier() -> None:
    """Wait until every worker of the current cluster reached this call."""
    _default_peer().comm.barrier(channel="user")


__all__ = [
    "Checkpoint",
    "DataOptions",
    "FaultOptions",
    "Job",
    "LocalSGD",
    "ModelAveraging",
    "MonitorOptions",
    "Optimizer",
    "PairAveraging",
    "Step",
    "Strategy",
    "SyncOptions",
    "SyncSGD",
    "TaijiError",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "context",
    "init",
    "load_checkpoint",
    "rank",
    "resize",
    "shutdown",
    "size",
    "version",
]
