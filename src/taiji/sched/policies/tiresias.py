"""Tiresias, discretized two-dimensional least-attained-service (2D-LAS) as configured in Pollux.

Jobs sit in two queues by attained service (GPU-seconds held): below ``threshold_gpu_s``
(16 GPU-hours, Pollux's setting) in the high-priority queue, at or above it in the low one;
inside a queue FIFO by submission. Each round jobs are taken in that order, all-or-nothing at
their requested size, skipping jobs that do not fit; everything else is preempted. Jobs that keep
their GPU count keep their hosts (no needless restart).

With ``fidelity="pollux"`` (:mod:`~taiji.sched.policies.common`) it decides as Pollux's simulator
does: the demoted queue is in order of demotion (jobs demoted in the same round in submission order),
which the policy remembers from round to round, and new jobs go on the hosts with the most free GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.policies.common import check_fidelity, gang_in_order, placer_for
from taiji.sched.sim import JobView

SIXTEEN_GPU_HOURS = 16 * 3600.0


@dataclass
class Tiresias:
    name: str = "tiresias"
    threshold_gpu_s: float = SIXTEEN_GPU_HOURS
    fidelity: str = "taiji"
    demotions: dict[str, int] = field(default_factory=dict, repr=False, compare=False)   # job → demotion order

    def __post_init__(self) -> None:
        check_fidelity(self.fidelity)

    def queue_of(self, job: JobView) -> int:
        """0 = high priority (little service so far), 1 = demoted."""
        return 0 if job.attained_gpu_s < self.threshold_gpu_s else 1

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        by_submission = sorted(jobs, key=lambda job: job.spec.submit_time)
        active = {job.name for job in jobs}
        self.demotions = {name: order for name, order in self.demotions.items() if name in active}
        for job in by_submission:
            if self.queue_of(job) and job.name not in self.demotions:
                self.demotions[job.name] = max(self.demotions.values(), default=-1) + 1
        if self.fidelity == "pollux":
            ordered = sorted(by_submission, key=lambda job: (self.queue_of(job), self.demotions.get(job.name, 0)))
        else:
            ordered = sorted(by_submission, key=self.queue_of)
        return gang_in_order(cluster, ordered, block_at_first_misfit=False, placer=placer_for(self.fidelity))
