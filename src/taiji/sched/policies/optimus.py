"""Optimus with oracle speed and convergence knowledge (Peng et al., EuroSys'18; as Pollux runs it).

The batch size stays at the job's request. Every active job first gets one GPU (Optimus starts a
job at its minimum, docs/reference/scheduler-model.md#optimus) in submission order while GPUs last; then GPUs
go one at a time to the job whose remaining time drops the most from one more GPU (marginal gain per unit of
resource), until no GPU is left or no job gains. Speed is estimated for a consolidated placement of
the candidate count; the actual placement keeps a job's hosts when its count holds.

The gain (:mod:`~taiji.sched.policies.common`, fidelity modes): ``taiji`` (default) — the exact
remaining time at n GPUs minus at n+1 (the current epoch's progress and the batch's efficiency
included); ``pollux`` — as Pollux's simulator ranks it, ``(iteration time(n) − iteration time(n+1)) ×
remaining iterations``, the iterations read from the validation traces at the requested batch from the
end of the current epoch (so they change only at epoch boundaries; in the last epoch they count as 1).
In ``pollux`` mode jobs are placed fewest GPUs first, each on the hosts with the most free GPUs.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from taiji.sched.cluster import Allocation, Cluster, packed_shape
from taiji.sched.model import Application, iteration_time, time_to_finish, trace_iterations
from taiji.sched.policies.common import check_fidelity, place_by_count, placer_for
from taiji.sched.policy import JobView


def remaining_iterations(app: Application, batch_size: int, progress: float) -> float:
    """Optimizer steps at ``batch_size`` left after the current epoch, from the validation traces
    (Pollux's Optimus estimate); 1 in the last epoch."""
    epoch = app.epoch_of(progress)
    if epoch >= app.max_epochs - 1:
        return 1.0
    return trace_iterations(app, batch_size, app.max_epochs - 1) - trace_iterations(app, batch_size, epoch)


@dataclass(frozen=True)
class OptimusOracle:
    name: str = "optimus"
    fidelity: str = "taiji"

    def __post_init__(self) -> None:
        check_fidelity(self.fidelity)

    def gain(self, job: JobView, count: int, gpus_per_host: int) -> float:
        """Seconds one more GPU (``count`` → ``count + 1``) is predicted to save ``job``."""
        now, more = packed_shape(count, gpus_per_host), packed_shape(count + 1, gpus_per_host)
        batch = job.spec.batch_size
        if self.fidelity == "pollux" and isinstance(job.app, Application):
            return (
                iteration_time(job.app, now, batch) - iteration_time(job.app, more, batch)
            ) * remaining_iterations(job.app, batch, job.progress)
        return time_to_finish(job.app, job.progress, now, batch) - time_to_finish(
            job.app, job.progress, more, batch
        )

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        per_host = cluster.gpus_per_host
        free = cluster.total_gpus
        counts: dict[str, int] = {}
        gains: list[tuple[float, int, int]] = []  # (-gain, submission index, count now)
        for index, job in enumerate(jobs):
            if free == 0:
                break
            counts[job.name], free = 1, free - 1
            cap = min(job.app.max_useful_replicas(job.spec.batch_size), cluster.total_gpus)
            if cap > 1:
                gains.append((-self.gain(job, 1, per_host), index, 1))
        heapq.heapify(gains)
        while free > 0 and gains:
            negative_gain, index, count = heapq.heappop(gains)
            if negative_gain >= 0:
                break
            job = jobs[index]
            counts[job.name], free = count + 1, free - 1
            cap = min(job.app.max_useful_replicas(job.spec.batch_size), cluster.total_gpus)
            if count + 1 < cap:
                heapq.heappush(gains, (-self.gain(job, count + 1, per_host), index, count + 1))
        wanted = [(job.name, counts[job.name], job.spec.batch_size) for job in jobs if job.name in counts]
        # taiji: the biggest first, the hardest to place without spreading; Pollux: the smallest first
        wanted.sort(key=lambda item: item[1] if self.fidelity == "pollux" else -item[1])
        return place_by_count(cluster, jobs, wanted, placer_for(self.fidelity))
