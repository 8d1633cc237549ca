"""When the live scheduler suspends a job (pure): the hysteresis that keeps a policy's 0 from
thrashing a job, and priority preemption for gangs.

A taiji job can give up all its workers: the daemon asks its launcher to checkpoint at the next
step boundary and stop (``taiji run --checkpoint-dir``, SIGTERM, exit 75), and starts it again from
that checkpoint at whatever size and on whatever hosts a later round gives it. That costs far more
than an in-place resize — the checkpoint stall, a process boot and the load — so a policy's 0 for a
running job is honoured only when :func:`may_suspend` says so (PCRR's LP already charges a suspension
the job's measured suspend + resume, ``lp.py``; these rules are the safety net for every policy):

- the job may be preempted (``submit --no-preempt`` says it may not);
- it has committed a step since it last started: a job still booting is never suspended (its boot
  would be thrown away for nothing saved; on a loaded machine a boot takes tens of seconds, and
  Tiresias's newest arrival always outranks the job before it);
- if it last started as a *resume* (a suspension or a lost home host stopped it before), it has
  run at least ``min_run_factor`` × its suspend/resume cost since (what a resume cost is paid back
  by before it may be paid again). A job's first start is not held back: no resume cost was paid
  for it, and its boot — noisy, tens of seconds when the machine is loaded — would otherwise decide
  how long a short arrival waits behind it. The hourly bound still holds;
- it was suspended fewer than ``max_per_hour`` times in the last hour: **at most
  ``max_per_hour`` suspensions per job per hour** (4 by default), whatever the policy asks;
- it has more than ``min_left_factor`` × its suspend/resume cost left to train (at its present
  size, as its fitted model predicts): a job about to finish frees its slots sooner by finishing
  than a suspension pays back — the suspension delays it by its whole resume and by what runs in
  its place, while those that wait for it gain at most what it has left. Tiresias demotes a job by
  attained service alone, so without this rule it suspends the jobs closest to their end.

**Priority classes** (``submit --priority P``, higher first): a waiting job that the policy left
without its ``--min-np`` may suspend running, preemptible jobs of lower classes, but only if that
frees enough slots *on one host* for its ``--min-np`` (a job starts on one host; gang-aware: a
preemption that would not let it start suspends nobody). :func:`priority_victims` picks the fewest
such jobs (then the lowest classes, the fewest workers, the latest started).
The hysteresis holds for them too.

**How a launcher's exit leaves its job** (:func:`suspension_of`): it stopped on the daemon's notice
with a checkpoint (exit 75), or its home host was lost and a checkpoint exists: suspended at that
checkpoint's step. Asked to suspend and stopped before any checkpoint was complete (the notice came
while its workers were still starting, or its first save failed): suspended at step 0 — resumed,
it starts over (``--resume auto`` with no checkpoint starts fresh), which is what it would have had
to redo anyway. Anything else ended it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from ..errors import ConfigError

HOUR_S = 3600.0
MAX_CANDIDATES = 10  # per host, the lowest classes first: at most 2^10 sets are weighed


@dataclass(frozen=True)
class SuspendRules:
    max_per_hour: int = 4  # suspensions of one job in any hour, at most
    min_run_factor: float = 1.0  # a resumed job runs this × its suspend/resume cost before another
    guess_cost_s: float = 10.0  # a job's suspend/resume cost until one was measured
    min_left_factor: float = 1.0  # a job with less than this × its cost left to train is not suspended

    def __post_init__(self) -> None:
        if min(self.max_per_hour, self.min_run_factor, self.guess_cost_s, self.min_left_factor) < 0:
            raise ConfigError(f"suspension rules must be >= 0, got {self}")


@dataclass(frozen=True)
class Running:
    """What preemption needs of a running job."""

    id: str
    priority: int
    preemptible: bool
    placement: tuple[int, ...]  # workers per host
    started: float  # when it last (re)started


def suspension_of(
    resumable_exit: bool, stopped_unsaved: bool, asked: bool, home_lost: bool, latest: int | None, home: str
) -> tuple[int, str] | None:
    """(the step it resumes from, why — empty when it was asked to stop) if the launcher's exit
    leaves its job suspended, None if the job ended (see the module's doc). ``resumable_exit``: it
    exited "stopped, resumable"; ``stopped_unsaved``: "stopped on a notice, nothing saved";
    ``latest``: its latest complete checkpoint's step; ``home``: its home host's name."""
    if latest is not None and resumable_exit:
        return latest, ""
    if latest is not None and home_lost:
        return latest, f"its home host {home} was lost"
    if asked and stopped_unsaved and latest is None:
        return 0, "stopped before its first checkpoint: it starts over"
    return None


def may_suspend(
    preemptible: bool,
    suspensions: Sequence[float],
    started: float,
    now: float,
    cost_s: float,
    rules: SuspendRules,
    trained: bool = True,
    left_s: float = math.inf,
    resumed: bool = True,
) -> bool:
    """Whether a running job may be suspended now (see the module's doc): ``suspensions`` are the
    times it was suspended before, ``started`` when it last (re)started, ``cost_s`` its measured
    suspend + resume seconds, ``trained`` whether it has committed a step since it (re)started,
    ``left_s`` the seconds it still has to train at its present size (unknown: infinite),
    ``resumed`` whether it last started as a resume (only then does the minimum run apply)."""
    if not preemptible or not trained or left_s <= rules.min_left_factor * cost_s:
        return False
    recent = sum(1 for t in suspensions if now - t < HOUR_S)
    return recent < rules.max_per_hour and (not resumed or now - started >= rules.min_run_factor * cost_s)


def priority_victims(
    need: int, priority: int, free: Sequence[int], running: Sequence[Running]
) -> tuple[int, list[str]] | None:
    """(host, the fewest running jobs of classes below ``priority``) whose suspension leaves
    ``need`` free slots on that host (``free``: slots free per host now); None if no such set
    exists. Candidates must be preemptible (the caller has already applied the hysteresis)."""
    best: tuple[tuple, list[str]] | None = None
    for host, free_here in enumerate(free):
        if free_here >= need:
            return host, []
        candidates = sorted(
            (
                job
                for job in running
                if job.preemptible and job.priority < priority and job.placement[host] > 0
            ),
            key=lambda job: (job.priority, -job.started, job.id),
        )
        candidates = candidates[:MAX_CANDIDATES]
        for count in range(1, len(candidates) + 1):
            fits = [
                combo
                for combo in combinations(candidates, count)
                if free_here + sum(job.placement[host] for job in combo) >= need
            ]
            if fits:  # the fewest jobs; then the lowest classes, the fewest workers, the latest started
                combo = min(
                    fits,
                    key=lambda c: (
                        max(j.priority for j in c),
                        sum(sum(j.placement) for j in c),
                        -min(j.started for j in c),
                    ),
                )
                cost = (count, max(j.priority for j in combo), sum(sum(j.placement) for j in combo), host)
                if best is None or cost < best[0]:
                    best = (cost, [job.id for job in combo])
                break
    return None if best is None else (best[0][3], best[1])
