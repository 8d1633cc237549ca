"""Tiresias, discretized two-dimensional least-attained-service (2D-LAS) as configured in Pollux.

Jobs sit in two queues by attained service (GPU-seconds held): below ``threshold_gpu_s``
(16 GPU-hours, Pollux's setting) in the high-priority queue, at or above it in the low one;
inside a queue FIFO by submission. Each round jobs are taken in that order, all-or-nothing at
their requested size, skipping jobs that do not fit; everything else is preempted. Jobs that keep
their GPU count keep their hosts (no needless restart).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.policies.common import gang_in_order
from taiji.sched.sim import JobView

SIXTEEN_GPU_HOURS = 16 * 3600.0


@dataclass(frozen=True)
class Tiresias:
    name: str = "tiresias"
    threshold_gpu_s: float = SIXTEEN_GPU_HOURS

    def queue_of(self, job: JobView) -> int:
        """0 = high priority (little service so far), 1 = demoted."""
        return 0 if job.attained_gpu_s < self.threshold_gpu_s else 1

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        ordered = sorted(jobs, key=lambda job: (self.queue_of(job), job.spec.submit_time))
        return gang_in_order(cluster, ordered, block_at_first_misfit=False)
