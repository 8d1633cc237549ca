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
    boundary's batch decisions. Works with LR schedulers: it scales, it does not set."""

    def __init__(self, rule: str = "linear", base_batch: int | None = None):
        if rule not in RULES:
            raise ConfigError(f"unknown LR scaling rule {rule!r}; use one of {', '.join(RULES)}")
        self._rule = rule
        self.base_batch = base_batch
        self.applied = 1.0  # the factor currently in the learning rate

    @property
    def name(self) -> str:
        return f"LRScaling[{self._rule}]"

    def before_train(self, ctx: Context) -> HookResult:
        if self.base_batch is None:
            self.base_batch = ctx.batch_size
        return None

    def before_step(self, ctx: Context) -> HookResult:
        assert self.base_batch is not None
        wanted = lr_scale(self._rule, ctx.batch_size, self.base_batch, ctx.metrics.gns)
        if math.isclose(wanted, self.applied, rel_tol=1e-9):
            return None
        factor, self.applied = wanted / self.applied, wanted
        return ScaleLR(factor)


def LinearLRScaling(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("linear")``: lr proportional to the global batch (Goyal et al.)."""
    return LRScaling("linear", base_batch)


def SqrtLRScaling(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("sqrt")``: lr proportional to the square root of the global batch."""
    return LRScaling("sqrt", base_batch)


def AdaScaleLR(base_batch: int | None = None) -> LRScaling:
    """``LRScaling("adascale")``: lr scaled by AdaScale's gain, from the gradient noise scale."""
    return LRScaling("adascale", base_batch)
