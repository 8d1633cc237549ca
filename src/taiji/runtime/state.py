"""Moving training state between replicas, without pickle.

After every membership change, workers allgather ``step`` (or -1 for a worker with no
state: a joiner); the source is the lowest rank with the highest step. If anyone differs,
the source broadcasts the TrainState: metadata (progress, optimizer structure and
hyper-parameters, scheduler state) as JSON bytes, then every tensor coalesced per
(device, dtype) into one flat buffer. Receivers decode the structure and load it.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from ..comm.communicator import Communicator
from ..comm.digest import tensor_digest
from ..errors import CommError

log = logging.getLogger(__name__)


# -- JSON with tensor placeholders ------------------------------------------------------

def encode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """A JSON-able image of ``obj``; tensors are appended to ``tensors`` and referenced."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {"__tensor__": len(tensors) - 1, "dtype": str(obj.dtype).removeprefix("torch."),
                "shape": list(obj.shape), "device": str(obj.device)}
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot send {type(obj).__name__} between workers (only tensors, numbers, strings, "
                    "lists, tuples and dicts travel; nothing is pickled)")


def tensor_specs(image: Any) -> list[tuple[torch.dtype, tuple[int, ...], str]]:
    """(dtype, shape, device) of each tensor placeholder in an encoded image, in index order."""
    found: dict[int, tuple[torch.dtype, tuple[int, ...], str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "__tensor__" in node:
                found[node["__tensor__"]] = (getattr(torch, node["dtype"]), tuple(node["shape"]), node["device"])
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(image)
    return [found[i] for i in range(len(found))]


def decode(image: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(image, dict):
        if "__tensor__" in image:
            return tensors[image["__tensor__"]]
        if "__tuple__" in image:
            return tuple(decode(v, tensors) for v in image["__tuple__"])
        if "__dict__" in image:
            return {decode(k, tensors): decode(v, tensors) for k, v in image["__dict__"]}
    if isinstance(image, list):
        return [decode(v, tensors) for v in image]
    return image


# -- broadcasting -----------------------------------------------------------------------

def broadcast_tensors(tensors: Iterable[torch.Tensor], comm: Communicator, src: int = 0,
                      channel: str = "ctrl") -> None:
    """Overwrite every tensor in place with rank ``src``'s values, one collective per dtype."""
    tensors = [t for t in tensors if t.numel() > 0]
    if comm.size == 1 or not tensors:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    for (device, dtype), ids in groups.items():
        if comm.rank == src:
            flat = torch.cat([tensors[i].detach().reshape(-1) for i in ids])
        else:
            flat = torch.empty(sum(tensors[i].numel() for i in ids), dtype=dtype, device=device)
        comm.broadcast(flat, src, channel=channel)
        if comm.rank != src:
            offset = 0
            with torch.no_grad():
                for i in ids:
                    n = tensors[i].numel()
                    tensors[i].copy_(flat[offset:offset + n].view_as(tensors[i]))
                    offset += n


def broadcast_bytes(payload: bytes | None, comm: Communicator, src: int) -> bytes:
    length = torch.tensor([len(payload) if comm.rank == src and payload is not None else 0], dtype=torch.int64)
    comm.broadcast(length, src)
    if comm.rank == src:
        assert payload is not None
        buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        buffer = torch.empty(int(length.item()), dtype=torch.uint8)
    if buffer.numel():
        comm.broadcast(buffer, src)
    return buffer.numpy().tobytes()


def module_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers: what replicas of ``model`` must hold identically."""
    return [p.data for p in model.parameters()] + [b for b in model.buffers()]


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """A hex hash of the exact bytes of ``tensors`` (to compare replicas bitwise)."""
    return tensor_digest(tensors).hex()


# -- the sync protocol ------------------------------------------------------------------

@dataclass(frozen=True)
class SyncResult:
    source: int
    transferred: bool
    meta: dict | None     # the source's metadata, on ranks that received it
    seconds: float = 0.0


def choose_source(steps: list[int]) -> int:
    """The lowest rank among those with the highest step (-1 = no state)."""
    best = max(steps)
    if best < 0:
        raise CommError("no worker of the new cluster holds training state; cannot continue")
    return steps.index(best)


def sync_state(comm: Communicator, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               step: int, meta: dict, extra_state: dict[str, Any] | None = None,
               force: bool = False) -> SyncResult:
    """Make every replica hold the most advanced replica's state (see module doc).

    ``step`` is -1 on a worker without state. ``meta`` is JSON-able (progress and the like);
    ``extra_state`` may hold tensors (scheduler, policy state). ``force`` broadcasts even if
    all steps agree (the first sync of a job, whose replicas may be initialised differently).
    Returns the source's ``meta`` and ``extra_state`` (as ``meta["extra"]``) on receivers.
    """
    started = time.perf_counter()
    if comm.size == 1:
        return SyncResult(0, False, None)
    rows = comm.allgather(torch.tensor([step], dtype=torch.int64))
    steps = [int(r.item()) for r in rows]  # type: ignore[union-attr]
    source = choose_source(steps)
    if not force and all(s == steps[source] for s in steps):
        return SyncResult(source, False, None, time.perf_counter() - started)
    payload = None
    tensors: list[torch.Tensor] = []
    if comm.rank == source:
        image = {"meta": meta, "optimizer": encode(optimizer.state_dict(), tensors),
                 "extra": encode(extra_state or {}, tensors)}
        payload = json.dumps(image).encode()
    image = json.loads(broadcast_bytes(payload, comm, source))
    if comm.rank != source:
        tensors = [torch.empty(shape, dtype=dtype, device=device)
                   for dtype, shape, device in tensor_specs(image)]
    broadcast_tensors(module_tensors(model) + tensors, comm, source)
    received_meta = None
    if comm.rank != source:
        optimizer.load_state_dict(decode(image["optimizer"], tensors))
        received_meta = dict(image["meta"], extra=decode(image["extra"], tensors))
    return SyncResult(source, True, received_meta, time.perf_counter() - started)
