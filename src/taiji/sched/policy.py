"""The scheduling policy's interface (pure): what a policy is shown of each active job
(:class:`JobView`) and what it implements (:class:`Policy`). The simulator (:mod:`taiji.sched.sim`)
and the live scheduler (:mod:`taiji.sched.scheduler`) both call policies through it.

A policy is any object with a ``name`` and

    allocate(now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]

``jobs`` are the active jobs in submission order; the answer maps job names to
:class:`~taiji.sched.cluster.Allocation` (GPUs per host and total batch size, plus servers per host
for a parameter-server job, :mod:`taiji.sched.ps`); a job left out gets no GPUs (it waits, or is
preempted). What a change costs (:mod:`taiji.sched.costs`) is not shown: a policy that weighs it is
given the system's :class:`~taiji.sched.costs.ResizeCost` when it is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.model import AnyApplication
from taiji.sched.workload import JobSpec


@dataclass(frozen=True)
class JobView:
    """What a policy sees of one active job."""

    spec: JobSpec
    app: AnyApplication  # the policy's model of the job: ground truth unless estimation error is on
    progress: float  # statistical progress made (PS jobs: mini-batches)
    attained_gpu_s: float  # GPU-seconds held so far (Tiresias' attained service)
    allocation: Allocation | None  # current allocation, None when waiting
    restarts: int  # allocation changes that cost a pause
    peak_replicas: int = 0  # most GPUs held at once so far (what has been "profiled")
    weight: float = 1.0  # its weight in a weighted objective (PCRR's); live jobs' `submit --weight`
    suspend_cost_s: float | None = None  # its measured suspend + resume seconds (live); None: the system's

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def remaining_progress(self) -> float:
        return self.app.target_progress - self.progress


class Policy(Protocol):
    """A scheduling policy: allocates the cluster to the active jobs at every round."""

    name: str

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]: ...
