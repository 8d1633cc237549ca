"""Gradient noise scale with the unbiased two-batch estimator (McCandlish et al., 2018).

With a small-batch gradient of batch ``b_small`` (each worker's own) and a large-batch one of
``b_big`` (their weighted average), the expected squared norms are
``E|g_b|² = |G|² + tr(Σ)/b``; two batch sizes give two equations, whose solution is

    |G|²  ≈ (b_big·|g_big|² − b_small·|g_small|²) / (b_big − b_small)
    tr Σ  ≈ (|g_small|² − |g_big|²) / (1/b_small − 1/b_big)

Each is unbiased but noisy; numerator and denominator are smoothed separately with
bias-corrected exponential moving averages and ``B_noise = tr Σ / |G|²``. With SGD this is the
critical batch size of the loss; with Adam the gradients measured are the raw ones (before
preconditioning), so ``B_noise`` describes the raw gradient's noise, not the update's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def statistical_efficiency(noise_scale: float, init_batch: float, batch: float) -> float:
    """Progress per sample at ``batch`` relative to ``init_batch``: ``(φ+B0)/(φ+B)`` with the noise
    scale ``φ = B_noise`` (Pollux's E(B); from McCandlish et al.'s steps/samples trade-off)."""
    return (noise_scale + init_batch) / (noise_scale + batch)


def goodput(throughput: float, noise_scale: float, init_batch: float, batch: float) -> float:
    """Pollux's goodput: samples per second times statistical efficiency."""
    return throughput * statistical_efficiency(noise_scale, init_batch, batch)


def two_batch_estimates(
    small_sqnorm: float, big_sqnorm: float, b_small: float, b_big: float
) -> tuple[float, float]:
    """Unbiased (|G|², tr Σ) from mean small-batch and large-batch squared gradient norms."""
    if not b_big > b_small > 0:
        raise ValueError(f"need b_big > b_small > 0, got {b_big}, {b_small}")
    g2 = (b_big * big_sqnorm - b_small * small_sqnorm) / (b_big - b_small)
    trace = (small_sqnorm - big_sqnorm) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass
class _BiasCorrectedEMA:
    decay: float
    value: float = 0.0
    weight: float = 0.0

    def update(self, x: float) -> None:
        self.value = self.decay * self.value + (1.0 - self.decay) * x
        self.weight = self.decay * self.weight + (1.0 - self.decay)

    @property
    def estimate(self) -> float | None:
        return self.value / self.weight if self.weight > 0 else None


class GNSEstimator:
    """Smoothed |G|², tr Σ and B_noise. Non-finite inputs are skipped, never propagated."""

    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._g2 = _BiasCorrectedEMA(decay)
        self._trace = _BiasCorrectedEMA(decay)
        self.skipped = 0
        self.updates = 0

    def update(self, small_sqnorm: float, big_sqnorm: float, b_small: float, b_big: float) -> bool:
        """Fold in one step's measurement; False if it was skipped (non-finite or degenerate)."""
        values = (small_sqnorm, big_sqnorm, b_small, b_big)
        if not all(math.isfinite(v) for v in values) or not b_big > b_small > 0:
            self.skipped += 1
            return False
        g2, trace = two_batch_estimates(small_sqnorm, big_sqnorm, b_small, b_big)
        self._g2.update(g2)
        self._trace.update(trace)
        self.updates += 1
        return True

    @property
    def grad_sqnorm(self) -> float | None:
        return self._g2.estimate

    @property
    def trace_sigma(self) -> float | None:
        return self._trace.estimate

    @property
    def b_noise(self) -> float | None:
        g2, trace = self.grad_sqnorm, self.trace_sigma
        if g2 is None or trace is None or g2 <= 0:
            return None
        return trace / g2

    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "g2": [self._g2.value, self._g2.weight],
            "trace": [self._trace.value, self._trace.weight],
            "skipped": self.skipped,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state["decay"])
        self._g2 = _BiasCorrectedEMA(self.decay, *map(float, state["g2"]))
        self._trace = _BiasCorrectedEMA(self.decay, *map(float, state["trace"]))
        self.skipped, self.updates = int(state["skipped"]), int(state["updates"])
