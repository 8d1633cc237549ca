"""Helpers shared by the baseline policies: gang scheduling in a priority order, and placement."""
from __future__ import annotations

from typing import Sequence

from taiji.sched.cluster import Allocation, Cluster, place_all
from taiji.sched.sim import JobView


def gang_in_order(cluster: Cluster, ordered: Sequence[JobView], *,
                  block_at_first_misfit: bool) -> dict[str, Allocation]:
    """All-or-nothing at the requested size, in ``ordered`` priority: a job runs iff its
    ``num_replicas`` still fit. With ``block_at_first_misfit`` (FIFO) the first job that does not
    fit stops everyone behind it; otherwise later, smaller jobs may still run (backfilling)."""
    free = cluster.total_gpus
    wanted: list[tuple[str, int, int]] = []
    for job in ordered:
        need = job.spec.num_replicas
        if need <= free:
            wanted.append((job.name, need, job.spec.batch_size))
            free -= need
        elif block_at_first_misfit:
            break
    return place_by_count(cluster, ordered, wanted)


def place_by_count(cluster: Cluster, jobs: Sequence[JobView],
                   wanted: Sequence[tuple[str, int, int]]) -> dict[str, Allocation]:
    """Place (job, GPUs, batch) choices: jobs already holding that many GPUs keep their hosts; PS
    jobs get their servers (a PS job whose servers do not fit waits this round)."""
    current = {job.name: job.allocation for job in jobs if job.allocation is not None}
    return place_all(cluster, wanted, current, {job.name: job.app for job in jobs})
