"""Tiresias, discretized two-dimensional least-attained-service (2D-LAS) as configured in Pollux.

Jobs sit in two queues by attained service (GPU-seconds held): below ``threshold_gpu_s``
(16 GPU-hours, Pollux's setting) in the high-priority queue, at or above it in the low one;
inside a queue FIFO by submission. Each round jobs are taken in that order, all-or-nothing at
their requested size, skipping jobs that do not fit; everything else is preempted. Jobs that keep
their GPU count keep their hosts (no needless restart).

With ``fidelity="pollux"`` (:mod:`~taiji.sched.policies.common`) it decides as Pollux's simulator
does: the demoted queue is in order of demotion (jobs demoted in the same round in submission order),
which the policy remembers from round to round, and new jobs go on the hosts with the most free GPUs.

**A threshold from the workload** (``threshold_gpu_s=None``, ``make_policy(..., las_threshold="auto")``,
the live daemon's default): Tiresias sets its queue thresholds from the distribution of job sizes;
a fixed 16 GPU-hours suits Pollux's 64-GPU traces of hours-long jobs, but on a daemon whose jobs train
for minutes nothing ever attains it and 2D-LAS degenerates to FIFO (a long job holds its slots while
short ones wait). So the one threshold is the median (the lower one, for an even count) of the
predicted sizes — worker-seconds to train the whole job on one worker, from the model the policy
sees (:func:`predicted_service`) — of the last ``SIZE_WINDOW`` jobs seen: about half the jobs, the
short ones, finish in the high queue, and a job is demoted once it has had the service of a typical
one. Sizes are re-read every round (a live job's model improves as it is measured).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.model import progress_rate
from taiji.sched.policies.common import check_fidelity, gang_in_order, placer_for
from taiji.sched.policy import JobView

SIXTEEN_GPU_HOURS = 16 * 3600.0
AUTO = "auto"  # the threshold named so on the command line and in make_policy
SIZE_WINDOW = 100  # jobs whose predicted sizes set the threshold from the workload


def predicted_service(job: JobView) -> float:
    """Worker-seconds the whole job takes on one worker at its initial batch, by its model."""
    app = job.app
    rate = progress_rate(app, (1,), app.init_batch_size, 0)
    return app.target_progress / rate if rate > 0 else float("inf")


def workload_threshold(sizes: Sequence[float]) -> float:
    """The median job size (the lower median for an even count): the threshold set from the workload."""
    return statistics.median_low(sizes)


@dataclass
class Tiresias:
    name: str = "tiresias"
    threshold_gpu_s: float | None = SIXTEEN_GPU_HOURS  # None: set from the workload (module docstring)
    fidelity: str = "taiji"
    demotions: dict[str, int] = field(default_factory=dict, repr=False, compare=False)  # job → demotion order
    sizes: dict[str, float] = field(default_factory=dict, repr=False, compare=False)  # job → predicted size

    def __post_init__(self) -> None:
        check_fidelity(self.fidelity)

    @property
    def threshold_now(self) -> float:
        """The attained service (worker-seconds) at which a job is demoted, as of the last round."""
        if self.threshold_gpu_s is not None:
            return self.threshold_gpu_s
        return workload_threshold(list(self.sizes.values())) if self.sizes else SIXTEEN_GPU_HOURS

    def queue_of(self, job: JobView) -> int:
        """0 = high priority (little service so far), 1 = demoted."""
        return 0 if job.attained_gpu_s < self.threshold_now else 1

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        if self.threshold_gpu_s is None:
            for job in jobs:
                self.sizes.pop(job.name, None)  # re-inserted: the newest estimate, the most recent job last
                self.sizes[job.name] = predicted_service(job)
            for name in list(self.sizes)[:-SIZE_WINDOW]:
                del self.sizes[name]
        by_submission = sorted(jobs, key=lambda job: job.spec.submit_time)
        active = {job.name for job in jobs}
        self.demotions = {name: order for name, order in self.demotions.items() if name in active}
        for job in by_submission:
            if self.queue_of(job) and job.name not in self.demotions:
                self.demotions[job.name] = max(self.demotions.values(), default=-1) + 1
        if self.fidelity == "pollux":
            ordered = sorted(
                by_submission, key=lambda job: (self.queue_of(job), self.demotions.get(job.name, 0))
            )
        else:
            ordered = sorted(by_submission, key=self.queue_of)
        return gang_in_order(cluster, ordered, block_at_first_misfit=False, placer=placer_for(self.fidelity))
