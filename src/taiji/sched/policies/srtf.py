"""Shortest remaining time first with oracle knowledge (a reference, not a deployable policy).

Each round jobs are ordered by their true remaining time at the requested size (consolidated
placement, requested batch) and run all-or-nothing in that order, preempting the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from taiji.sched.cluster import Allocation, Cluster, packed_shape
from taiji.sched.model import time_to_finish
from taiji.sched.policies.common import gang_in_order
from taiji.sched.policy import JobView


def remaining_at_request(job: JobView, cluster: Cluster) -> float:
    shape = packed_shape(job.spec.num_replicas, cluster.gpus_per_host)
    return time_to_finish(job.app, job.progress, shape, job.spec.batch_size)


@dataclass(frozen=True)
class SrtfOracle:
    name: str = "srtf"

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        ordered = sorted(jobs, key=lambda job: (remaining_at_request(job, cluster), job.spec.submit_time))
        return gang_in_order(cluster, ordered, block_at_first_misfit=False)
