"""Hashes of exact tensor bytes, to compare replicas bitwise without moving the tensors."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def tensor_digest(tensors: Iterable[torch.Tensor]) -> bytes:
    """SHA-256 over each tensor's dtype, shape and raw bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        data = t.detach().cpu().contiguous().reshape(-1)
        h.update(str((data.dtype, tuple(t.shape))).encode())
        h.update(data.view(torch.uint8).numpy().tobytes())
    return h.digest()
