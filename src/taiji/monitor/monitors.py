"""The monitors a Job keeps across steps: the gradient noise scale and the last agreed statistics."""
from __future__ import annotations

from .gns import GNSEstimator, two_batch_estimates
from .stats import StepStats


class Monitors:
    """``every``: measure the gradient norms on every k-th step (0 = never)."""

    def __init__(self, every: int = 1, gns_decay: float = 0.95):
        self.every = every
        self.gns = GNSEstimator(gns_decay)
        self.stats: StepStats | None = None          # the last committed step's agreed statistics
        self.last_raw_estimates: tuple[float, float] | None = None  # unsmoothed (|G|², tr Σ)

    def measuring(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def update(self, stats: StepStats, big_sqnorm: float | None) -> None:
        """A step was committed with these agreed statistics and averaged-gradient norm."""
        self.stats = stats
        if stats.small_sqnorm is None or big_sqnorm is None:
            return
        self.gns.update(stats.small_sqnorm, big_sqnorm, stats.small_batch, stats.global_batch)
        if stats.global_batch > stats.small_batch > 0:
            self.last_raw_estimates = two_batch_estimates(stats.small_sqnorm, big_sqnorm, stats.small_batch,
                                                          stats.global_batch)

    def state_dict(self) -> dict:
        return self.gns.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.gns.load_state_dict(state)
