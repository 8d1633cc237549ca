"""Helpers shared by the baseline policies: gang scheduling in a priority order, placement, and the
fidelity mode that makes Tiresias and Optimus decide as Pollux's simulator does.

**Fidelity modes** (``taiji sched simulate --fidelity``): ``taiji`` (the default) places a job on the
tightest host that holds it (:func:`~taiji.sched.cluster.pack`) and ranks Optimus' next GPU by the
exact remaining time it saves; ``pollux`` follows Pollux's simulator (traces README) — the hosts with
the most free GPUs first (:func:`~taiji.sched.cluster.most_free_first`), jobs placed in its order
(Tiresias: queue order, the demoted queue in order of demotion; Optimus: fewest GPUs first), and
Optimus' gain from step times × the remaining iterations of the validation traces. The check against
Pollux's published per-job results runs in ``pollux`` mode; taiji's choices stay the default because
best fit keeps whole hosts free for the big jobs and the exact remaining time also counts the current
epoch's progress and the batch's statistical efficiency.
"""

from __future__ import annotations

from collections.abc import Sequence

from taiji.errors import ConfigError
from taiji.sched.cluster import PLACERS, Allocation, Cluster, Placer, pack, place_all
from taiji.sched.policy import JobView

FIDELITY_MODES = ("taiji", "pollux")


def check_fidelity(mode: str) -> None:
    if mode not in FIDELITY_MODES:
        raise ConfigError(f"fidelity mode {mode!r}: expected one of {', '.join(FIDELITY_MODES)}")


def placer_for(mode: str) -> Placer:
    """How a baseline puts a job's GPUs on the free ones in fidelity ``mode``."""
    check_fidelity(mode)
    return PLACERS[mode]


def gang_in_order(
    cluster: Cluster, ordered: Sequence[JobView], *, block_at_first_misfit: bool, placer: Placer = pack
) -> dict[str, Allocation]:
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
    return place_by_count(cluster, ordered, wanted, placer)


def place_by_count(
    cluster: Cluster, jobs: Sequence[JobView], wanted: Sequence[tuple[str, int, int]], placer: Placer = pack
) -> dict[str, Allocation]:
    """Place (job, GPUs, batch) choices: jobs already holding that many GPUs keep their hosts; PS
    jobs get their servers (a PS job whose servers do not fit waits this round)."""
    current = {job.name: job.allocation for job in jobs if job.allocation is not None}
    return place_all(cluster, wanted, current, {job.name: job.app for job in jobs}, placer)
