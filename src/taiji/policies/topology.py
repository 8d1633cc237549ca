"""AdaptiveTopology: KungFu's adaptive topology — try each allreduce plan for a few steps, keep the
fastest, and try again when the cluster changes size (hosts joined or left)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..comm.topologies import TOPOLOGIES
from ..errors import ConfigError
from .base import Context, HookResult, Policy, SetTopology


class AdaptiveTopology(Policy):
    """Measure each of ``candidates`` for ``trial_steps`` steps, after ``settle`` steps that build
    the plan's groups, and keep the fastest; the trials start again whenever the cluster's size
    changes. What is measured: the workers' mean wait for the gradients' allreduce after backward
    (``Metrics.allreduce_seconds``, agreed through the control message: the plans' own cost, with
    less of compute's noise — it still includes waiting for the slowest peer's backward), or,
    where a strategy does not report it, the agreed step time (``Metrics.step_seconds``: compute
    is the same under every plan, so the difference between them is still the allreduce)."""

    def __init__(
        self,
        candidates: Sequence[str] = ("ring", "hierarchical", "tree"),
        *,
        trial_steps: int = 5,
        settle: int = 2,
    ):
        unknown = [c for c in candidates if c not in TOPOLOGIES]
        if not candidates or unknown or trial_steps < 1 or settle < 0:
            raise ConfigError(
                f"AdaptiveTopology needs candidates from {list(TOPOLOGIES)} (got unknown {unknown}), "
                "trial_steps >= 1 and settle >= 0"
            )
        self._candidates, self._trial_steps, self._settle = tuple(candidates), trial_steps, settle
        self.size = 0  # the cluster size the trials were for
        self.trial = 0  # index of the candidate under trial; len(candidates): settled
        self.seen = 0  # steps measured under it (settling ones included)
        self.times: list[float] = []  # its step times
        self.medians: dict[str, float] = {}
        self.chosen = ""
        self.measure = ""  # what the trials compare: "allreduce" waits or "step" times

    def after_step(self, ctx: Context) -> HookResult:
        if ctx.size != self.size:  # a new cluster: try every plan again, starting now
            self.size, self.trial, self.seen, self.times, self.medians, self.measure = (
                ctx.size,
                0,
                0,
                [],
                {},
                "",
            )
            return self._try(ctx)
        if self.trial >= len(self._candidates):
            return None
        self.seen += 1
        sample = self._sample(ctx)
        if sample is not None and self.measure in ("", sample[0]):  # one kind of figure per round of trials
            self.measure = sample[0]
            self.times.append(sample[1])
        elif sample is not None and sample[0] == "allreduce":
            # the waits came (back) while the trials ran on step times: start them over on the waits
            self.trial, self.seen, self.times, self.medians, self.measure = 0, 0, [], {}, "allreduce"
            return self._try(ctx)
        # else a step without a wait (a retried one): skipped
        if len(self.times) < self._trial_steps:
            return None
        self.medians[self._candidates[self.trial]] = statistics.median(self.times)
        self.trial, self.seen, self.times = self.trial + 1, 0, []
        if self.trial < len(self._candidates):
            return self._try(ctx)
        self.chosen = min(self.medians, key=lambda name: self.medians[name])
        return None if self.chosen == ctx.topology else SetTopology(self.chosen)

    def _sample(self, ctx: Context) -> tuple[str, float] | None:
        """The allreduce's own wait where the workers report it (it comes a step late: one more
        step to settle), else the agreed step time."""
        waited = ctx.metrics.allreduce_seconds
        if waited is not None:
            return ("allreduce", waited) if self.seen > self._settle + 1 else None
        if ctx.metrics.step_seconds and self.seen > self._settle:
            return "step", ctx.metrics.step_seconds
        return None

    def _try(self, ctx: Context) -> HookResult:
        name = self._candidates[self.trial]
        return None if name == ctx.topology else SetTopology(name)
