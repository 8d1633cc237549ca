"""Optimus with oracle speed and convergence knowledge (Peng et al., EuroSys'18; as Pollux runs it).

The batch size stays at the job's request. Every active job first gets one GPU (Optimus starts a
job at its minimum, SCHEDULER.md §3.7) in submission order while GPUs last; then GPUs go one at
a time to the job whose true remaining time drops the most from one more GPU (marginal gain per
unit of resource), until no GPU is left or no job gains. Speed is estimated for a consolidated
placement of the candidate count; the actual placement keeps a job's hosts when its count holds.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

from taiji.sched.cluster import Allocation, Cluster, packed_shape
from taiji.sched.model import time_to_finish
from taiji.sched.policies.common import place_by_count
from taiji.sched.sim import JobView


@dataclass(frozen=True)
class OptimusOracle:
    name: str = "optimus"

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        def remaining(job: JobView, count: int) -> float:
            shape = packed_shape(count, cluster.gpus_per_host)
            return time_to_finish(job.app, job.progress, shape, job.spec.batch_size)

        free = cluster.total_gpus
        counts: dict[str, int] = {}
        gains: list[tuple[float, int, int]] = []   # (-gain, submission index, count now)
        for index, job in enumerate(jobs):
            if free == 0:
                break
            counts[job.name], free = 1, free - 1
            cap = min(job.app.max_useful_replicas(job.spec.batch_size), cluster.total_gpus)
            if cap > 1:
                gains.append((remaining(job, 2) - remaining(job, 1), index, 1))
        heapq.heapify(gains)
        while free > 0 and gains:
            negative_gain, index, count = heapq.heappop(gains)
            if negative_gain >= 0:
                break
            job = jobs[index]
            counts[job.name], free = count + 1, free - 1
            cap = min(job.app.max_useful_replicas(job.spec.batch_size), cluster.total_gpus)
            if count + 1 < cap:
                heapq.heappush(gains, (remaining(job, count + 2) - remaining(job, count + 1), index, count + 1))
        wanted = sorted(((job.name, counts[job.name], job.spec.batch_size) for job in jobs if job.name in counts),
                        key=lambda item: -item[1])
        return place_by_count(cluster, jobs, wanted)
