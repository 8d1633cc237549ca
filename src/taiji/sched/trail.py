"""A job's progress as a live daemon saw it (pure): for a replay's policy view.

The daemon learns a job's progress from readings that arrive some time after the steps they
report (a replay measures that lag per job: ``ResizeCost.seen``). Near a job's end, a round that
comes just after its last step still sees it training, with work left; a replay that showed the
policy the job's true progress would decide as no live round could.
"""

from __future__ import annotations

import numpy as np


class Trail:
    """A job's progress as the daemon saw it: its readings arrive ``lag`` seconds after the steps
    they report (a replay's ``ResizeCost.seen``), so near its end a job still looks to be training."""

    def __init__(self, lag: float):
        self.lag = lag
        self.points: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, progress), times increasing

    def add(self, time: float, progress: float) -> None:
        self.points.append((time, progress))
        while len(self.points) > 2 and self.points[1][0] <= time - self.lag:  # only what ``at`` may still ask
            self.points.pop(0)

    def at(self, now: float) -> float:
        """Its progress ``lag`` seconds before ``now`` (linear between the points recorded)."""
        times, progress = zip(*self.points)
        return float(np.interp(now - self.lag, times, progress))
