"""Learning-rate rules that follow the global batch size: linear, square root, AdaScale gain."""

from __future__ import annotations

import math

from ..errors import ConfigError
from .base import Context, HookResult, Policy, ScaleLR

RULES = ("linear", "sqrt", "adascale")


def lr_scale(rule: str, batch: int, base_batch: int, gns: float | None = None) -> float:
    """The factor the base learning rate should be multiplied by at global batch ``batch``.

    linear: B/B0 (Goyal et al.); sqrt: √(B/B0) (Krizhevsky; Hoffer et al.); adascale: the
    AdaScale gain r = (σ² + |G|²)/(σ²/S + |G|²) with S = B/B0, written with the noise scale
    B_noise = tr Σ/|G|² as (B_noise/B0 + 1)/(B_noise/B + 1): between 1 (no noise: a larger batch
    buys nothing) and S (all noise: it is worth S small steps). Without a GNS estimate yet, 1.
    """
    if batch < 1 or base_batch < 1:
        raise ConfigError(f"batch sizes must be >= 1, got {batch} and {base_batch}")
    scale = batch / base_batch
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "adascale":
        if gns is None or not math.isfinite(gns) or gns <= 0:
            return 1.0
        return (gns / base_batch + 1) / (gns / batch + 1)
    raise ConfigError(f"unknown LR scaling rule {rule!r}; use one of {', '.join(RULES)}")


class LRScaling(Policy):
    """Keep ``lr = base_lr × lr_scale(rule, B, B0)`` as the global batch B changes (by a batch
    policy, or with the cluster under ``BatchPerWorker``). B0 is the batch at the start unless
    given. Put it after batch-size policies, or anywhere: it acts in ``before_step``, after the
    boundary's batch decisions. Works with LR schedulers: it scales, it does not set.

    ``ramp``: a batch change that raises the factor reaches it linearly over this many steps
    (gradual warm-up, Goyal et al.: a larger batch's larger LR is approached, not jumped to, so the
    momentum built at the old LR does not overshoot); a lower factor applies at once. A job that
    starts above B0 ramps up from 1 in its first steps. 0: every change at once."""

    def __init__(self, rule: str = "linear", base_batch: int | None = None, *, ramp: int = 0):
        if rule not in RULES:
            raise ConfigError(f"unknown LR scaling rule {rule!r}; use one of {', '.join(RULES)}")
        if ramp < 0:
            raise ConfigError(f"LRScaling's ramp is a number of steps >= 0, got {ramp}")
        self._rule, self._ramp = rule, ramp
        self.base_batch = base_batch
        self.applied = 1.0  # the factor currently in the learning rate
        self.ramp_from: float | None = None  # the factor a ramp started from, while one runs
        self.ramp_batch = 0  # the batch the last ramp (or change) was for
        self.ramp_step = 0  # the step that ramp started at

    @property
    def name(self) -> str:
        return f"LRScaling[{self._rule}]"

    def before_train(self, ctx: Context) -> HookResult:
        if self.base_batch is None:
            self.base_batch = ctx.batch_size
        return None

    def before_step(self, ctx: Context) -> HookResult:
        assert self.base_batch is not None
        wanted = self._ramped(ctx, lr_scale(self._rule, ctx.batch_size, self.base_batch, ctx.metrics.gns))
        if math.isclose(wanted, self.applied, rel_tol=1e-9):
            return None
        factor, self.applied = wanted / self.applied, wanted
        return ScaleLR(factor)

    def _ramped(self, ctx: Context, wanted: float) -> float:
        """The factor for this step: ``wanted``, or the way to it while a ramp runs."""
        if ctx.batch_size != self.ramp_batch:  # a new batch: ramp towards its factor if it is higher
            self.ramp_batch, self.ramp_step = ctx.batch_size, ctx.step
            self.ramp_from = self.applied if self._ramp and wanted > self.applied else None
        if self.ramp_from is None:
            return wanted
        done = (ctx.step - self.ramp_step + 1) / self._ramp
        if done >= 1 or wanted <= self.ramp_from:
            self.ramp_from = None
            return wanted
        return self.ramp_from + (wanted - self.ramp_from) * done


def LinearLRScaling(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("linear")``: lr proportional to the global batch (Goyal et al.)."""
    return LRScaling("linear", base_batch)


def SqrtLRScaling(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("sqrt")``: lr proportional to the square root of the global batch."""
    return LRScaling("sqrt", base_batch)


def AdaScaleLR(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("adascale")``: lr scaled by AdaScale's gain, from the gradient noise scale."""
    return LRScaling("adascale", base_batch)
