"""The monitors a Job keeps across steps: the gradient noise scale, the gradient variance and the
last agreed statistics.

The two-batch estimator pairs each step's small-batch norms (from every worker's control row)
with the norm of the averaged gradient, which is known only after the allreduce. Every replica
holds the same averaged gradient, so each worker measures only its share of that norm (1/n of
the coordinates: n times less work) and the shares travel in the *next* step's control message;
all workers add the same shares in the same order and pair the sum with that step's small-batch
norms: the estimate lags one step and is identical everywhere by construction (no worker's own
arithmetic, which could differ in the last bit on other hardware, decides anything alone). A
share is only sent to the cluster it was measured in: after a membership change the pair is
dropped.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .gns import GNSEstimator, two_batch_estimates
from .stats import StepStats

AUTO_BUDGET = 0.01  # monitor_every="auto": the norms may take this share of the training time
AUTO_MAX_EVERY = 16  # ... measuring at least every 16th step, so the estimate keeps up


def auto_interval(norm_seconds: float | None, step_seconds: float | None, current: int) -> int:
    """The smallest k for which norms costing ``norm_seconds`` every k-th step of ``step_seconds``
    stay within ``AUTO_BUDGET`` (at most ``AUTO_MAX_EVERY``); ``current`` without both figures."""
    if norm_seconds is None or not step_seconds or step_seconds <= 0:
        return current
    return min(AUTO_MAX_EVERY, max(1, math.ceil(norm_seconds / (AUTO_BUDGET * step_seconds))))


@dataclass(frozen=True)
class SmallBatch:
    """A committed step's agreed small-batch measurement, waiting for its averaged norm."""

    sqnorm: float
    batch: float
    global_batch: float


class Monitors:
    """``every``: measure the gradient norms on every k-th step (0 = never); ``"auto"``: every
    k-th step with k chosen after each measured step from the slowest worker's norm time and the
    median step time — both agreed through the control message, so every worker measures the
    same steps — to keep the norms within ``AUTO_BUDGET`` of the time. The noise-scale estimate
    then averages over ~20 measured steps (decay 0.95), i.e. over up to 20 × k steps."""

    def __init__(self, every: int | str = 1, gns_decay: float = 0.95):
        self.auto = every == "auto"
        self.every = 1 if self.auto else int(every)
        self.gns = GNSEstimator(gns_decay)
        self.stats: StepStats | None = None  # the last committed step's agreed statistics
        self.grad_variance: float | None = None  # mean |g_r − ḡ|² of the last paired step
        self.last_raw_estimates: tuple[float, float] | None = None  # unsmoothed (|G|², tr Σ)
        self._waiting: SmallBatch | None = None
        # this worker's share of |ḡ|² of the last committed, measured step, and the cluster
        # version it was measured in (a share means nothing to another cluster)
        self._own_share, self._own_share_version = math.nan, -1

    def measuring(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def update(self, stats: StepStats, own_share: float | None, version: int) -> None:
        """A step was committed, in cluster ``version``, with these agreed statistics; ``own_share``
        is this worker's share of its averaged gradient's squared norm (for the next control row)."""
        self.stats = stats
        waiting, big = self._waiting, stats.previous_global_sqnorm
        if waiting is not None and big is not None:
            self.grad_variance = waiting.sqnorm - big
            self.gns.update(waiting.sqnorm, big, waiting.batch, waiting.global_batch)
            if waiting.global_batch > waiting.batch > 0:
                self.last_raw_estimates = two_batch_estimates(
                    waiting.sqnorm, big, waiting.batch, waiting.global_batch
                )
        if self.auto and stats.wall_seconds:
            self.every = auto_interval(
                stats.previous_monitor_seconds, statistics.median(stats.wall_seconds), self.every
            )
        measured = stats.small_sqnorm is not None and own_share is not None
        self._waiting = (
            SmallBatch(stats.small_sqnorm, stats.small_batch, stats.global_batch) if measured else None
        )
        self._own_share = own_share if measured else math.nan
        self._own_share_version = version

    def own_share(self, version: int) -> float:
        """What this worker sends as its share of the last measured |ḡ|² in a control message of
        cluster ``version`` (nan: none, or measured in another cluster)."""
        return self._own_share if version == self._own_share_version else math.nan

    def state_dict(self) -> dict:
        waiting = self._waiting
        # (a worker's own share is not state: it is valid only on that worker, in its cluster)
        # the last commit's agreed statistics travel too: a worker whose attempt at that step
        # failed while its peers committed it adopts the commit from them (runtime/job.py)
        return {
            "gns": self.gns.state_dict(),
            "every": self.every,
            "waiting": None if waiting is None else [waiting.sqnorm, waiting.batch, waiting.global_batch],
            "stats": None if self.stats is None else self.stats.to_json(),
            "grad_variance": self.grad_variance,
        }

    def load_state_dict(self, state: dict) -> None:
        self.gns.load_state_dict(state["gns"])
        self._own_share, self._own_share_version = math.nan, -1
        if self.auto:  # the interval "auto" chose from agreed figures; a fixed one stays as configured
            self.every = max(1, int(state.get("every", 1)))
        waiting = state.get("waiting")
        self._waiting = SmallBatch(*waiting) if waiting else None
        stats = state.get("stats")
        self.stats = None if stats is None else StepStats.from_json(stats)
        self.grad_variance = state.get("grad_variance")
