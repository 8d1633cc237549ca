"""How a checkpoint lies in its directory, and the pure decisions about checkpoints.

::

    ROOT/step-00000120/manifest.json     written first by the lowest rank (atomically, by rename)
    ROOT/step-00000120/part-0/           one DCP checkpoint per writer: its share of the tensors
    ROOT/step-00000120/part-0/.metadata  DCP writes it last, after an fsync: the part is complete
    ROOT/step-00000120/part-0/digest.json
    ROOT/step-00000120/part-0/index.json  after DCP's metadata: where each tensor lies in DCP's files

A checkpoint counts only once its manifest and every part it lists are complete; a writer that
died or failed leaves it incomplete, hence invisible. Every tensor is written by exactly one
worker (``assign``): each writes about 1/n of the state. A part's ``index.json`` lets a reader
take each tensor from DCP's data files without importing DCP (seconds of a booting worker's CPU);
a part without one (written before it, or by a writer that died between the two) is read by DCP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from ..errors import ConfigError

FORMAT = 1  # the manifest's format version; a newer one is refused
MANIFEST = "manifest.json"
PART_DONE = ".metadata"  # DCP's metadata file, written last
DIGEST = "digest.json"
INDEX = "index.json"  # key -> [DCP data file, offset, length]
_NAME = re.compile(r"step-(\d{8,})")
T = TypeVar("T")


def taiji_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("taiji")
    except PackageNotFoundError:
        return "unknown"


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def part_name(index: int) -> str:
    return f"part-{index}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory's name, or None for anything else."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds, readable without torch."""

    format: int
    taiji_version: str
    step: int
    size: int  # workers when it was written
    time: float  # rank 0's clock
    parts: int  # writers (part-0 .. part-{parts-1})
    model: dict[str, TensorInfo]  # the model's state_dict: name -> shape, dtype
    owners: dict[str, int]  # every tensor key -> the part holding it
    state: object = None  # the TrainState's image (JSON, tensor placeholders)
    strategy: str = ""
    extra: dict = field(default_factory=dict)  # the job's bounds and anything informative

    def to_json(self) -> dict:
        data = asdict(self)
        data["model"] = {k: {"shape": list(v.shape), "dtype": v.dtype} for k, v in self.model.items()}
        return data

    @staticmethod
    def from_json(data: Mapping) -> Manifest:
        fmt = int(data.get("format", -1))
        if fmt > FORMAT:
            raise ConfigError(
                f"this checkpoint has format {fmt}, newer than this taiji reads ({FORMAT}); "
                f"upgrade taiji (it was written by taiji {data.get('taiji_version', '?')})"
            )
        if fmt < 1:
            raise ConfigError("this is not a taiji checkpoint manifest (no format version)")
        model = {k: TensorInfo(tuple(v["shape"]), v["dtype"]) for k, v in data["model"].items()}
        return Manifest(
            format=fmt,
            taiji_version=str(data["taiji_version"]),
            step=int(data["step"]),
            size=int(data["size"]),
            time=float(data["time"]),
            parts=int(data["parts"]),
            model=model,
            owners={k: int(v) for k, v in data["owners"].items()},
            state=data.get("state"),
            strategy=str(data.get("strategy", "")),
            extra=dict(data.get("extra", {})),
        )


def tensor_keys(model: Mapping[str, T], state: Sequence[T]) -> dict[str, T]:
    """A checkpoint's tensors by key: the model's ``state_dict`` names under ``model.``, the
    TrainState image's tensors by placeholder index under ``state.``."""
    keyed = {f"model.{k}": v for k, v in model.items()}
    keyed.update({f"state.{i}": t for i, t in enumerate(state)})
    return keyed


RNG_PREFIX = "rng."  # each writer's own torch RNG state (dropout etc.), written by that rank only


def rng_key(rank: int) -> str:
    return f"{RNG_PREFIX}{rank}"


def assign(sizes: Mapping[str, int], writers: int) -> dict[str, int]:
    """Which writer writes each tensor: largest first, each to the least loaded writer so far
    (ties: the lowest). Pure and deterministic: every worker computes the same split."""
    load = [0] * max(writers, 1)
    owners: dict[str, int] = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        writer = min(range(len(load)), key=lambda w: (load[w], w))
        owners[key] = writer
        load[writer] += sizes[key]
    return owners


def model_differences(saved: Mapping[str, TensorInfo], current: Mapping[str, TensorInfo]) -> list[str]:
    """Why a checkpoint's model is not this model: missing, unexpected, reshaped or retyped names."""
    out = [f"{k} is in the checkpoint but not in the model" for k in sorted(set(saved) - set(current))]
    out += [f"{k} is in the model but not in the checkpoint" for k in sorted(set(current) - set(saved))]
    for k in sorted(set(saved) & set(current)):
        a, b = saved[k], current[k]
        if a.shape != b.shape:
            out.append(f"{k}: shape {list(a.shape)} in the checkpoint, {list(b.shape)} in the model")
        elif a.dtype != b.dtype:
            out.append(f"{k}: dtype {a.dtype} in the checkpoint, {b.dtype} in the model")
    return out


@dataclass(frozen=True)
class Listing:
    """What a checkpoint root holds: each checkpoint's step and whether it is complete."""

    complete: tuple[int, ...]
    incomplete: tuple[int, ...]

    @staticmethod
    def of(entries: Iterable[tuple[int, bool]]) -> Listing:
        items = sorted(entries)
        return Listing(tuple(s for s, ok in items if ok), tuple(s for s, ok in items if not ok))

    @property
    def latest(self) -> int | None:
        return self.complete[-1] if self.complete else None


def to_prune(listing: Listing, keep: int, in_flight: Sequence[int] = ()) -> list[int]:
    """Steps to delete: complete checkpoints beyond the newest ``keep``, and incomplete ones older
    than the newest complete one (abandoned writes). Never the newest complete one, never one
    newer than it (it may still be being written), never one in flight."""
    latest = listing.latest
    if latest is None:
        return []
    old = list(listing.complete[:-keep]) if keep < len(listing.complete) else []
    abandoned = [s for s in listing.incomplete if s < latest]
    return sorted(s for s in old + abandoned if s not in in_flight and s != latest)
