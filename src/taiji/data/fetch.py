"""Turning a worker's sample indices into a batch."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate


class BatchFetcher:
    """Gathers ``dataset[indices]`` into a batch: tensor data sets by one index per tensor,
    others through ``collate_fn`` (torch's default collate unless given); then to ``device``."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list], Any] | None = None,
                 device: torch.device | str | None = None):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.device = torch.device(device) if device is not None else None

    def __call__(self, indices: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset) and self.collate_fn is None:
            batch: Any = tuple(t[indices] for t in self.dataset.tensors)
        else:
            collate = self.collate_fn or default_collate
            batch = collate([self.dataset[int(i)] for i in indices])
        return batch if self.device is None else to_device(batch, self.device)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
