"""Decoupled local SGD: every worker takes local steps at its own pace, and about every ``every``
global batches all workers average their models.

The Job runs this strategy *decoupled* (it is not lockstep): each worker claims its batches from
the shared counter, so every sample is trained exactly once however fast each worker is, and a
phase ends once ``every`` global batches' worth of samples have been claimed. A fast worker
therefore takes more local steps in a phase than a straggler, and nobody waits for anybody's H
steps: at the sync point a worker waits at most for the step its slowest peer has in flight.

At the sync point the models are averaged, each weighted by the local steps it took since the
last one (a straggler's model, which moved less, does not pull the others back as much as an
equal vote would; a worker that just joined has weight 0). With ``outer_lr`` and
``outer_momentum`` the average becomes a DiLoCo-style outer step instead: the outer gradient is
``anchor - average`` (``anchor``: the model all workers held after the previous sync point),
applied with (Nesterov) momentum. Every worker computes the same outer step from the same
allreduced values, so the replicas are identical after every sync point. The average is taken
before the sync point's agreement and applied only after it: a worker lost in between changes
nothing, and the survivors take the sync point again. The outer momentum
starts afresh whenever the cluster changes (on every member at once, so they stay equal).
"""

from __future__ import annotations

import torch

from ..cluster.spec import ClusterView
from ..comm.communicator import Communicator
from ..comm.transfer import Coalesced
from ..errors import ConfigError, TaijiError
from .base import CommSource, Directory, Strategy, resolve_comm_source

Key = tuple[torch.device, torch.dtype]


class LocalSGD(Strategy):
    """Decoupled local SGD: local steps at each worker's own pace, and a sync point every ``every``
    global batches where the models are averaged, weighted by local steps (or a DiLoCo-style outer
    step with ``outer_lr`` / ``outer_momentum``)."""

    name = "local_sgd"
    exact = False
    lockstep = False

    def __init__(
        self, every: int = 8, outer_lr: float = 1.0, outer_momentum: float = 0.0, nesterov: bool = True
    ):
        if every < 1:
            raise ConfigError(f"LocalSGD: every must be >= 1 global batches, got {every}")
        if outer_lr <= 0:
            raise ConfigError(f"LocalSGD: outer_lr must be > 0, got {outer_lr}")
        if not 0 <= outer_momentum < 1:
            raise ConfigError(f"LocalSGD: outer_momentum must be in [0, 1), got {outer_momentum}")
        self.phase_steps = int(every)
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.nesterov = nesterov
        self._comm_source: CommSource | None = None
        self._groups: dict[Key, list[torch.nn.Parameter]] = {}
        self._anchor: dict[Key, torch.Tensor] = {}  # the models at the last sync point (outer step only)
        self._momentum: dict[Key, torch.Tensor] = {}
        self._means: dict[Key, torch.Tensor] = {}  # a sync point's average, until it is committed
        self.local_steps = 0  # since the last sync point: this worker's weight in the average
        self.averaged = 0  # sync points that averaged models

    @property
    def every(self) -> int:
        """Global batches between sync points (H)."""
        return self.phase_steps  # type: ignore[return-value]

    @property
    def plain_average(self) -> bool:
        """Whether a sync point takes the plain weighted average (``outer_lr`` 1, no outer momentum)."""
        return self.outer_lr == 1.0 and self.outer_momentum == 0.0

    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> LocalSGD:
        self._comm_source = resolve_comm_source(comm)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("LocalSGD: the model has no parameters that require gradients")
        self._groups = dict(Coalesced(params))
        self._reset_outer()
        return self

    def detach(self) -> None:
        self._groups = {}
        self._reset_outer()

    def cluster_changed(self, view: ClusterView, directory: Directory | None = None) -> None:
        self._reset_outer()

    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        if self._comm_source is None:
            raise TaijiError("LocalSGD.begin_step() before attach(model)")

    def synchronize(self) -> None:
        return None

    def abort_step(self) -> None:
        return None

    def after_update(self) -> None:
        self.local_steps += 1

    def sync_point(self) -> None:
        """The steps-weighted average of the models, into buffers: nothing is applied until
        ``commit_sync_point`` (after every worker agreed at the sync point), so a failure here or
        in the agreement changes nothing and the sync point is retried on the survivors."""
        if self._comm_source is None:
            raise TaijiError("LocalSGD.sync_point() before attach(model)")
        self._means = {}
        comm = self._comm_source()
        if comm.size == 1:
            return
        total = comm.allreduce(
            torch.tensor([float(self.local_steps)], dtype=torch.float64), "sum", channel="ctrl"
        )
        share = self.local_steps / float(total.item()) if total.item() > 0 else 1.0 / comm.size
        for key, group in self._groups.items():
            self._means[key] = comm.allreduce(Coalesced.flat(group).mul_(share), "sum", channel="grad")

    def commit_sync_point(self) -> None:
        """Every worker agreed: take the average (or the outer step) and start counting afresh."""
        for key, group in self._groups.items():
            if key in self._means:
                Coalesced.scatter(self._outer_step(key, self._means[key]), group)
        if self._means:
            self.averaged += 1
        self._means, self.local_steps = {}, 0

    def _outer_step(self, key: Key, mean: torch.Tensor) -> torch.Tensor:
        if self.plain_average:
            return mean
        anchor = self._anchor.get(key)
        if anchor is None:  # the first sync point since the cluster changed: plain average
            self._anchor[key] = mean.clone()
            return mean
        outer_grad = anchor - mean
        momentum = self._momentum.get(key)
        momentum = (
            outer_grad.clone() if momentum is None else momentum.mul_(self.outer_momentum).add_(outer_grad)
        )
        self._momentum[key] = momentum
        update = outer_grad.add(momentum, alpha=self.outer_momentum) if self.nesterov else momentum
        anchor.sub_(update, alpha=self.outer_lr)
        return anchor.clone()

    def _reset_outer(self) -> None:
        self._anchor, self._momentum = {}, {}
