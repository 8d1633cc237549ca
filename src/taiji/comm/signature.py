"""Debug mode's collective signatures: what a collective call is (op, dtype, device, shape, its
argument) as one int64 row, which the ranks allgather and compare before the call itself."""

from __future__ import annotations

import torch

from ..errors import MismatchError

OP_CODES = {"allreduce": 1, "broadcast": 2, "allgather": 3, "barrier": 4, "consensus": 5}
_DTYPE_CODES = {
    dt: i
    for i, dt in enumerate(
        (
            torch.float32,
            torch.float64,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.bool,
        ),
        start=1,
    )
}
_SIGNATURE_LEN = 16


def signature(op: str, tensor: torch.Tensor | None, extra: int) -> torch.Tensor:
    sig = torch.zeros(_SIGNATURE_LEN, dtype=torch.int64)
    sig[0] = OP_CODES[op]
    sig[4] = extra
    if tensor is not None:
        sig[1] = _DTYPE_CODES.get(tensor.dtype, 99)
        sig[2] = 1 if tensor.is_cuda else 0
        shape = list(tensor.shape)[: _SIGNATURE_LEN - 5]
        sig[3] = tensor.dim()
        sig[5 : 5 + len(shape)] = torch.tensor(shape, dtype=torch.int64)
    return sig


def describe(row: torch.Tensor) -> str:
    """A signature row as the call it stands for."""
    names = {v: k for k, v in OP_CODES.items()}
    dtypes = {v: k for k, v in _DTYPE_CODES.items()}
    ndim = int(row[3])
    return (
        f"{names.get(int(row[0]), '?')}(dtype={dtypes.get(int(row[1]), '?')}, "
        f"shape={tuple(int(x) for x in row[5 : 5 + ndim])}, arg={int(row[4])})"
    )


def check_signatures(rows: list[torch.Tensor], op: str, where: str, version: int, channel: str) -> None:
    """MismatchError naming the ranks whose signature row differs from rank 0's."""
    reference = rows[0]
    bad = [r for r, row in enumerate(rows) if not torch.equal(row, reference)]
    if bad:
        detail = "; ".join(f"rank {r}: {describe(rows[r])}" for r in bad)
        raise MismatchError(
            f"{where} collective mismatch: rank 0 called {describe(reference)} but {detail}. "
            "Every worker must issue the same collectives in the same order.",
            op=op,
            channel=channel,
            version=version,
        )
