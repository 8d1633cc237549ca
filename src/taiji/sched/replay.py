"""A replay's policy inputs as the live daemon built them (pure): what a policy saw of a job
before its first step, for :class:`~taiji.sched.sim.SimConfig`'s ``daemon_view``.

Until a job reports a step the daemon has no step time of it: ``Scheduler.view_of`` then shows
the policy compute that scales linearly at a typical job's speed — the median, over the jobs
measured by then, of their worker-seconds per sample at their fastest size — with the work it was
submitted with. A replay builds that guess with the same functions (:mod:`taiji.sched.live`),
from the step times each job's run log shows, so two jobs not yet measured look alike to the
policy, as they did live, whatever their true speeds.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .live import Measured, policy_application, seconds_per_sample, typical
from .model import Application
from .scheduler import GUESS_SECONDS_PER_SAMPLE


@dataclass(frozen=True)
class DaemonGuess:
    """The daemon's model of a job before its first step."""

    measured: Mapping[str, Sequence[Measured]]  # each job's step times per size (at ``batch``)
    work: Mapping[str, int]  # samples each job was submitted to train (``submit --work``)
    batch: int
    max_replicas: int  # min(its --max-np, the slots)

    def guess(self, name: str, measured: Sequence[str]) -> Application:
        per_sample = typical(
            (
                seconds_per_sample((m.replicas, self.batch, m.step_seconds) for m in self.measured[j])
                for j in measured
            ),
            GUESS_SECONDS_PER_SAMPLE,
        )
        return _unmeasured(name, per_sample, self.batch, self.work[name], self.max_replicas)


@functools.lru_cache(maxsize=4096)
def _unmeasured(name: str, per_sample: float, batch: int, work: int, max_replicas: int) -> Application:
    """One guess per (job, speed): the same Application round after round (policies cache by it)."""
    return policy_application(name, (), per_sample, batch, work, max_replicas, batch, batch)
