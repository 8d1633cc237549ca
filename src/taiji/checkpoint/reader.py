"""Checking and loading checkpoints (``locate.find`` finds them): into a Job at any size, into a plain
script's model (``load_checkpoint``), or into one ``torch.save`` file (``export``).

Every refusal says which checkpoint, what is wrong and what to do; nothing is written."""

from __future__ import annotations

import io
import logging
from typing import Any

import torch

from ..comm.transfer import decode, tensor_specs
from ..errors import CheckpointError
from .layout import (
    DIGEST,
    INDEX,
    RNG_PREFIX,
    Manifest,
    TensorInfo,
    checkpoint_name,
    model_differences,
    part_name,
    tensor_keys,
)
from .locate import Found, find
from .storage import Storage
from .writer import part_digest

log = logging.getLogger(__name__)


def model_info(model: torch.nn.Module) -> dict[str, TensorInfo]:
    return {
        k: TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in model.state_dict().items()
    }


def check_model(found: Found, model: torch.nn.Module) -> None:
    diffs = model_differences(found.manifest.model, model_info(model))
    if diffs:
        more = f" (and {len(diffs) - 10} more)" if len(diffs) > 10 else ""
        raise CheckpointError(
            f"{found.url} holds another model: "
            + "; ".join(diffs[:10])
            + more
            + "; load it into the model it was written from"
        )


def _load_part(found: Found, part: int, targets: dict[str, torch.Tensor]) -> None:
    rel = f"{checkpoint_name(found.step)}/{part_name(part)}"
    where = found.storage.url_of(rel)
    try:
        expected = found.storage.read_json(f"{rel}/{DIGEST}")["digest"]
        if targets:
            index = _index(found.storage, rel)
            if index is not None and set(targets) <= set(index):
                _read_indexed(found.storage, rel, {k: index[k] for k in targets}, targets)
            else:
                _read_dcp(found.storage, rel, targets)
    except Exception as exc:  # noqa: BLE001 - many kinds for a damaged file
        raise CheckpointError(
            f"{where} cannot be read ({type(exc).__name__}: {_first_line(exc)}): the "
            "checkpoint is damaged; resume from an earlier one (a step-NNNNNNNN beside it)"
        ) from None
    if part_digest(targets) != expected:
        raise CheckpointError(
            f"{where} is damaged (its tensors do not match the digest written with them); "
            "resume from an earlier checkpoint (a step-NNNNNNNN beside it)"
        )


def _index(storage: Storage, rel: str) -> dict[str, list] | None:
    try:
        return storage.read_json(f"{rel}/{INDEX}")
    except FileNotFoundError:
        return None  # written before indexes, or its writer died after DCP's metadata


def _read_indexed(
    storage: Storage, rel: str, index: dict[str, list], targets: dict[str, torch.Tensor]
) -> None:
    """Each tensor's ``torch.save`` record straight from DCP's data files (what DCP's reader
    does, without importing DCP)."""
    by_file: dict[str, list[str]] = {}
    for key, (file, _, _) in index.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in by_file.items():
        records = storage.read_ranges(f"{rel}/{file}", [(int(index[k][1]), int(index[k][2])) for k in keys])
        for key, record in zip(keys, records):
            tensor = torch.load(io.BytesIO(record), map_location="cpu", weights_only=True)
            target = targets[key]
            if (
                not isinstance(tensor, torch.Tensor)
                or tensor.shape != target.shape
                or tensor.dtype != target.dtype
            ):
                raise ValueError(
                    f"{key} in {file} is not a {target.dtype} tensor of shape {list(target.shape)}"
                )
            target.copy_(tensor)


def _read_dcp(storage: Storage, rel: str, targets: dict[str, torch.Tensor]) -> None:
    import torch.distributed.checkpoint as dcp  # imported when used: it costs a worker ~1 s to boot
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        dcp.load(targets, storage_reader=storage.dcp_reader(rel), no_dist=True)
    except CheckpointException as exc:
        raise RuntimeError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln]
    return (errors[-1] if errors else lines[0] if lines else "")[:300]


def load_tensors(found: Found, targets: dict[str, torch.Tensor]) -> None:
    """Fill ``targets`` (every key of the checkpoint) in place, part by part, each checked."""
    owners = found.manifest.owners
    missing = sorted(set(owners) - set(targets))
    if missing:
        raise CheckpointError(f"internal: no target for {missing[:5]} of {found.url}")
    for part in range(found.manifest.parts):
        _load_part(found, part, {k: targets[k] for k, owner in owners.items() if owner == part})


def _state_targets(manifest: Manifest) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype) for dtype, shape, _ in tensor_specs(manifest.state)]


def _rng_targets(manifest: Manifest) -> dict[str, torch.Tensor]:
    """Where each writer's RNG state loads (checkpoints taken before they were saved have none)."""
    size = int(manifest.extra.get("rng_bytes", 0))
    return {k: torch.empty(size, dtype=torch.uint8) for k in manifest.owners if k.startswith(RNG_PREFIX)}


def load_into(found: Found, model: torch.nn.Module, rng: dict[str, torch.Tensor] | None = None) -> Any:
    """Load the model's tensors in place; return the TrainState's state (tensors on the CPU).
    ``rng`` (if given) receives each writer's RNG state by key (``layout.rng_key(rank)``)."""
    check_model(found, model)
    state = _state_targets(found.manifest)
    targets = _rng_targets(found.manifest)
    with torch.no_grad():
        load_tensors(found, {**tensor_keys(model.state_dict(), state), **targets})
    if rng is not None:
        rng.update(targets)
    return decode(found.manifest.state, state)


def load_checkpoint(path: str, model: torch.nn.Module) -> dict[str, Any]:
    """Load a checkpoint written by a Job (any number of workers) into ``model`` in place, for
    evaluation or inference in a plain script; ``path`` is a checkpoint or a root (its latest).
    Returns the rest: ``{"step", "optimizer", "state", "manifest"}``."""
    found = find(path)
    assert found is not None
    state = load_into(found, model)
    return {
        "step": found.step,
        "optimizer": state.get("optimizer"),
        "state": state,
        "manifest": found.manifest,
    }


def export(path: str, out: str) -> Found:
    """Write the checkpoint at ``path`` as one ``torch.save`` file: ``{"model": state_dict,
    "optimizer": ..., "train_state": ..., "manifest": ...}`` (loadable with ``torch.load``)."""
    found = find(path)
    assert found is not None
    manifest = found.manifest
    model = {
        k: torch.empty(info.shape, dtype=getattr(torch, info.dtype)) for k, info in manifest.model.items()
    }
    state = _state_targets(manifest)
    load_tensors(found, {**tensor_keys(model, state), **_rng_targets(manifest)})
    train_state = decode(manifest.state, state)
    info = manifest.to_json()
    info.pop("state", None)
    info.pop("owners", None)
    torch.save(
        {
            "model": model,
            "optimizer": train_state.pop("optimizer", None),
            "train_state": train_state,
            "manifest": info,
        },
        out,
    )
    return found
