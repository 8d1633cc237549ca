"""Moving tensors and structured state between workers, without pickle.

Structured state travels as a JSON image in which every tensor is a placeholder; the tensors
themselves travel coalesced: one flat buffer per (device, dtype), one collective each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .communicator import Communicator
from .digest import tensor_digest


class Coalesced:
    """Tensors grouped by (device, dtype), each group flattened into one buffer and back.

    The one place where many tensors become few collectives (state broadcast, parameter
    averaging): ``flat()`` gathers a group into a contiguous buffer, ``scatter()`` writes a
    buffer's values back into the group's tensors in place.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = [t for t in tensors if t.numel() > 0]
        self.groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for t in self.tensors:
            self.groups.setdefault((t.device, t.dtype), []).append(t)

    def __iter__(self) -> Iterator[tuple[tuple[torch.device, torch.dtype], list[torch.Tensor]]]:
        return iter(self.groups.items())

    @staticmethod
    def flat(group: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        parts = [t.detach().reshape(-1) for t in group]
        return torch.cat(parts) if out is None else torch.cat(parts, out=out)

    @staticmethod
    def empty(group: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device)

    @staticmethod
    def scatter(flat: torch.Tensor, group: Sequence[torch.Tensor], add: bool = False) -> None:
        offset = 0
        with torch.no_grad():
            for t in group:
                n = t.numel()
                piece = flat[offset : offset + n].view_as(t)
                t.add_(piece) if add else t.copy_(piece)
                offset += n


def broadcast_tensors(
    tensors: Iterable[torch.Tensor], comm: Communicator, src: int = 0, channel: str = "ctrl"
) -> None:
    """Overwrite every tensor in place with rank ``src``'s values, one collective per dtype."""
    coalesced = Coalesced(list(tensors))
    if comm.size == 1 or not coalesced.tensors:
        return
    for _, group in coalesced:
        flat = Coalesced.flat(group) if comm.rank == src else Coalesced.empty(group)
        comm.broadcast(flat, src, channel=channel)
        if comm.rank != src:
            Coalesced.scatter(flat, group)


def average_tensors(tensors: Iterable[torch.Tensor], comm: Communicator, channel: str = "grad") -> None:
    """Replace every tensor in place by its mean over the cluster (one allreduce per dtype)."""
    if comm.size == 1:
        return
    for _, group in Coalesced(list(tensors)):
        flat = Coalesced.flat(group)
        comm.allreduce(flat, "avg", channel=channel)
        Coalesced.scatter(flat, group)


class PendingAverage:
    """Buffers being averaged in the background; ``wait()`` writes the means back in place."""

    def __init__(self, parts: list[tuple[Any, list[torch.Tensor]]]):
        self._parts = parts

    def wait(self) -> None:
        for handle, group in self._parts:
            Coalesced.scatter(handle.wait(), group)
        self._parts = []


def average_buffers_async(
    buffers: Sequence[torch.Tensor], comm: Communicator, channel: str = "grad"
) -> PendingAverage:
    """Start making running statistics (BatchNorm-style buffers) identical on every replica:
    floating buffers become their mean over the cluster, integer ones (counters) the maximum."""
    parts = []
    if comm.size > 1:
        for (_, dtype), group in Coalesced(list(buffers)):
            op = "avg" if dtype.is_floating_point else "max"
            parts.append((comm.allreduce(Coalesced.flat(group), op, channel=channel, async_op=True), group))
    return PendingAverage(parts)


def broadcast_bytes(payload: bytes | None, comm: Communicator, src: int, channel: str = "ctrl") -> bytes:
    length = torch.tensor(
        [len(payload) if comm.rank == src and payload is not None else 0], dtype=torch.int64
    )
    comm.broadcast(length, src, channel=channel)
    if comm.rank == src:
        assert payload is not None
        buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        buffer = torch.empty(int(length.item()), dtype=torch.uint8)
    if buffer.numel():
        comm.broadcast(buffer, src, channel=channel)
    return buffer.numpy().tobytes()


FLOAT32_PIECES = 3  # float32 summands that hold a float64: 24 bits each, all 53


def float32_pieces(values: Sequence[float], out: np.ndarray | None = None) -> np.ndarray:
    """``values`` as ``[FLOAT32_PIECES, len(values)]`` float32 whose column sums are the float64
    values, for riding in a float32 sum-allreduce in a slot no other worker adds to (a sum with
    one non-zero addend is exact in any order). Exact for finite values within float32's range and
    above its subnormals; beyond that range a value comes back infinite; nan and inf come back.
    ``out``: where to write them (a numpy view of the slot: no tensor op at all)."""
    # numpy, not torch: this runs on the step's critical path (in the last bucket's launch), and a
    # dozen torch ops on 13 numbers cost ~0.2 ms of dispatch, numpy's ~0.02 ms
    rest = np.asarray(values, dtype=np.float64)
    shape = (FLOAT32_PIECES, len(rest))
    if out is not None and (out.shape != shape or out.dtype != np.float32):
        raise ValueError(f"float32_pieces: out is {out.dtype} {out.shape}, needs float32 {shape}")
    pieces = np.empty(shape, dtype=np.float32) if out is None else out
    with np.errstate(all="ignore"):  # beyond float32's range: inf; below: its subnormals or 0 (as torch)
        for part in range(FLOAT32_PIECES):  # each takes the next 24 bits of what the previous left
            pieces[part] = rest  # rounds to nearest, as a float64 -> float32 cast does
            rest = np.where(np.isfinite(pieces[part]), rest - pieces[part], 0.0)
    return pieces


def float64_from_pieces(pieces: np.ndarray) -> np.ndarray:
    """The float64 values of ``float32_pieces`` (``[..., FLOAT32_PIECES, n]`` → ``[..., n]``)."""
    return pieces.astype(np.float64).sum(axis=-2)


def module_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers: what replicas of ``model`` must hold identically."""
    return [p.data for p in model.parameters()] + [b for b in model.buffers()]


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """A hex hash of the exact bytes of ``tensors`` (to compare replicas bitwise)."""
    return tensor_digest(tensors).hex()


# -- JSON with tensor placeholders ------------------------------------------------------


def encode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """A JSON-able image of ``obj``; tensors are appended to ``tensors`` and referenced."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {
            "__tensor__": len(tensors) - 1,
            "dtype": str(obj.dtype).removeprefix("torch."),
            "shape": list(obj.shape),
            "device": str(obj.device),
        }
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k, tensors), encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"cannot send {type(obj).__name__} between workers (only tensors, numbers, strings, "
        "lists, tuples and dicts travel; nothing is pickled)"
    )


def tensor_specs(image: Any) -> list[tuple[torch.dtype, tuple[int, ...], str]]:
    """(dtype, shape, device) of each tensor placeholder in an encoded image, in index order."""
    found: dict[int, tuple[torch.dtype, tuple[int, ...], str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "__tensor__" in node:
                found[node["__tensor__"]] = (
                    getattr(torch, node["dtype"]),
                    tuple(node["shape"]),
                    node["device"],
                )
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
