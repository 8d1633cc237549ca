"""Applying a scheduling round to live jobs without ever oversubscribing a host (pure).

The live scheduler (``taiji sched serve``) runs the simulator's policies each round and gets a
target placement per job: workers per host. Live jobs do not change at once: a resize is proposed
to a job's store and lands when its workers have switched to the new cluster version. This
module decides *what to ask and when*, from what it is told, so that at every instant

    for every host h:  sum over jobs of max(holds(j)[h], asked(j)[h])  <=  slots[h]

where ``holds`` is what a job's store says it runs now and ``asked`` the last placement asked of
it that it has not reached yet. A slot is counted for the larger of the two until they agree:
a grow occupies its slots from the moment it is asked (its workers may appear at any time), and
a shrink frees them only once it has landed.

A round therefore applies **shrinks first** (every job that loses a worker on some host is asked
for the per-host minimum of its current and target placement; a job moving to other hosts keeps
one worker until its grow lands), waits until each has landed or
``shrink_timeout`` passed (a shrink that never lands keeps its slots reserved), **then grows**,
each clipped per host to what is not held by others. A grow clipped short is deferred (the next
round asks for the rest). A job that ended (gone from ``holds``) frees everything it held or was asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError

Placement = tuple[int, ...]  # workers per host, index = host


@dataclass(frozen=True)
class Change:
    """Ask ``job`` to run ``after`` (it holds ``before``); ``before`` all zeros: start (or resume)
    the job; ``after`` all zeros: suspend it (its slots are free once its launcher is gone)."""

    job: str
    before: Placement
    after: Placement

    @property
    def kind(self) -> str:
        if not any(self.before):
            return "start"
        if not any(self.after):
            return "suspend"
        if all(a <= b for a, b in zip(self.after, self.before)):
            return "shrink"
        return "grow" if all(a >= b for a, b in zip(self.after, self.before)) else "move"


def elementwise_max(a: Placement, b: Placement) -> Placement:
    return tuple(max(x, y) for x, y in zip(a, b))


def elementwise_min(a: Placement, b: Placement) -> Placement:
    return tuple(min(x, y) for x, y in zip(a, b))


def keep_at_least(lower: Placement, heading: Placement, target: Placement, count: int) -> Placement:
    """``lower`` with workers of ``heading`` kept back until it has ``count`` (a running job never
    goes below its minimum, nor to zero, on its way to ``target``): the hosts the target keeps
    first, then the others in order."""
    out = list(lower)
    for host in sorted(range(len(out)), key=lambda h: (target[h] == 0, h)):
        out[host] += max(0, min(count - sum(out), heading[host] - out[host]))
    return tuple(out)


@dataclass(frozen=True)
class Ask:
    """The last placement asked of a job (``target``), and the slots it keeps reserved until the
    job reached it (``reserve``: the largest placement any unreached ask of it named)."""

    target: Placement
    reserve: Placement
    shrink: bool
    version: int = -1  # the job's cluster version when asked (-1: not known)

    def reached(self, holds: Placement, version: int = -1) -> bool:
        if self.shrink:  # gave back at least what was asked (a failure may have taken more)
            done = all(h <= t for h, t in zip(holds, self.target))
        else:
            done = all(h >= t for h, t in zip(holds, self.target))
        if not done or self.reserve == elementwise_max(holds, self.target):
            return done
        # it also reserves an earlier ask's slots: their workers may still arrive until the job
        # has moved to a newer version since this ask
        return self.version < 0 or version > self.version


def held(holds: Mapping[str, Placement], asked: Mapping[str, Ask], hosts: int) -> Placement:
    """Slots taken per host: per job the larger of what it holds and what its asks reserve."""
    total = [0] * hosts
    zero = (0,) * hosts
    for job in set(holds) | set(asked):
        ask = asked.get(job)
        for h, n in enumerate(elementwise_max(holds.get(job, zero), ask.reserve if ask else zero)):
            total[h] += n
    return tuple(total)


def oversubscribed(slots: Placement, holds: Mapping[str, Placement]) -> list[int]:
    """Hosts where the jobs' workers exceed the slots (the audit of a timeline's instant)."""
    used = held(holds, {}, len(slots))
    return [h for h, (n, cap) in enumerate(zip(used, slots)) if n > cap]


@dataclass
class Rounds:
    """The round in progress and the asks not reached yet; ``start`` and ``tick`` return the
    changes to make (each job's launcher proposes them; a job's latest proposal wins).

    ``holds`` names every job that has not ended, with all zeros while it has no workers yet
    (queued, or started and still joining); a job missing from it has ended."""

    slots: Placement
    shrink_timeout: float = 30.0
    asked: dict[str, Ask] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)  # grows of the last round that did not fit
    _targets: dict[str, Placement] = field(default_factory=dict)
    _shrinking: set[str] = field(default_factory=set)
    _started: float = 0.0
    _minimum: dict[str, int] = field(default_factory=dict)
    _versions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.slots or any(n < 0 for n in self.slots):
            raise ConfigError(f"Rounds: slots must be >= 0 per host, got {self.slots}")

    @property
    def in_progress(self) -> bool:
        return bool(self._targets)

    def start(
        self,
        now: float,
        holds: Mapping[str, Placement],
        targets: Mapping[str, Placement],
        minimum: Mapping[str, int] | None = None,
        versions: Mapping[str, int] | None = None,
    ) -> list[Change]:
        """Begin a round towards ``targets`` (jobs not named keep what they hold): the shrinks now,
        the grows from ``tick`` once the shrinks landed. A round still in progress is replaced.
        ``minimum``: workers a job needs to start (a start clipped below it waits); ``versions``:
        each job's cluster version, so an ask is reached only once the job has moved past it."""
        for job, target in targets.items():
            if len(target) != len(self.slots) or any(n < 0 for n in target):
                raise ConfigError(f"job {job!r}: target {target} does not fit {len(self.slots)} host(s)")
        self._minimum, self._versions = dict(minimum or {}), dict(versions or {})
        self._forget_reached(holds)
        self._targets = {job: t for job, t in targets.items() if job in holds}
        self._started, self.deferred = now, []
        changes = []
        for job, target in self._targets.items():
            ask = self.asked.get(job)
            heading = ask.target if ask else holds[job]  # where the job is going now
            lower = elementwise_min(heading, target)
            if any(heading) and any(target):  # a running job keeps its minimum (and a worker) meanwhile
                lower = keep_at_least(lower, heading, target, max(1, self._minimum.get(job, 1)))
            if lower != heading:
                changes.append(Change(job, holds[job], lower))
                self._ask(job, lower, holds[job], shrink=True)
        self._shrinking = {c.job for c in changes}
        return changes + self.tick(now, holds)

    def tick(
        self, now: float, holds: Mapping[str, Placement], versions: Mapping[str, int] | None = None
    ) -> list[Change]:
        """Call whenever the jobs' placements were read again: the grows, once every shrink of the
        round landed (or timed out)."""
        if versions is not None:
            self._versions = dict(versions)
        self._forget_reached(holds)
        if not self._targets:
            return []
        pending = {job for job in self._shrinking if job in self.asked}
        if pending and now - self._started < self.shrink_timeout:
            return []
        return self._grow(holds)

    def _grow(self, holds: Mapping[str, Placement]) -> list[Change]:
        """Each job's grow, clipped per host to the slots nobody else holds or reserves (a clipped
        grow is still taken: the next round asks for the rest)."""
        hosts = len(self.slots)
        zero = (0,) * hosts
        changes = []
        for job, target in self._targets.items():
            now_holds = holds.get(job)
            ask = self.asked.get(job)
            if now_holds is None or (ask is not None and ask.shrink):
                continue  # ended, or a shrink still in flight (timed out: its slots stay reserved)
            heading = ask.target if ask else now_holds
            used = held(holds, self.asked, hosts)
            mine = elementwise_max(now_holds, ask.reserve if ask else zero)
            room = tuple(
                max(0, cap - (u - m)) for cap, u, m in zip(self.slots, used, mine)
            )  # what it may hold
            after = elementwise_min(target, room)
            if after != target:
                self.deferred.append(job)
            if not any(heading) and sum(after) < self._minimum.get(job, 1):
                continue  # a start with fewer workers than the job needs waits for room
            if not any(after) or not any(a > h for a, h in zip(after, heading)):
                continue  # nothing to add (or nowhere to add it)
            changes.append(Change(job, now_holds, after))
            self._ask(job, after, now_holds, shrink=False)
        self._targets, self._shrinking = {}, set()
        return changes

    def _ask(self, job: str, target: Placement, holds: Placement, shrink: bool) -> None:
        previous = self.asked.get(job)
        reserve = elementwise_max(holds, target)
        if previous is not None:  # an earlier ask's workers may still arrive until this one is reached
            reserve = elementwise_max(reserve, previous.reserve)
        self.asked[job] = Ask(target, reserve, shrink, self._versions.get(job, -1))

    def withdraw(self, job: str) -> None:
        """The change for ``job`` never reached its launcher: forget the ask (the next round asks
        again). Any earlier ask that did reach it keeps its reservation."""
        ask = self.asked.pop(job, None)
        if ask is not None and ask.version >= 0 and ask.reserve != ask.target:
            self.asked[job] = Ask(ask.reserve, ask.reserve, False, ask.version)

    def _forget_reached(self, holds: Mapping[str, Placement]) -> None:
        """An ask is done when the job reached it; a job that ended frees everything."""
        for job in list(self.asked):
            if job not in holds or self.asked[job].reached(holds[job], self._versions.get(job, -1)):
                del self.asked[job]


def oversubscribed_instants(
    slots: Placement, timelines: Mapping[str, list[tuple[float, Placement]]]
) -> list[float]:
    """The audit of a whole run: the change points at which some host held more workers than its
    slots, given each job's placement over time (``(time, placement)``, all zeros once it ended)."""
    zero = (0,) * len(slots)
    holding: dict[str, Placement] = {}
    bad = []
    for t, job, placement in sorted((t, job, tuple(p)) for job, steps in timelines.items() for t, p in steps):
        holding[job] = placement if len(placement) == len(slots) else zero
        if oversubscribed(slots, holding):
            bad.append(t)
    return bad
