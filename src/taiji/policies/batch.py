"""Batch-size policies: follow the gradient noise scale or maximise goodput, or keep the per-worker
batch fixed."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

from ..errors import ConfigError
from ..monitor.gns import goodput
from .base import Context, HookResult, Policy, Resize, SetBatchSize

log = logging.getLogger(__name__)

MEASURE_WINDOW = 50  # steps: a batch's mean step time follows the latest ~this many
# relative: the least error of a batch's mean step time. A shared machine's speed drifts by several
# percent between the windows in which two batch sizes are measured (seen: ±30% over a minute on 2
# CPU cores), which no number of steps within one window averages away.
DRIFT = 0.05


def gns_target_batch(
    gns: float,
    current: int,
    *,
    min_batch: int,
    max_batch: int,
    multiple: int = 8,
    max_growth: float = 2.0,
    hysteresis: float = 0.25,
) -> int | None:
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

    def __init__(
        self,
        max_batch: int = 4096,
        min_batch: int | None = None,
        *,
        interval: int = 50,
        warmup: int = 100,
        hysteresis: float = 0.25,
        max_growth: float = 2.0,
        multiple: int = 8,
        max_per_worker: int | None = None,
    ):
        if max_batch < 1 or (min_batch is not None and not 1 <= min_batch <= max_batch):
            raise ConfigError(f"GNSBatchSize needs 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
        if interval < 1 or warmup < 0 or hysteresis < 0 or max_growth <= 1 or multiple < 1:
            raise ConfigError(
                "GNSBatchSize needs interval >= 1, warmup >= 0, hysteresis >= 0, "
                "max_growth > 1, multiple >= 1"
            )
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
        return gns_target_batch(
            gns,
            ctx.batch_size,
            min_batch=self.min_batch or 1,
            max_batch=self._max_batch,
            multiple=self._multiple,
            max_growth=self._max_growth,
            hysteresis=self._hysteresis,
        )


class StepTimeFit(NamedTuple):
    """``seconds ≈ alpha + beta·batch``, and how far the slope can be trusted: ``beta_se`` is its
    standard error; every plausible line passes through the measurements' centre ``(at_batch,
    at_seconds)``."""

    alpha: float
    beta: float
    beta_se: float
    at_batch: float
    at_seconds: float

    def slopes(self, confidence: float) -> tuple[float, ...]:
        """The extreme slopes within ``confidence`` standard errors, kept where both costs stay >= 0.
        A line through the origin has one: its time ratios are the same at any slope."""
        if self.at_batch <= 0:
            return (self.beta,)
        ceiling = self.at_seconds / self.at_batch
        return tuple(min(max(0.0, self.beta + sign * confidence * self.beta_se), ceiling) for sign in (-1, 1))

    def seconds(self, batch: float, slope: float) -> float:
        return self.at_seconds + slope * (batch - self.at_batch)


def fit_step_time(points: Sequence[tuple[float, float, float]]) -> StepTimeFit | None:
    """Weighted least squares of ``seconds ≈ alpha + beta·batch`` over ``(batch, mean seconds,
    variance of that mean)`` points, or None with fewer than two batch sizes. Both are clipped at
    0: a step that got no slower with a larger batch has all its cost fixed (beta 0), one that grew
    faster than its batch has none (alpha 0, the line through the origin). With three or more
    points that miss the line by more than their variances say, the slope's error grows to match."""
    if len({b for b, _, _ in points}) < 2 or any(v <= 0 for _, _, v in points):
        return None
    weighted = [(b, t, 1.0 / v) for b, t, v in points]
    weight = sum(w for _, _, w in weighted)
    mean_b = sum(b * w for b, _, w in weighted) / weight
    mean_t = sum(t * w for _, t, w in weighted) / weight
    spread = sum(w * (b - mean_b) ** 2 for b, _, w in weighted)
    beta = max(0.0, sum(w * (b - mean_b) * (t - mean_t) for b, t, w in weighted) / spread)
    alpha = mean_t - beta * mean_b
    if alpha >= 0:
        return StepTimeFit(alpha, beta, math.sqrt(_misfit(weighted, alpha, beta, 2) / spread), mean_b, mean_t)
    through_origin = sum(w * b * b for b, _, w in weighted)  # time proportional to the batch
    beta = sum(w * b * t for b, t, w in weighted) / through_origin
    return StepTimeFit(0.0, beta, math.sqrt(_misfit(weighted, 0.0, beta, 1) / through_origin), 0.0, 0.0)


def _misfit(weighted: list[tuple[float, float, float]], alpha: float, beta: float, fitted: int) -> float:
    """The reduced chi-square of the line, at least 1 (1 when no point is left over to judge it)."""
    left = len(weighted) - fitted
    if left <= 0:
        return 1.0
    return max(1.0, sum(w * (t - alpha - beta * b) ** 2 for b, t, w in weighted) / left)


def goodput_target_batch(
    points: Sequence[tuple[float, float, float]],
    gns: float,
    current: int,
    *,
    min_batch: int,
    max_batch: int,
    multiple: int = 8,
    max_growth: float = 2.0,
    min_gain: float = 0.05,
    confidence: float = 2.0,
) -> int | None:
    """The global batch with the most goodput within one move of ``current``, or None to stay.

    Goodput (Pollux, Qiao et al. OSDI'21) is samples per second times statistical efficiency:
    ``batch / (alpha + beta·batch) · E(batch)`` with the step time fitted to the measured
    ``(batch, mean seconds, variance of the mean)`` points and ``E`` from ``B_noise = gns``. A move
    goes at most ``max_growth``× either way and must gain at least ``min_gain`` (relative) over
    staying; beyond the measured batches, for every slope within ``confidence`` standard errors of
    the fit: a fit from a few noisy steps extrapolates badly, and a move it cannot vouch for costs
    sample efficiency for nothing. Within them the fitted line is taken at its word (a wrong move
    there stays between batches already measured, and its own measurement corrects the fit).
    """
    fit = fit_step_time(points)
    if fit is None or not math.isfinite(gns) or gns <= 0:
        return None
    low = max(min_batch, math.ceil(current / max_growth))
    high = min(max_batch, int(current * max_growth))
    candidates = {current} | set(range(multiple * math.ceil(low / multiple), high + 1, multiple))
    slopes = fit.slopes(confidence)
    measured = (min(b for b, _, _ in points), max(b for b, _, _ in points))

    def worst_gain(batch: int) -> float:
        def at(size: int, slope: float) -> float:
            return goodput(size / fit.seconds(size, slope), gns, min_batch, size)

        inside = measured[0] <= batch <= measured[1]
        return min(at(batch, slope) / at(current, slope) for slope in ((fit.beta,) if inside else slopes))

    best = max(sorted(candidates), key=worst_gain)
    if best == current or worst_gain(best) < 1 + min_gain:
        return None
    return best


class GoodputBatchSize(GNSBatchSize):
    """Move the global batch to where it makes the most progress per second: goodput, the
    measured samples/s at a batch times its statistical efficiency from the gradient noise scale
    (Pollux). Where a larger batch is hardly faster per sample (compute-bound workers, e.g. CPUs)
    it stays small; where per-step costs dominate (communication, GPUs) it grows as the noise
    scale allows.

    Step times are measured per (strategy and topology, workers, batch) from the control message
    (the slowest worker's wall time per step, pauses excluded; a running mean and variance over the
    latest ``MEASURE_WINDOW`` steps), skipping ``settle`` steps after each change. A batch counts once
    ``min_steps`` of its steps are measured, and the policy holds still while the current one is
    being measured. While only one batch size is measured on the current cluster, it moves as
    ``GNSBatchSize`` would (one probe); from two on, it fits ``seconds = alpha + beta·batch`` and
    picks the best batch within one ``max_growth`` move that gains ``min_gain`` (relative) for
    every slope within ``confidence`` standard errors of the fit. ``drift``: the relative error a
    batch's mean step time keeps however long it is measured (the machine's speed wanders between
    the windows two batches are timed in); lower it on steady, dedicated hardware to move sooner.
    """

    def __init__(
        self,
        max_batch: int = 4096,
        min_batch: int | None = None,
        *,
        min_gain: float = 0.05,
        settle: int = 2,
        min_steps: int = 20,
        confidence: float = 2.0,
        drift: float = DRIFT,
        **options,
    ):
        super().__init__(max_batch, min_batch, **options)
        if min_gain < 0 or settle < 0 or min_steps < 2 or confidence < 0 or drift <= 0:
            raise ConfigError(
                "GoodputBatchSize needs min_gain >= 0, settle >= 0, min_steps >= 2, confidence >= 0 "
                f"and drift > 0, got {min_gain}, {settle}, {min_steps}, {confidence}, {drift}"
            )
        self._min_gain, self._settle, self._min_steps, self._confidence = (
            min_gain,
            settle,
            min_steps,
            confidence,
        )
        self._drift = drift
        # [setup, workers, batch, mean seconds, steps measured, variance]; setup: "strategy:topology"
        self.step_times: list[list] = []
        self.current: list = ["", 0, 0, 0]  # [setup, workers, batch, steps] of the latest steps

    def after_step(self, ctx: Context) -> HookResult:
        self._measure(ctx)
        return super().after_step(ctx)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if len(self.current) != 4 or any(len(row) != 6 for row in self.step_times):
            log.info("GoodputBatchSize: step times saved by an older taiji are dropped; measuring afresh")
            self.step_times, self.current = [], ["", 0, 0, 0]

    @staticmethod
    def _setup(ctx: Context) -> str:
        return f"{ctx.strategy}:{ctx.topology}"  # a switch of either changes what a step costs

    def _measure(self, ctx: Context) -> None:
        metrics, seconds = ctx.metrics, ctx.metrics.worker_step_seconds
        if not seconds or min(seconds) <= 0 or metrics.samples != ctx.batch_size:
            return  # the first step, one after a pause or a membership change, an epoch's short last step
        key = [self._setup(ctx), len(seconds), metrics.samples]
        if self.current[:3] != key:
            self.current = key + [0]
        self.current[3] += 1
        if self.current[3] <= self._settle:
            return
        row = next((r for r in self.step_times if r[:3] == key), None)
        if row is None:
            self.step_times.append(key + [max(seconds), 1, 0.0])
            return
        row[4] += 1
        share = 1 / min(row[4], MEASURE_WINDOW)  # exact mean and variance up to the window, then exponential
        deviation = max(seconds) - row[3]
        row[3] += share * deviation
        row[5] = (1 - share) * (row[5] + share * deviation**2)

    def _target(self, ctx: Context, gns: float) -> int | None:
        setup = self._setup(ctx)
        rows = {
            batch: (mean, steps, variance)
            for where, workers, batch, mean, steps, variance in self.step_times
            if (where, workers) == (setup, ctx.size) and steps >= self._min_steps
        }
        if ctx.batch_size not in rows:
            return (
                None if self.current[:3] == [setup, ctx.size, ctx.batch_size] else super()._target(ctx, gns)
            )
        if len(rows) < 2:
            return super()._target(ctx, gns)
        points = [
            (batch, mean, variance / min(steps, MEASURE_WINDOW) + (self._drift * mean) ** 2)
            for batch, (mean, steps, variance) in rows.items()
        ]
        return goodput_target_batch(
            points,
            gns,
            ctx.batch_size,
            min_batch=self.min_batch or 1,
            max_batch=self._max_batch,
            multiple=self._multiple,
            max_growth=self._max_growth,
            min_gain=self._min_gain,
            confidence=self._confidence,
        )


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
