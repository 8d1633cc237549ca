"""One job as the simulator (:mod:`taiji.sched.sim`) sees it: the mutable state whose progress is
integrated exactly between events (:class:`SimJob`, never handed to a policy), what a policy is shown
of it (a :class:`~taiji.sched.policy.JobView`) and, in a replay, how a live daemon saw it
(:class:`DaemonView`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from taiji.sched.cluster import Allocation
from taiji.sched.model import AnyApplication, advance, time_to_finish
from taiji.sched.policy import JobView
from taiji.sched.trail import Trail
from taiji.sched.workload import JobSpec


class DaemonView(Protocol):
    """What a live daemon's policy saw of a job before its first step (a replay's:
    :mod:`taiji.sched.replay`)."""

    def guess(self, name: str, measured: Sequence[str]) -> AnyApplication:
        """``name``'s model given the jobs (``measured``) that had made a step."""


@dataclass
class SimJob:
    """Mutable simulation state of one job (never handed to a policy)."""

    spec: JobSpec
    app: AnyApplication  # ground truth: progress and completion times use it
    estimate: AnyApplication  # what the policy is shown (``app`` unless estimation error is on)
    progress: float = 0.0
    allocation: Allocation | None = None
    pause_left: float = 0.0
    finish_at: float = math.inf  # exact completion time under the current allocation
    speed: float = 1.0  # 1 − interference slowdown, constant between events
    attained: float = 0.0
    restarts: int = 0
    peak_replicas: int = 0
    start: float | None = None
    end: float | None = None
    resumed: float = 0.0  # when it last (re)started
    resumed_at: float = 0.0  # its progress then
    suspensions: list[float] = field(default_factory=list)  # when it was suspended
    joining: Allocation | None = (
        None  # what it trains on until a grow's joiners arrive (None: no grow pending)
    )
    join_at: float = 0.0
    exiting: bool = False  # trained to the end; its launcher exits at ``finish_at`` (``exit_s``)
    booting: bool = False  # (re)started and not seen training since: its launcher boots
    seen_at: float = 0.0  # when the daemon sees its (re)start's first step (``ResizeCost.seen``)
    stepped: bool = False  # the daemon has seen it train (a first step, seen at ``seen_at``)
    listed_at: float = (
        0.0  # when the daemon lists its workers (its launcher's first status; ``ResizeCost.listed``)
    )
    trail: Trail | None = None  # a replay: its progress as the daemon saw it (``ResizeCost.seen`` late)

    def view(
        self,
        daemon: DaemonView | None = None,
        measured: Sequence[str] = (),
        suspend_cost_s: float | None = None,
        now: float = 0.0,
        horizon: float = 0.0,
    ) -> JobView:
        """What a policy sees; as a live daemon saw it with ``daemon``: no workers until it listed them
        (by ``horizon``: its tick), the
        daemon's guess of its model until its first step (``measured``: the jobs that made one), and
        while it runs the suspend cost the daemon's rules count (``suspend_cost_s``)."""
        if daemon is None:
            return JobView(
                self.spec,
                self.estimate,
                self.progress,
                self.attained,
                self.allocation,
                self.restarts,
                self.peak_replicas,
            )
        return JobView(
            self.spec,
            self.estimate if self.stepped else daemon.guess(self.spec.name, measured),
            self.trail.at(now) if self.trail else self.progress,
            self.attained,
            None if self.booting and max(now, horizon) < self.listed_at else self.allocation,
            self.restarts,
            self.peak_replicas,
            suspend_cost_s=None if self.allocation is None else suspend_cost_s,
        )

    def run_for(self, start: float, seconds: float) -> None:
        """Progress from ``start`` for ``seconds``: its pause first, then on what it trains on (a
        grow's old allocation until its joiners arrive at ``join_at``, then the new one)."""
        if self.allocation is None or seconds <= 0:
            return
        paused = min(self.pause_left, seconds)
        self.pause_left -= paused
        listed = max(0.0, min(paused, start + paused - self.listed_at))  # (as the daemon counts: once listed)
        self.attained += (
            listed * (self.joining or self.allocation).replicas
        )  # (its joiners are not there yet)
        if seconds > paused:  # it trains; the daemon sees it (and measures it) at ``seen_at``
            self.booting = self.booting and start + seconds < self.seen_at - 1e-9
            self.stepped = self.stepped or not self.booting
        for allocation, span in self._spans(start + paused, seconds - paused):
            self.attained += span * allocation.replicas  # (as the daemon counts: the workers it has)
            self.progress = advance(
                self.app,
                self.progress,
                span * self.speed,
                allocation.placement,
                allocation.batch_size,
                allocation.ps_placement,
            )
        if self.joining is not None and start + seconds >= self.join_at:
            self.joining = None

    def _spans(self, start: float, seconds: float) -> list[tuple[Allocation, float]]:
        """(allocation trained on, seconds) from ``start``: the old one until the joiners arrive."""
        if self.joining is None or start >= self.join_at:
            return [(self.allocation, seconds)]
        before = min(seconds, self.join_at - start)
        return [(self.joining, before), (self.allocation, seconds - before)]

    def retime(self, now: float) -> None:
        """Exact completion time from ``now`` under the current allocation(s) and speed."""
        if self.exiting:
            return
        if self.allocation is None:
            self.finish_at = math.inf
            return
        at, progress = now + self.pause_left, self.progress
        for allocation, span in self._spans(at, math.inf):
            left = (
                time_to_finish(
                    self.app, progress, allocation.placement, allocation.batch_size, allocation.ps_placement
                )
                / self.speed
            )
            if left <= span:
                self.finish_at = at + left
                return
            progress = advance(
                self.app,
                progress,
                span * self.speed,
                allocation.placement,
                allocation.batch_size,
                allocation.ps_placement,
            )
            at += span
