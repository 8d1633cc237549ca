"""The JSON header a p2p model store sends before a snapshot's raw tensor bytes (comm/p2p.py):
``{"version": int | null, "tensors": [{"dtype": "float32", "shape": [..]}]}``.

Decoding is strict, since the bytes come from the network: known dtypes only, bounded rank and
sizes, and a total payload limit checked before anything is allocated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}
MAX_NDIM = 64
EMPTY_HEADER = b'{"version": null, "tensors": []}'


def encode_header(version: int | None, tensors: Sequence[torch.Tensor]) -> bytes:
    if version is None:
        return EMPTY_HEADER
    return json.dumps(
        {
            "version": version,
            "tensors": [
                {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors
            ],
        }
    ).encode()


def decode_header(raw: bytes, max_bytes: int) -> tuple[int | None, list[torch.Tensor]]:
    """The version and empty tensors to receive into; ValueError says what is malformed."""
    try:
        head = json.loads(raw)
        version, specs = head["version"], head["tensors"]
        if version is not None and (type(version) is not int or version < 0):
            raise ValueError(f"bad version {version!r}")
        if not isinstance(specs, list):
            raise ValueError("'tensors' is not a list")
        tensors, total = [], 0
        for spec in specs:
            name, shape = spec["dtype"], spec["shape"]
            if not isinstance(name, str) or name not in DTYPES:
                raise ValueError(f"dtype {name!r} is not one of {sorted(DTYPES)}")
            dtype = DTYPES[name]
            if (
                not isinstance(shape, list)
                or len(shape) > MAX_NDIM
                or any(type(d) is not int or not 0 <= d < 2**62 for d in shape)
            ):
                raise ValueError(f"bad shape {shape!r}")
            numel = 1
            for d in shape:
                numel *= d
            total += numel * dtype.itemsize
            if total > max_bytes:
                raise ValueError(f"payload exceeds the limit of {max_bytes} bytes")
            tensors.append((dtype, shape))
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # incl. JSONDecodeError
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if version is None and tensors:
        raise ValueError("tensors without a version")
    return version, [torch.empty(shape, dtype=dtype) for dtype, shape in tensors]
