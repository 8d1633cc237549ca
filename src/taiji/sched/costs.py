"""What a change of a job's allocation costs (pure): the seconds it makes no progress after a start,
a grow, a shrink, a move or a resume, per system (:data:`SYSTEMS`), and how long a grow's new
workers take to join (the job trains at its old size meanwhile). The simulator
(:mod:`taiji.sched.sim`) charges them; the live scheduler measures them per job."""

from __future__ import annotations

from dataclasses import dataclass

from taiji.sched.cluster import Allocation


@dataclass(frozen=True)
class ResizeCost:
    """Seconds a job makes no progress after each kind of allocation change."""

    start: float
    grow: float
    shrink: float
    move: float  # same GPU count, other hosts
    resume: float | None = None  # a preempted job starting again (suspend + resume); None: as ``start``
    boot: float | None = (
        None  # launch -> first step, what the live rules count before any resume; None: ``start``
    )
    join: float = 0.0  # a grow's new workers train this long after it (after ``grow``): the job trains
    # at its old size meanwhile
    stall: float = (
        0.0  # its suspension frees its slots this long after it is asked (the checkpoint, the exit):
    )
    # the starts and grows of that round wait for it (the live rounds: grows after shrinks)
    seen: float = 0.0  # a replay: the daemon sees a (re)started job's first step this long after it (its
    # first reading); until then the job trains but, to the policy, still boots
    listed: float | None = (
        None  # a replay: the daemon lists a (re)started job's workers this long after its launch
    )
    # (its launcher's first status): the policy sees them from then (None: once ``seen``)
    suspend: float | None = (
        None  # a replay: the suspend + resume seconds the daemon's rules counted (None: ``resume``)
    )
    exit: float | None = (
        None  # a replay: its launcher exits this long after its last step (None: ``SimConfig.exit_s``)
    )

    @property
    def resume_s(self) -> float:
        return self.start if self.resume is None else self.resume

    @property
    def boot_s(self) -> float:
        return self.start if self.boot is None else self.boot


SYSTEMS: dict[str, ResizeCost] = {
    # Pollux's simulator: every reallocation is a checkpoint-restart of 30 s.
    "restart": ResizeCost(start=30.0, grow=30.0, shrink=30.0, move=30.0),
    # taiji in place: grow ~0.03 s, shrink ~0.01 s (docs/reference/scheduler-model.md#resize-costs);
    # a move is shrink + grow.
    # Starting a job is taken as a grow [I: not measured separately].
    # A suspended taiji job resumes through a new launcher: boot, load the checkpoint [I: taken as
    # the restart from a checkpoint measured on this kind of machine, ~5 s, benchmarks/README.md's
    # elastic rows; the checkpoint's own stall is ~0.08 s]. The live scheduler fits it per job.
    "taiji": ResizeCost(start=0.03, grow=0.03, shrink=0.01, move=0.04, resume=5.0),
}


def resize_cost(
    cost: ResizeCost, old: Allocation | None, new: Allocation | None, resumed: bool = False
) -> float | None:
    """Pause for changing ``old`` to ``new``; None when nothing changes that needs a pause (a new
    batch alone is free; moving a PS job's servers is a move). ``resumed``: the job ran before (a
    start is then a resume)."""
    if new is None or (
        old is not None and old.placement == new.placement and old.ps_placement == new.ps_placement
    ):
        return None
    if old is None:
        return cost.resume_s if resumed else cost.start
    if new.replicas > old.replicas:
        return cost.grow
    return cost.shrink if new.replicas < old.replicas else cost.move
