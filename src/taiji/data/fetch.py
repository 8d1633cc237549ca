"""Turning a worker's sample indices into a batch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

log = logging.getLogger(__name__)


class BatchFetcher:
    """Gathers ``dataset[indices]`` into a batch: tensor data sets by one index per tensor,
    others through ``collate_fn`` (torch's default collate unless given); then to ``device``.

    ``fetch_ahead(key, indices)`` loads a batch before it is asked for (the step engine does it
    while the step's allreduce is in flight, so loading hides in a wait); a call with the same
    ``key`` then returns it, any other call drops it. A key names the indices (the sampler's
    ``(epoch, start, stop)``), so a guess that turned out wrong (the batch size or the cluster
    changed at the boundary) is never used. What is loaded ahead stays on the host: the copy to
    ``device`` happens when the batch is asked for, on the asker's stream. ``ahead=False``: never."""

    def __init__(
        self,
        dataset: Dataset,
        collate_fn: Callable[[list], Any] | None = None,
        device: torch.device | str | None = None,
        ahead: bool = True,
    ):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.device = torch.device(device) if device is not None else None
        self.ahead = ahead
        self._ahead: tuple[Hashable, Any] | None = None
        self.ahead_used = self.ahead_dropped = 0

    def __call__(self, indices: torch.Tensor, key: Hashable = None) -> Any:
        ahead = self._ahead
        if ahead is not None and key is not None and ahead[0] == key:
            self._ahead = None
            self.ahead_used += 1
            batch = ahead[1]
        else:
            self.drop_ahead()
            batch = self._load(indices)
        return batch if self.device is None else to_device(batch, self.device)

    def fetch_ahead(self, key: Hashable, indices: torch.Tensor) -> None:
        if not self.ahead:
            return
        try:
            self._ahead = (key, self._load(indices))
        except Exception as exc:  # noqa: BLE001 - a guess must not fail the step in flight: the real fetch reports it
            log.debug("loading the next batch ahead failed (%s); it is loaded when asked for", exc)
            self._ahead = None

    def drop_ahead(self) -> None:
        """Forget what was loaded ahead (the step it was for will not come as guessed)."""
        if self._ahead is not None:
            self.ahead_dropped += 1
        self._ahead = None

    def _load(self, indices: torch.Tensor) -> Any:
        batch = self._gather(indices)
        # a batch bound for a GPU is pinned: its copy then runs beside the GPU's work instead of
        # waiting for the kernels queued before it (a copy from pageable memory does)
        return pinned(batch) if self.device is not None and self.device.type == "cuda" else batch

    def _gather(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is None:
            # index_select: one op, ~5x cheaper than advanced indexing's t[indices] for a batch
            return tuple(
                t.index_select(0, indices) if t.device == indices.device else t[indices]
                for t in self.dataset.tensors
            )
        collate = self.collate_fn or default_collate
        return collate([self.dataset[int(i)] for i in indices])


def _each_tensor(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_each_tensor(b, fn) for b in batch)
    if isinstance(batch, dict):
        return {k: _each_tensor(v, fn) for k, v in batch.items()}
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    return _each_tensor(batch, lambda t: t.to(device, non_blocking=True))


def pinned(batch: Any) -> Any:
    """``batch`` with its host tensors in page-locked memory (torch's caching host allocator)."""
    return _each_tensor(
        batch, lambda t: t.pin_memory() if t.device.type == "cpu" and not t.is_pinned() else t
    )
