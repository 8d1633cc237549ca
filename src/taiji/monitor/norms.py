"""Squared L2 norms of flat gradient buckets, for the two-batch noise-scale estimator.

A strategy measures each bucket twice in a measured step (this worker's gradient before the
allreduce, the averaged one after it), on the step's critical path: what counts there is the
number of tensor operations (each costs microseconds of dispatch, more on a busy host) and the
bytes read. ``BucketNorm`` is made once per bucket buffer and measures a float32 buffer with at
most three operations (a half-precision one with five) and no host synchronisation; the caller
turns a step's parts into a number once (``sum_of_parts``: one host sync on an accelerator).

Above ``SAMPLE_ABOVE`` elements the norm is estimated from evenly spread contiguous chunks
(``SAMPLE_CHUNK`` of every ``SAMPLE_PERIOD`` elements, scaled up; the tail exactly): one full
pass over a large bucket costs milliseconds of memory bandwidth on a CPU, and the noise scale
needs two per step. Within a step the same coordinates are read before and after the allreduce,
so the two-batch differences compare like with like; from step to step the chunks move on
(``parts(step)``: ``chunk_index``), so over a few dozen measured steps every coordinate is read
about equally often and the smoothed estimate is of the whole gradient. A fixed subset is not: where a few
coordinates carry the signal, the estimate settles on that subset's noise scale
(``benchmarks/gns_sampling.py``: on MLPs trained on Fashion-MNIST the fixed 1/16 chunks taiji
read before were ~10–15% off the exact noise scale on average, moving 1/17 chunks ~6%, moving
1/33 chunks ~12%, for ~3/4 of the cost). The period is an odd multiple of the chunk, so within one step the
chunks of a weight matrix whose rows are a power of two long fall on columns across the whole
row, not on the same leading ones.

After the allreduce every worker holds the same averaged gradient, so its norm is measured in
shares: ``BucketNorm(flat, rank, size)`` reads worker ``rank``'s ``1/size`` of the coordinates
(of the sampled chunks, for a sampled bucket; the tail goes with the last share), and the shares
of all ``size`` workers sum to the whole measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

SAMPLE_ABOVE = 1 << 20  # buckets with more elements get a sampled norm
SAMPLE_CHUNK, SAMPLE_PERIOD = 256, 17 * 256  # 1/17 of a large bucket (see module doc)

Part = tuple[torch.Tensor, float]  # a 0-dim tensor and the factor its value counts with


def _squared_norm(t: torch.Tensor) -> torch.Tensor:
    """|t|² as a 0-dim tensor: one op where the dtype allows (a float32 dot: BLAS, float32 sums,
    ~1e-7 relative error, far below the estimator's noise); half precision is summed in float32."""
    if t.dtype in (torch.float32, torch.float64) and t.is_contiguous():
        return torch.dot(t, t)
    return torch.linalg.vector_norm(t, dtype=torch.float32).square()


def _share(n: int, rank: int, size: int) -> slice:
    return slice(rank * n // size, (rank + 1) * n // size)


class BucketNorm:
    """Measures |flat|² of one (contiguous, 1-D) buffer, exactly or sampled (see module doc), or
    worker ``rank``'s share of it among ``size``; ``period``: a multiple of ``SAMPLE_CHUNK``."""

    def __init__(self, flat: torch.Tensor, rank: int = 0, size: int = 1, period: int = SAMPLE_PERIOD):
        if period < SAMPLE_CHUNK or period % SAMPLE_CHUNK:
            raise ValueError(f"period {period} is not a multiple of the {SAMPLE_CHUNK}-element chunk")
        self.flat, self.rank, self.size, self.period = flat, rank, size, period
        n = flat.numel()
        self._offsets: list[torch.Tensor] = []  # a sampled buffer's chunks, one view per offset
        self._exact = flat[_share(n, rank, size)]
        if n > SAMPLE_ABOVE:
            rows = n // period
            # gathering the strided chunks into one contiguous run first is ~4x faster than a
            # strided reduction on a CPU (the copy is a fraction of the bucket; the dot is then one pass)
            grid = flat[: rows * period].view(rows, period)[_share(rows, rank, size)]
            self._offsets = [grid[:, c : c + SAMPLE_CHUNK] for c in range(0, period, SAMPLE_CHUNK)]
            self._scratch = torch.empty(self._offsets[0].shape, dtype=flat.dtype, device=flat.device)
            self._exact = flat[rows * period :] if rank == size - 1 else flat[:0]  # the tail

    def parts(self, step: int = 0) -> list[Part]:
        """The squared norm as parts, not yet summed (summing them is ``sum_of_parts``'s one sync).
        ``step`` chooses which chunk of each period a sampled norm reads (see module doc)."""
        parts = []
        if self._offsets and self._scratch.numel():
            self._scratch.copy_(self._offsets[chunk_index(step, len(self._offsets))])
            parts.append((_squared_norm(self._scratch.view(-1)), self.period / SAMPLE_CHUNK))
        if self._exact.numel():
            parts.append((_squared_norm(self._exact), 1.0))
        return parts


_WEYL = (math.sqrt(5.0) - 1.0) / 2.0


def chunk_index(step: int, chunks: int) -> int:
    """Which of a period's ``chunks`` step ``step`` reads: the fraction of step·φ (a Weyl sequence),
    so the steps measured every k-th step take the chunks in turn evenly whatever k is
    (``step % chunks`` would read one chunk for ever when k is a multiple of ``chunks``). Plain
    IEEE arithmetic: the same chunk on every worker."""
    return int((step * _WEYL) % 1.0 * chunks)


def sum_of_parts(parts: Sequence[Part]) -> float:
    """The value of measured parts, summed in float64 on the host, in order (so every worker adds
    the same numbers the same way). On a CPU each part is read as it is; parts on an accelerator
    are read with one copy to the host (one sync), not one per part."""
    if all(value.device.type == "cpu" for value, _ in parts):
        values = [float(value) for value, _ in parts]
    else:
        device = parts[0][0].device
        values = torch.stack([value.to(device=device, dtype=torch.float64) for value, _ in parts]).tolist()
    return sum((value * factor for value, (_, factor) in zip(values, parts)), 0.0)


def sqnorm(flat: torch.Tensor) -> float:
    """|flat|² of a flat tensor, measured as a bucket would be (sampled above ``SAMPLE_ABOVE``)."""
    return sum_of_parts(BucketNorm(flat.reshape(-1)).parts())
