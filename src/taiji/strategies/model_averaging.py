"""Synchronous model averaging (SMA): local SGD steps, and every k steps each replica moves a
fraction α towards the mean of all replicas.

Each worker trains on its own slice with its own gradient (no gradient allreduce). On an
averaging step, the parameters as they are at the start of the step are averaged with one
``avg`` allreduce launched in ``begin_step``, so it runs while the worker computes its forward
and backward; ``after_update`` then adds ``α·(mean(w) − w)`` to the locally updated weights:

    w ← w − lr·∇L_r(w) + α·(mean(w) − w)  =  (1 − α)·w + α·mean(w) − lr·∇L_r(w)

The mean is over the live cluster (the allreduce of the current version), so it stays right
when workers join or leave. If the allreduce fails, nothing was applied and the step is retried.
"""

from __future__ import annotations

import torch

from ..comm.communicator import Communicator, Handle
from ..comm.transfer import Coalesced
from ..errors import ConfigError, TaijiError
from .base import CommSource, Strategy, resolve_comm_source


class ModelAveraging(Strategy):
    """Synchronous model averaging: each worker steps on its own gradient, and every ``every`` steps
    ``w ← (1−α)·w + α·mean(w)`` over the live cluster, with ``alpha`` = α."""

    name = "model_averaging"
    exact = False

    def __init__(self, alpha: float = 1.0, every: int = 1):
        if not 0 < alpha <= 1:
            raise ConfigError(f"ModelAveraging: alpha must be in (0, 1], got {alpha}")
        if every < 1:
            raise ConfigError(f"ModelAveraging: every must be >= 1, got {every}")
        self.alpha = float(alpha)
        self.every = int(every)
        self._comm_source: CommSource | None = None
        self._params: list[torch.nn.Parameter] = []
        self._buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        self._handles: list[Handle] = []
        self._averaging = False
        self._ready = False

    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> ModelAveraging:
        self._comm_source = resolve_comm_source(comm)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ConfigError("ModelAveraging: the model has no parameters that require gradients")
        self._groups = dict(Coalesced(self._params))
        self._buffers = {key: Coalesced.empty(group) for key, group in self._groups.items()}
        return self

    def detach(self) -> None:
        self.abort_step()
        self._params, self._groups, self._buffers = [], {}, {}

    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        if self._comm_source is None:
            raise TaijiError("ModelAveraging.begin_step() before attach(model)")
        self.abort_step()
        comm = self._comm_source()
        self._averaging = step % self.every == 0 and comm.size > 1
        if not self._averaging:
            return
        for key, group in self._groups.items():
            buffer = Coalesced.flat(group, out=self._buffers[key])
            self._handles.append(comm.allreduce(buffer.clone(), "avg", channel="grad", async_op=True))

    def synchronize(self) -> None:
        """Wait for the step's average; turn it into the correction α·(mean − w)."""
        if not self._averaging or self._ready:
            return
        for handle, key in zip(self._handles, self._groups):
            mean = handle.wait()
            buffer = self._buffers[key]
            buffer.sub_(mean).mul_(-self.alpha)  # buffer held w; now α·(mean − w)
        self._handles.clear()
        self._ready = True

    def after_update(self) -> None:
        if not self._ready:
            return
        for key, group in self._groups.items():
            Coalesced.scatter(self._buffers[key], group, add=True)
        self._ready = self._averaging = False

    def abort_step(self) -> None:
        self._handles.clear()
        self._averaging = self._ready = False
