"""Cluster-size policies: a fixed schedule, and throughput-driven scaling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ConfigError
from .base import Context, HookResult, Policy, Resize


class ScheduledResize(Policy):
    """Ask for ``schedule[step]`` workers when training reaches ``step`` (``{150: 3, 600: 2}``).

    A joiner that arrives later continues the schedule (it is synced state), and a step that
    was passed while the job was recovering still fires, once."""

    def __init__(self, schedule: Mapping[int, int]):
        if any(int(s) < 0 or int(n) < 1 for s, n in schedule.items()):
            raise ConfigError(f"a resize schedule maps steps >= 0 to sizes >= 1, got {dict(schedule)}")
        self._schedule = sorted((int(s), int(n)) for s, n in schedule.items())
        self.next_index = 0  # entries before this one have fired

    def before_step(self, ctx: Context) -> HookResult:
        due = None
        while self.next_index < len(self._schedule) and self._schedule[self.next_index][0] <= ctx.step:
            due = self._schedule[self.next_index][1]
            self.next_index += 1
        return None if due is None else Resize(due)


def parse_resize_schedule(items: Sequence[str]) -> dict[int, int]:
    """``["150:3", "600:2"]`` (a script's ``--resize STEP:SIZE ...``) as ScheduledResize's schedule."""
    try:
        return dict(sorted((int(step), int(size)) for step, size in (item.split(":") for item in items)))
    except ValueError:
        raise ConfigError(f"--resize takes STEP:SIZE pairs, got {list(items)}") from None


def parse_policy_names(spec: str, known: Sequence[str], resizes: Sequence[str] = ()) -> list[str]:
    """A script's ``--policy a,b`` as names among ``known``; ``--resize`` alone implies "schedule"."""
    names = [n for n in spec.split(",") if n]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ConfigError(f"unknown --policy {', '.join(unknown)}; choose from {', '.join(known)}")
    if resizes and "schedule" not in names:
        names.append("schedule")  # --resize alone still means what it says
    return names


class ThroughputScaling(Policy):
    """Add workers while each one adds at least ``threshold`` (relative) samples/s; then stop,
    and (``revert``) give back the last worker if it did not pay for itself. KungFu's adaptive
    resource provisioning.

    Throughput is measured on rank 0's clock from the control messages, so every worker sees the
    same number: over ``window`` steps, after ``settle`` steps at a new cluster version (joins
    and their state transfer are not counted). Stops at --max-np, or ``max_size`` if smaller.
    """

    def __init__(
        self,
        threshold: float = 0.1,
        *,
        window: int = 20,
        settle: int = 3,
        max_size: int | None = None,
        revert: bool = True,
        patience: int = 2000,
    ):
        if threshold < 0 or window < 1 or settle < 0 or patience < 1:
            raise ConfigError(
                "ThroughputScaling needs threshold >= 0, window >= 1, settle >= 0, patience >= 1"
            )
        self._threshold, self._window, self._settle = threshold, window, settle
        self._max_size, self._revert, self._patience = max_size, revert, patience
        self.phase = "measure"  # measure -> waiting for the resize -> measure ... -> done
        self.version = -1  # cluster version the current window belongs to
        self.steps = 0
        self.samples = 0
        self.seconds = 0.0
        self.baseline: float | None = None  # samples/s at baseline_size
        self.baseline_size = 0
        self.target = 0
        self.waited = 0
        self.history: list[list[float]] = []  # [size, samples/s] per measured size

    def _limit(self, ctx: Context) -> int | None:
        limits = [x for x in (self._max_size, ctx.max_size) if x is not None]
        return min(limits) if limits else None

    def after_step(self, ctx: Context) -> HookResult:
        if self.phase == "done":
            return None
        if self.phase == "waiting":
            self.waited += 1
            if ctx.size != self.target:
                if self.waited > self._patience:
                    self.phase = "done"  # the launcher never delivered: stay where we are
                return None
            self.phase = "measure"
        if ctx.version != self.version:
            self.version, self.steps, self.samples, self.seconds = ctx.version, -self._settle, 0, 0.0
        self.steps += 1
        seconds = ctx.metrics.step_seconds
        if self.steps <= 0 or seconds is None or seconds <= 0:
            return None
        self.samples += ctx.metrics.samples
        self.seconds += seconds
        if self.steps < self._window:
            return None
        throughput = self.samples / self.seconds
        self.history.append([ctx.size, throughput])
        if self.baseline is not None and throughput < self.baseline * (1 + self._threshold):
            self.phase = "done"
            if self._revert and ctx.size != self.baseline_size:
                return Resize(self.baseline_size)
            return None
        self.baseline, self.baseline_size = throughput, ctx.size
        limit = self._limit(ctx)
        if limit is not None and ctx.size + 1 > limit:
            self.phase = "done"
            return None
        self.phase, self.target, self.waited = "waiting", ctx.size + 1, 0
        return Resize(ctx.size + 1)
