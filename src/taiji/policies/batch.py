"""Batch-size policies: follow the gradient noise scale or maximise goodput, or keep the per-worker
batch fixed."""
from __future__ import annotations

import math
from typing import Sequence

from ..errors import ConfigError
from ..monitor.gns import goodput
from .base import Context, HookResult, Metrics, Policy, Resize, SetBatchSize

MEASURE_WINDOW = 100  # steps: a batch's mean step time follows the latest ~this many


def gns_target_batch(gns: float, current: int, *, min_batch: int, max_batch: int, multiple: int = 8,
                     max_growth: float = 2.0, hysteresis: float = 0.25) -> int | None:
    """The batch size to move to given ``B_noise = gns``, or None to stay.

    The target is B_noise rounded to ``multiple`` and clamped to [min_batch, max_batch]; one change
    moves at most ``max_growth``× either way (the estimate is noisy early on), and a change
    smaller than ``hysteresis`` (relative) is not worth the disruption.
    """
    if not math.isfinite(gns) or gns <= 0:
        return None
    target = max(multiple, int(round(gns / multiple)) * multiple)
    target = min(max(target, min_batch), max_batch)
    target = min(max(target, math.ceil(current / max_growth)), int(current * max_growth))
    if abs(target - current) < hysteresis * current:
        return None
    return target


class GNSBatchSize(Policy):
    """Move the global batch size towards the gradient noise scale ``B_noise`` (McCandlish et al.).

    Small batches are efficient while the gradient signal dominates; once noise dominates
    (B_noise large), larger batches cost little extra optimisation per sample and use more
    parallelism. Checks every ``interval`` steps after ``warmup``; never goes below
    ``min_batch`` (default: the batch the job started with) or above ``max_batch``.

    ``max_per_worker``: the largest slice one worker can hold (memory). A batch that would
    exceed it on the current cluster is capped there, and the policy asks for enough workers
    (``Resize``, within --max-np); the batch grows further once they have joined.
    """

    def __init__(self, max_batch: int = 4096, min_batch: int | None = None, *, interval: int = 50,
                 warmup: int = 100, hysteresis: float = 0.25, max_growth: float = 2.0, multiple: int = 8,
                 max_per_worker: int | None = None):
        if max_batch < 1 or (min_batch is not None and not 1 <= min_batch <= max_batch):
            raise ConfigError(f"GNSBatchSize needs 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
        if interval < 1 or warmup < 0 or hysteresis < 0 or max_growth <= 1 or multiple < 1:
            raise ConfigError("GNSBatchSize needs interval >= 1, warmup >= 0, hysteresis >= 0, "
                              "max_growth > 1, multiple >= 1")
        if max_per_worker is not None and max_per_worker < 1:
            raise ConfigError(f"max_per_worker must be >= 1, got {max_per_worker}")
        self._max_batch, self._interval, self._warmup = max_batch, interval, warmup
        self._hysteresis, self._max_growth, self._multiple = hysteresis, max_growth, multiple
        self._max_per_worker = max_per_worker
        self.min_batch = min_batch
        self.last_check = -1

    def before_train(self, ctx: Context) -> HookResult:
        if self.min_batch is None:
            self.min_batch = min(ctx.batch_size, self._max_batch)
        return None

    def after_step(self, ctx: Context) -> HookResult:
        if ctx.step < self._warmup or ctx.step - self.last_check < self._interval:
            return None
        if ctx.metrics.gns is None:
            return None
        self.last_check = ctx.step
        target = self._target(ctx, ctx.metrics.gns)
        if target is None:
            return None
        decisions: list = []
        if self._max_per_worker is not None and target > self._max_per_worker * ctx.size:
            decisions.append(Resize(math.ceil(target / self._max_per_worker)))
            target = self._max_per_worker * ctx.size
            if target <= ctx.batch_size:
                return decisions
        return [SetBatchSize(target)] + decisions

    def _target(self, ctx: Context, gns: float) -> int | None:
        return gns_target_batch(gns, ctx.batch_size, min_batch=self.min_batch or 1, max_batch=self._max_batch,
                                multiple=self._multiple, max_growth=self._max_growth, hysteresis=self._hysteresis)


def fit_step_time(points: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """``(alpha, beta)`` of ``seconds ≈ alpha + beta·batch`` by least squares over ``(batch,
    seconds, weight)`` points, or None with fewer than two batch sizes. Both are clipped at 0: a
    step that got no slower with a larger batch has all its cost fixed (beta 0), one that grew
    faster than its batch has none (alpha 0)."""
    weight = sum(w for _, _, w in points)
    if len({b for b, _, w in points if w > 0}) < 2:
        return None
    mean_b = sum(b * w for b, _, w in points) / weight
    mean_t = sum(t * w for _, t, w in points) / weight
    spread = sum(w * (b - mean_b) ** 2 for b, _, w in points)
    beta = max(0.0, sum(w * (b - mean_b) * (t - mean_t) for b, t, w in points) / spread)
    alpha = mean_t - beta * mean_b
    if alpha < 0:  # through the origin instead: time proportional to the batch
        alpha, beta = 0.0, sum(w * b * t for b, t, w in points) / sum(w * b * b for b, _, w in points)
    return alpha, beta


def goodput_target_batch(points: Sequence[tuple[float, float, float]], gns: float, current: int, *,
                         min_batch: int, max_batch: int, multiple: int = 8, max_growth: float = 2.0,
                         min_gain: float = 0.05) -> int | None:
    """The global batch with the most goodput within one move of ``current``, or None to stay.

    Goodput (Pollux, Qiao et al. OSDI'21) is samples per second times statistical efficiency:
    ``batch / (alpha + beta·batch) · E(batch)`` with the step time fitted to the measured
    ``(batch, seconds, weight)`` points and ``E`` from ``B_noise = gns``. A move goes at most
    ``max_growth``× either way (the fit extrapolates; the next measurements correct it) and must
    gain at least ``min_gain`` (relative) over staying.
    """
    fit = fit_step_time(points)
    if fit is None or not math.isfinite(gns) or gns <= 0:
        return None
    alpha, beta = fit
    low = max(min_batch, math.ceil(current / max_growth))
    high = min(max_batch, int(current * max_growth))
    candidates = {current} | set(range(multiple * math.ceil(low / multiple), high + 1, multiple))

    def at(batch: int) -> float:
        seconds = alpha + beta * batch
        return goodput(batch / seconds, gns, min_batch, batch) if seconds > 0 else math.inf

    best = max(sorted(candidates), key=at)
    if best == current or at(best) < (1 + min_gain) * at(current):
        return None
    return best


class GoodputBatchSize(GNSBatchSize):
    """Move the global batch to where it makes the most progress per second: goodput, the
    measured samples/s at a batch times its statistical efficiency from the gradient noise scale
    (Pollux). Where a larger batch is hardly faster per sample (compute-bound workers, e.g. CPUs)
    it stays small; where per-step costs dominate (communication, GPUs) it grows as the noise
    scale allows.

    Step times are measured per (workers, batch) from the control message (the slowest worker's
    wall time per step, pauses excluded), skipping ``settle`` steps after each change. While only
    one batch size has been measured on the current cluster, the policy moves as
    ``GNSBatchSize`` would (one probe); from two on, it fits ``seconds = alpha + beta·batch`` and
    picks the best batch within one ``max_growth`` move. Options as ``GNSBatchSize``, plus
    ``min_gain``: the relative goodput gain a move must bring.
    """

    def __init__(self, max_batch: int = 4096, min_batch: int | None = None, *, min_gain: float = 0.05,
                 settle: int = 2, **options):
        super().__init__(max_batch, min_batch, **options)
        if min_gain < 0 or settle < 0:
            raise ConfigError(f"GoodputBatchSize needs min_gain >= 0 and settle >= 0, got {min_gain}, {settle}")
        self._min_gain, self._settle = min_gain, settle
        self.step_times: list[list[float]] = []   # [workers, batch, mean seconds, steps measured]
        self.current: list[int] = [0, 0, 0]        # [workers, batch, steps] of the latest steps

    def after_step(self, ctx: Context) -> HookResult:
        self._measure(ctx.metrics, ctx.batch_size)
        return super().after_step(ctx)

    def _measure(self, metrics: Metrics, batch_size: int) -> None:
        seconds = metrics.worker_step_seconds
        if not seconds or min(seconds) <= 0 or metrics.samples != batch_size:
            return  # the first step, one after a pause or a membership change, an epoch's short last step
        key = [len(seconds), metrics.samples]
        if self.current[:2] != key:
            self.current = key + [0]
        self.current[2] += 1
        if self.current[2] <= self._settle:
            return
        row = next((r for r in self.step_times if r[:2] == key), None)
        if row is None:
            self.step_times.append(key + [max(seconds), 1])
            return
        row[3] += 1
        row[2] += (max(seconds) - row[2]) / min(row[3], MEASURE_WINDOW)

    def _target(self, ctx: Context, gns: float) -> int | None:
        points = [(batch, mean, min(steps, MEASURE_WINDOW)) for workers, batch, mean, steps in self.step_times
                  if workers == ctx.size]
        if len(points) < 2:
            return super()._target(ctx, gns)
        return goodput_target_batch(points, gns, ctx.batch_size, min_batch=self.min_batch or 1,
                                    max_batch=self._max_batch, multiple=self._multiple,
                                    max_growth=self._max_growth, min_gain=self._min_gain)


class BatchPerWorker(Policy):
    """Keep ``per_worker`` samples per worker: the global batch follows the cluster size (the
    usual setting when adding workers should add throughput, as in KungFu's resource
    provisioning). Combine with an LR rule so the learning rate follows the batch."""

    def __init__(self, per_worker: int):
        if per_worker < 1:
            raise ConfigError(f"per_worker must be >= 1, got {per_worker}")
        self._per_worker = per_worker

    def before_step(self, ctx: Context) -> HookResult:
        return SetBatchSize(self._per_worker * ctx.size)
