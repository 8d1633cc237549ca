"""Where a cluster change's time goes: ``PhaseClock`` keeps the seconds between named marks.

A recovery's phases, in order: ``failed`` (the failed attempt began -> its failure surfaced here),
``config`` (-> the launcher's next config is known), ``switch`` (-> the old groups are torn down
and the new communicator made), ``groups`` (-> the new version's process groups are built),
``sync`` (-> the TrainState is synced). A resize has the last three. The marks cost one
``perf_counter`` each; the run log's ``recovery``/``resize`` events carry them.
"""

from __future__ import annotations

import time


class PhaseClock:
    def __init__(self, started: float):
        self.started = self.last = started
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> float:
        """``phase`` ended now (a phase marked again, as when a sync is retried, adds up)."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now
        return now

    def rounded(self) -> dict[str, float]:
        return {phase: round(seconds, 4) for phase, seconds in self.seconds.items()}

    def __str__(self) -> str:
        return ", ".join(f"{phase} {seconds:.3f}s" for phase, seconds in self.seconds.items())
