"""Moving training state between replicas: tensors are coalesced per (device, dtype)
into flat buffers and broadcast from one rank, so a model of many small tensors costs
one collective per dtype instead of one per tensor."""
from __future__ import annotations

from typing import Iterable

import torch

from ..comm.communicator import Communicator
from ..comm.digest import tensor_digest


def _groups(tensors: list[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return groups


def broadcast_tensors(tensors: Iterable[torch.Tensor], comm: Communicator, src: int = 0,
                      channel: str = "ctrl") -> None:
    """Overwrite every tensor in place with rank ``src``'s values."""
    tensors = [t for t in tensors if t.numel() > 0]
    if comm.size == 1 or not tensors:
        return
    for (device, dtype), ids in _groups(tensors).items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in ids]) if comm.rank == src else \
            torch.empty(sum(tensors[i].numel() for i in ids), dtype=dtype, device=device)
        comm.broadcast(flat, src, channel=channel)
        if comm.rank != src:
            offset = 0
            with torch.no_grad():
                for i in ids:
                    n = tensors[i].numel()
                    tensors[i].copy_(flat[offset:offset + n].view_as(tensors[i]))
                    offset += n


def module_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers: what replicas of ``model`` must hold identically."""
    return [p.data for p in model.parameters()] + [b for b in model.buffers()]


def broadcast_module(model: torch.nn.Module, comm: Communicator, src: int = 0) -> None:
    broadcast_tensors(module_tensors(model), comm, src)


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """A hex hash of the exact bytes of ``tensors`` (to compare replicas bitwise)."""
    return tensor_digest(tensors).hex()
