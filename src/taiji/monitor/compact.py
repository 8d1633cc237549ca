"""The control message at scale: the few sums every decision needs, plus what stays per worker.

Below ``threshold`` workers every worker allgathers every worker's whole ``ControlRow``
(``monitor.stats``). At and above it the rows travel compact: one float64 sum-allreduce of

* ``SUMS`` — the sums ``StepStats`` is made of (global batch, loss, the measured small-batch
  norms and their count, the previous step's norm shares and allreduce waits with the count of
  workers that had none), and two lead-only slots (the newest config version rank 0 saw, rank 0's
  clock: every other worker adds 0, so the sum is rank 0's number exactly);
* one slot of ``PER_WORKER`` numbers per worker (compute time, wall time, decision fingerprint,
  monitor time): zero except in the worker's own slot, so the sum is every worker's number exactly
  (one non-zero addend is exact in any order).

An allreduce's result is the same bits on every rank (the gradients rely on it), so every worker
derives the same ``StepStats`` from it by construction; the order in which the sums were added only
moves the last bits of the loss and norm sums, alike everywhere. What a worker receives per step is
``len(SUMS) + len(PER_WORKER)·n`` floats instead of ``WIDTH·n``.

``version_seen`` is rank 0's alone here (an allgathered row's maximum below the threshold): the
other workers report the version they run, which every worker knows already.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .stats import ControlRow, StepStats, straggler_of

SUMS = (
    "stops",
    "local_batch",
    "loss_sum",
    "measured",
    "small_sqnorm",
    "small_batch",
    "previous_global_sqnorm",
    "previous_global_sqnorm_missing",
    "previous_allreduce_wait",
    "previous_allreduce_wait_missing",
    "lead_version_seen",
    "lead_clock",
)
PER_WORKER = ("compute_seconds", "wall_seconds", "decisions", "previous_monitor_seconds")


def compact_above(workers: int, threshold: int) -> bool:
    """Whether ``workers`` exchange the compact message (``threshold`` 0: never)."""
    return 0 < threshold <= workers


def compact_width(workers: int) -> int:
    """Floats in the compact message of ``workers`` workers."""
    return len(SUMS) + len(PER_WORKER) * workers


def _finite_or_zero(value: float) -> tuple[float, float]:
    """``(value, 0)`` if finite, else ``(0, 1)``: a sum and a count of the workers without one."""
    return (value, 0.0) if math.isfinite(value) else (0.0, 1.0)


def sums_of(row: ControlRow, lead: bool) -> list[float]:
    """This worker's addends of ``SUMS``, in order."""
    measured = row.local_batch > 0 and math.isfinite(row.local_sqnorm)
    return [
        float(row.stop > 0),
        row.local_batch,
        row.loss_sum,
        float(measured),
        row.local_sqnorm if measured else 0.0,
        row.sqnorm_batch if measured else 0.0,
        *_finite_or_zero(row.previous_global_sqnorm),
        *_finite_or_zero(row.previous_allreduce_wait),
        row.version_seen if lead else 0.0,
        row.clock if lead else 0.0,
    ]


def own_of(row: ControlRow) -> list[float]:
    """This worker's ``PER_WORKER`` numbers, in order."""
    return [row.compute_seconds, row.wall_seconds, row.decisions, row.previous_monitor_seconds]


def compact_message(row: ControlRow, rank: int, workers: int) -> list[float]:
    """This worker's addend of the compact message: its sums, zeros, its own numbers in its slot."""
    message = sums_of(row, rank == 0) + [0.0] * (len(PER_WORKER) * workers)
    start = len(SUMS) + len(PER_WORKER) * rank
    message[start : start + len(PER_WORKER)] = own_of(row)
    return message


def agree_compact(message: Sequence[float] | np.ndarray, workers: int) -> StepStats:
    """The statistics every worker derives from the summed compact message (``StepStats.reduce``'s
    for the same rows, the sums added in another order)."""
    values = np.asarray(message, dtype=np.float64)
    s = dict(zip(SUMS, values[: len(SUMS)].tolist()))
    # numpy, not a loop over workers: this runs every step, on every worker
    compute, wall, decisions, monitor = values[len(SUMS) :].reshape(workers, len(PER_WORKER)).T.tolist()
    measured = s["measured"]
    times = tuple(compute)
    finite_monitor = [m for m in monitor if math.isfinite(m)]
    wait = None if s["previous_allreduce_wait_missing"] else s["previous_allreduce_wait"] / workers
    return StepStats(
        version_seen=int(s["lead_version_seen"]),
        stop=s["stops"] > 0,
        loss=s["loss_sum"] / s["local_batch"] if s["local_batch"] > 0 else None,
        small_sqnorm=s["small_sqnorm"] / measured if measured else None,
        global_batch=s["local_batch"],
        small_batch=s["small_batch"] / measured if measured else 0.0,
        grad_variance=None,
        compute_seconds=times,
        straggler=straggler_of(times),
        clock=s["lead_clock"],
        decisions=tuple(decisions),
        wall_seconds=tuple(wall),
        previous_global_sqnorm=None if s["previous_global_sqnorm_missing"] else s["previous_global_sqnorm"],
        previous_allreduce_wait=wait,
        previous_monitor_seconds=max(finite_monitor) if finite_monitor else None,
    )
