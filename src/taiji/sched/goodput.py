"""What a live job's run log says of its batch size and gradient noise (pure), for the goodput model
the live scheduler gives the policies (:func:`taiji.sched.live.live_application`).

A taiji job's rank 0 writes one row per monitored step to ``metrics.jsonl`` (``runtime/reporting.py``):
``batch_size`` (the decided global batch), ``gns`` (the gradient noise scale ``B_noise`` in samples,
``trace_sigma / grad_sqnorm`` of its bias-corrected moving averages; null until the estimator has
seen enough steps) and the two averages themselves. From the run's first rows and its latest ones
:func:`batch_stats` reads

- ``init_batch``, B0: the batch it started with (the first row's) — Pollux's initial batch, the unit
  of statistical progress;
- ``batch`` and ``largest``: the batch it trains with now and the largest it used;
- ``noise_scale``: the latest finite, positive ``gns`` (else ``trace_sigma / grad_sqnorm`` of the
  same row); None while the log has none — the policies then see efficiency 1 at every batch, i.e.
  they optimise throughput, as before the job measured its noise.

**Which jobs adapt their batch** (:func:`batch_range`). The daemon cannot change a job's batch: a job
adapts it itself (taiji's ``GoodputBatchSize``, ``--policy goodput``), choosing the goodput-best batch
for the workers it is given, as Pollux's agent does. The scheduler must know the range *before* the
job moves its batch (a goodput job warms up for its first steps at B0; a model inferred from the log
alone would treat it as fixed until then and never offer it the workers its larger batches use) and
the upper bound is not in the run log, so it is a submit option: ``taiji sched submit --max-batch B``,
the same B the job's policy is given. A job whose log shows its batch changed without the option
adapts too, up to the largest batch it used. Any other job keeps its batch: its efficiency is 1
whatever its noise scale (``(φ+B0)/(φ+B0)``) and the policies see throughput, exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchStats:
    init_batch: int  # B0: the first batch in its run log
    batch: int  # the latest
    largest: int  # the largest it used (in the rows read)
    noise_scale: float | None  # B_noise in samples (latest estimate); None: not measured yet


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def row_noise_scale(row: Mapping[str, Any]) -> float | None:
    """A metrics row's B_noise: its ``gns``, else ``trace_sigma / grad_sqnorm``; None if neither."""
    gns = _positive(row.get("gns"))
    if gns is not None:
        return gns
    trace, sqnorm = _positive(row.get("trace_sigma")), _positive(row.get("grad_sqnorm"))
    return trace / sqnorm if trace is not None and sqnorm is not None else None


def batch_stats(first: Sequence[Mapping[str, Any]], latest: Sequence[Mapping[str, Any]]) -> BatchStats | None:
    """A job's :class:`BatchStats` from its run's first metrics rows and its latest ones (each oldest
    first, as :func:`taiji.metrics.runlog.read_jsonl_ends` returns them); None before any row with a
    batch. Rows without a positive integer ``batch_size`` (a decoupled phase's summary, a torn or
    foreign line) are ignored."""

    def batches(rows: Sequence[Mapping[str, Any]]) -> list[int]:
        return [
            int(r["batch_size"])
            for r in rows
            if isinstance(r.get("batch_size"), int)
            and not isinstance(r.get("batch_size"), bool)
            and r["batch_size"] > 0
        ]

    head, tail = batches(first), batches(latest)
    if not head and not tail:
        return None
    noise = next((n for n in (row_noise_scale(r) for r in reversed(latest)) if n is not None), None)
    return BatchStats(
        init_batch=(head or tail)[0], batch=(tail or head)[-1], largest=max(head + tail), noise_scale=noise
    )


def batch_range(stats: BatchStats | None, batch: int, max_batch: int = 0) -> tuple[int, int]:
    """(B0, the largest batch the job may use) — equal when it keeps its batch. ``batch``: its batch
    as its launcher reports it (0: unknown; then ``stats``'), ``max_batch``: ``submit --max-batch``
    (0: not given). See the module's doc for why."""
    init = stats.init_batch if stats is not None else batch
    init = init or batch
    largest = max(max_batch, stats.largest if stats is not None else 0, batch, init)
    adapts = max_batch > init or (stats is not None and stats.largest != stats.init_batch)
    return (init, largest) if adapts else (batch or init, batch or init)
