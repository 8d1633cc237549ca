"""FIFO: submission order, gang at the requested size, no preemption, no backfilling.

The defining behaviour is head-of-line blocking: a waiting job that does not fit holds back every
job submitted after it, even ones that would fit. Running jobs are never disturbed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.policies.common import gang_in_order
from taiji.sched.policy import JobView


@dataclass(frozen=True)
class Fifo:
    name: str = "fifo"

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        running = [job for job in jobs if job.allocation is not None]
        waiting = [job for job in jobs if job.allocation is None]
        # running jobs first: they are never preempted, and fit because they already do
        return gang_in_order(cluster, running + waiting, block_at_first_misfit=True)
