"""What each worker reports in the step's control message, and the agreed statistics.

Every worker contributes one small float64 row (``ControlRow``); the rows of all workers are
allgathered in the step's single control message, so every worker computes the same
``StepStats`` from the same numbers: they are identical everywhere by construction.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class ControlRow:
    version_seen: float = 0.0  # newest config version this worker saw (rank 0 looks)
    stop: float = 0.0  # 1 if this worker asked the job to stop
    local_sqnorm: float = math.nan  # |g_r|² of this worker's own (unscaled) gradient; nan = not measured
    sqnorm_batch: float = 0.0  # the batch size local_sqnorm was taken on (b_r, or b/2 in a split)
    local_batch: float = 0.0  # b_r
    loss_sum: float = 0.0  # loss × b_r (so the global mean weights workers by their share)
    compute_seconds: float = 0.0  # step start -> backward done on this worker
    clock: float = 0.0  # rank 0's time.time() (others 0): the clock policies agree on
    decisions: float = 0.0  # fingerprint of the decisions taken at the boundary before this step
    wall_seconds: float = 0.0  # this worker's wall time since its previous control message (0 = first)
    # this worker's share of |ḡ|² of the averaged gradient of the previous committed, measured
    # step (nan = none); the shares of all workers sum to |ḡ|² (each measures a part of it)
    previous_global_sqnorm: float = math.nan
    # seconds this worker's previous committed step waited, after backward, for its gradients'
    # allreduce (nan = none): what the allreduce plan costs, with less of compute's noise than the step time
    previous_allreduce_wait: float = math.nan
    # seconds this worker spent on the monitors' gradient norms in its previous committed step
    # (nan = not measured then): what monitoring costs, for ``monitor_every="auto"``
    previous_monitor_seconds: float = math.nan

    WIDTH = 13

    def to_row(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @staticmethod
    def from_row(row: list[float]) -> ControlRow:
        return ControlRow(*row[: ControlRow.WIDTH])


@dataclass(frozen=True)
class StepStats:
    """Step statistics agreed by all workers."""

    version_seen: int
    stop: bool
    loss: float | None  # mean loss over the global batch
    small_sqnorm: float | None  # mean |g_r|² over workers with a share (the small batch)
    small_batch: float  # mean batch size of those measurements
    global_batch: float  # B
    grad_variance: float | None  # mean |g_r − ḡ|² across workers: mean|g_r|² − |ḡ|²
    compute_seconds: tuple[float, ...]
    straggler: float  # slowest / median compute time (1.0 = balanced)
    clock: float = 0.0  # rank 0's clock at this control message
    decisions: tuple[float, ...] = ()  # every worker's decision fingerprint, by rank
    wall_seconds: tuple[float, ...] = ()  # every worker's own wall time per step, by rank
    previous_global_sqnorm: float | None = None  # |ḡ|² of the previous measured step: the rows' shares summed
    previous_allreduce_wait: float | None = None  # the workers' mean wait for the previous step's allreduce
    previous_monitor_seconds: float | None = None  # the slowest worker's norm time in the previous step

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> StepStats:
        return StepStats(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    @staticmethod
    def reduce(rows: list[ControlRow], big_sqnorm: float | None) -> StepStats:
        # one pass over the rows: this runs every step, on every worker
        total = loss_sum = small_sum = small_batch_sum = 0.0
        measured = 0
        for r in rows:
            total += r.local_batch
            loss_sum += r.loss_sum
            if r.local_batch > 0 and math.isfinite(r.local_sqnorm):
                measured += 1
                small_sum += r.local_sqnorm
                small_batch_sum += r.sqnorm_batch
        small = small_sum / measured if measured else None
        variance = small - big_sqnorm if small is not None and big_sqnorm is not None else None
        times = tuple(r.compute_seconds for r in rows)
        return StepStats(
            version_seen=int(max(r.version_seen for r in rows)),
            stop=any(r.stop > 0 for r in rows),
            loss=loss_sum / total if total > 0 else None,
            small_sqnorm=small,
            global_batch=total,
            small_batch=small_batch_sum / measured if measured else 0.0,
            grad_variance=variance,
            compute_seconds=times,
            straggler=straggler_of(times),
            clock=rows[0].clock,
            decisions=tuple(r.decisions for r in rows),
            wall_seconds=tuple(r.wall_seconds for r in rows),
            previous_global_sqnorm=_sum_of_finite([r.previous_global_sqnorm for r in rows]),
            previous_allreduce_wait=_mean_of_finite([r.previous_allreduce_wait for r in rows]),
            previous_monitor_seconds=max(
                (r.previous_monitor_seconds for r in rows if math.isfinite(r.previous_monitor_seconds)),
                default=None,
            ),
        )


def straggler_of(times: tuple[float, ...]) -> float:
    """The slowest worker's compute time over the median's (1.0: balanced, or nothing measured)."""
    median = statistics.median(times) if times else 0.0
    return max(times) / median if median > 0 else 1.0


def _sum_of_finite(values: list[float]) -> float | None:
    """Every worker's number or none: a worker that has none (it just joined) makes the step's none."""
    return sum(values) if values and all(math.isfinite(v) for v in values) else None


def _mean_of_finite(values: list[float]) -> float | None:
    """The mean of every worker's number, or none (as ``_sum_of_finite``)."""
    total = _sum_of_finite(values)
    return None if total is None else total / len(values)
