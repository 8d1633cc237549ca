"""Early stopping on an agreed metric."""

from __future__ import annotations

import math

from ..errors import ConfigError
from .base import Context, HookResult, Metrics, Policy, Stop

METRICS = tuple(f for f in Metrics.__dataclass_fields__ if f != "samples")


class EarlyStop(Policy):
    """Stop when ``metric`` (smoothed by an EMA) reaches ``target``, or has not improved by
    ``min_delta`` for ``patience`` checks; checks every ``every`` steps. ``mode`` is "min" for
    metrics that should fall (loss) and "max" for ones that should rise."""

    def __init__(
        self,
        metric: str = "loss",
        *,
        target: float | None = None,
        patience: int | None = None,
        min_delta: float = 0.0,
        mode: str = "min",
        every: int = 50,
        smoothing: float = 0.9,
    ):
        if metric not in METRICS:
            raise ConfigError(f"EarlyStop can watch {', '.join(METRICS)}; got {metric!r}")
        if mode not in ("min", "max") or every < 1 or not 0 <= smoothing < 1:
            raise ConfigError("EarlyStop needs mode 'min' or 'max', every >= 1, 0 <= smoothing < 1")
        if target is None and patience is None:
            raise ConfigError("EarlyStop needs a target, a patience, or both")
        self._metric, self._target, self._patience = metric, target, patience
        self._min_delta, self._sign, self._every, self._smoothing = (
            min_delta,
            (1 if mode == "min" else -1),
            every,
            smoothing,
        )
        self.ema: float | None = None
        self.best: float | None = None
        self.bad_checks = 0

    def after_step(self, ctx: Context) -> HookResult:
        value = getattr(ctx.metrics, self._metric)
        if value is None or not math.isfinite(value):
            return None
        self.ema = value if self.ema is None else self._smoothing * self.ema + (1 - self._smoothing) * value
        if ctx.step % self._every:
            return None
        if self._target is not None and self._sign * (self.ema - self._target) <= 0:
            return Stop(f"{self._metric} {self.ema:.4g} reached the target {self._target:g}")
        if self._patience is None:
            return None
        if self.best is None or self._sign * (self.best - self.ema) > self._min_delta:
            self.best, self.bad_checks = self.ema, 0
            return None
        self.bad_checks += 1
        if self.bad_checks >= self._patience:
            return Stop(
                f"{self._metric} did not improve by {self._min_delta:g} in {self._patience} checks "
                f"(best {self.best:.4g})"
            )
        return None
