"""The training loop: step boundaries, commit, progress.

``for step in job:`` yields one Step per global batch. The user runs forward and
``step.backward(loss)``; when the loop comes back for the next step, the Job commits the
finished one (optimizer step, step counter, sampler cursor) only if every collective of
the step succeeded. A step is applied wholly or not at all.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from ..data.sampler import ElasticSampler, SamplerState, advance, global_span
from ..errors import CommError, ConfigError
from ..strategies.base import Strategy
from ..strategies.sync_sgd import SyncSGD
from .peer import Peer, default_peer
from .state import broadcast_module

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """Where training stands; identical on every replica after each committed step."""
    step: int = 0
    sampler: SamplerState = SamplerState()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch


class Step:
    """One global batch: this worker's slice of it, and the way to submit its loss."""

    def __init__(self, job: "Job", index: int, epoch: int, batch: Any, indices: torch.Tensor,
                 global_batch_size: int):
        self.job = job
        self.index = index
        self.epoch = epoch
        self.batch = batch
        self.indices = indices
        self.local_batch_size = len(indices)
        self.global_batch_size = global_batch_size
        self.loss: float | None = None
        self.synchronized = False

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (the mean over this worker's slice) and synchronise gradients.

        Afterwards every worker holds the gradient of the mean loss over the global batch.
        """
        if self.local_batch_size > 0:
            loss.backward()
            self.loss = float(loss.detach())
        self.job._synchronize(self)


class Job:
    """Elastic data-parallel training loop over ``dataset`` with a global batch size."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
                 batch_size: int, *, strategy: Strategy | None = None, epochs: int = 1,
                 max_steps: int | None = None, seed: int = 0, shuffle: bool = True,
                 lr_scheduler: Any = None, collate_fn: Callable[[list], Any] | None = None,
                 device: torch.device | str | None = None, log_every: int = 50,
                 peer: Peer | None = None):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if epochs < 1 and max_steps is None:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        if max_steps is not None and max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {max_steps}")
        self.model = model
        self.optimizer = optimizer
        self.dataset = dataset
        self.peer = peer or default_peer()
        self.strategy = (strategy or SyncSGD()).attach(model, lambda: self.peer.comm)
        self.epochs = epochs
        self.max_steps = max_steps
        self.lr_scheduler = lr_scheduler
        self.collate_fn = collate_fn
        self.device = torch.device(device) if device is not None else None
        self.log_every = log_every
        self.sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)  # type: ignore[arg-type]
        self.progress = Progress(sampler=SamplerState(batch_size=batch_size))
        self._started = False
        self._samples_since_log = 0
        self._time_of_log = 0.0
        self.samples_per_second = 0.0

    # -- loop -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        if self.max_steps is not None and self.progress.step >= self.max_steps:
            return True
        return self.progress.epoch >= self.epochs

    def __iter__(self) -> Iterator[Step]:
        if self._started:
            raise ConfigError("a Job can be iterated once; create a new Job to train again")
        self._started = True
        broadcast_module(self.model, self.peer.comm, src=0)
        self._time_of_log = time.perf_counter()
        while not self.done:
            step = self._make_step()
            try:
                yield step
            except GeneratorExit:
                self.strategy.abort_step()
                raise
            self._commit(step)

    def _make_step(self) -> Step:
        progress = self.progress
        rank, size = self.peer.rank, self.peer.size
        lo, hi = global_span(progress.sampler, self.sampler.num_samples)
        indices = self.sampler.local_indices(progress.sampler, rank, size)
        batch = self._fetch(indices)
        self.strategy.begin_step(len(indices) / (hi - lo))
        self.peer.step = progress.step
        return Step(self, progress.step, progress.epoch, batch, indices, hi - lo)

    def _fetch(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is None:
            batch: Any = tuple(t[indices] for t in self.dataset.tensors)
        else:
            collate = self.collate_fn or default_collate
            batch = collate([self.dataset[int(i)] for i in indices])
        if self.device is not None:
            batch = _to_device(batch, self.device)
        return batch

    def _synchronize(self, step: Step) -> None:
        if step.synchronized:
            return
        try:
            self.strategy.synchronize()
        except CommError:
            self.strategy.abort_step()
            raise
        step.synchronized = True

    def _commit(self, step: Step) -> None:
        self._synchronize(step)  # the user may have called loss.backward() directly
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.progress = replace(
            self.progress, step=self.progress.step + 1,
            sampler=advance(self.progress.sampler, step.global_batch_size, self.sampler.num_samples))
        self.peer.step = self.progress.step
        self._samples_since_log += step.global_batch_size
        if self.log_every and self.progress.step % self.log_every == 0:
            self._log_progress(step)

    def _log_progress(self, step: Step) -> None:
        now = time.perf_counter()
        elapsed = max(now - self._time_of_log, 1e-9)
        self.samples_per_second = self._samples_since_log / elapsed
        self._samples_since_log, self._time_of_log = 0, now
        if self.peer.rank == 0:
            loss = "n/a" if step.loss is None else f"{step.loss:.4f}"
            log.info("epoch %d step %d: loss %s, %.0f samples/s, global batch %d on %d workers",
                     step.epoch, self.progress.step, loss, self.samples_per_second,
                     step.global_batch_size, self.peer.size)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
