"""Batch-size policies: follow the gradient noise scale, or keep the per-worker batch fixed."""
from __future__ import annotations

import math

from ..errors import ConfigError
from .base import Context, HookResult, Policy, Resize, SetBatchSize


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
        target = gns_target_batch(ctx.metrics.gns, ctx.batch_size, min_batch=self.min_batch or 1,
                                  max_batch=self._max_batch, multiple=self._multiple,
                                  max_growth=self._max_growth, hysteresis=self._hysteresis)
        if target is None:
            return None
        decisions: list = []
        if self._max_per_worker is not None and target > self._max_per_worker * ctx.size:
            decisions.append(Resize(math.ceil(target / self._max_per_worker)))
            target = self._max_per_worker * ctx.size
            if target <= ctx.batch_size:
                return decisions
        return [SetBatchSize(target)] + decisions


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
