"""Elastic dominant-resource fairness over GPUs.

GPUs are the only scheduled resource here, so a job's dominant share is its GPU share, and DRF
becomes progressive filling: repeatedly give one GPU to the job with the smallest share (ties:
earlier submission) until GPUs run out or every job holds the most it can use
(:meth:`Application.max_useful_replicas` at its requested batch). Equal jobs get equal shares.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.policies.common import place_by_count
from taiji.sched.policy import JobView


def fair_counts(capacity: int, caps: Sequence[int]) -> list[int]:
    """Progressive filling of ``capacity`` units over jobs with per-job ``caps`` (index order breaks
    ties): the max-min fair split."""
    counts = [0] * len(caps)
    heap = [(0, index) for index, cap in enumerate(caps) if cap > 0]
    heapq.heapify(heap)
    for _ in range(capacity):
        if not heap:
            break
        held, index = heapq.heappop(heap)
        counts[index] = held + 1
        if counts[index] < caps[index]:
            heapq.heappush(heap, (held + 1, index))
    return counts


@dataclass(frozen=True)
class ElasticDrf:
    name: str = "drf"

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        caps = [min(job.app.max_useful_replicas(job.spec.batch_size), cluster.total_gpus) for job in jobs]
        counts = fair_counts(cluster.total_gpus, caps)
        wanted = [
            (job.name, count, job.spec.batch_size) for job, count in zip(jobs, counts, strict=False) if count
        ]
        # bigger shares first: they are the hardest to place without spreading
        wanted.sort(key=lambda item: -item[1])
        return place_by_count(cluster, jobs, wanted)
