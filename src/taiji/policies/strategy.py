"""Strategy-switching policies: by cluster size, and by measured interference (KungFu's
adaptive synchronisation: when workers slow down, stop waiting for each other)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from ..errors import ConfigError
from .base import Context, HookResult, Policy, SetStrategy


class StrategyBySize(Policy):
    """Use ``thresholds[k]`` from k workers on: ``{1: "sync_sgd", 8: "model_averaging"}``
    (exact SGD while the cluster is small, averaging once synchronising everyone costs more)."""

    def __init__(self, thresholds: Mapping[int, str]):
        if not thresholds or any(int(k) < 1 for k in thresholds):
            raise ConfigError(
                f"StrategyBySize needs sizes >= 1 mapped to strategy names, got {dict(thresholds)}"
            )
        self._thresholds = sorted((int(k), v) for k, v in thresholds.items())

    def before_step(self, ctx: Context) -> HookResult:
        chosen = None
        for size, name in self._thresholds:
            if ctx.size >= size:
                chosen = name
        return None if chosen is None or chosen == ctx.strategy else SetStrategy(chosen)


class InterferenceSwitch(Policy):
    """Switch to ``to`` when a majority of workers measure their step time above
    ``reference / fraction`` (i.e. their throughput fell below ``fraction`` of its reference).

    Each worker's reference is its median wall time per step over the first ``window`` steps
    (after ``settle`` steps) of the current cluster version; the vote is taken on the next
    windows. The per-worker times ride the control message, so every worker counts the same
    votes. Under SyncSGD one straggler slows everyone, so everyone votes: that is the signal
    that waiting for each other has become the bottleneck.
    """

    def __init__(
        self, to: str = "pair_averaging", *, fraction: float = 0.7, window: int = 20, settle: int = 5
    ):
        if not 0 < fraction < 1 or window < 2 or settle < 0:
            raise ConfigError("InterferenceSwitch needs 0 < fraction < 1, window >= 2, settle >= 0")
        self._to, self._fraction, self._window, self._settle = to, fraction, window, settle
        self.version = -1
        self.seen = 0
        self.samples: list[list[float]] = []  # per step: each worker's seconds
        self.reference: list[float] | None = None
        self.switched = False

    def after_step(self, ctx: Context) -> HookResult:
        times = ctx.metrics.worker_step_seconds
        if self.switched or ctx.strategy == self._to or not times:
            return None
        if ctx.version != self.version or (self.reference is not None and len(self.reference) != len(times)):
            self.version, self.seen, self.samples, self.reference = ctx.version, 0, [], None
        self.seen += 1
        if self.seen <= self._settle or any(t <= 0 for t in times):
            return None
        self.samples.append(list(times))
        if len(self.samples) < self._window:
            return None
        per_worker = [statistics.median(column) for column in zip(*self.samples)]
        self.samples = []
        if self.reference is None:
            self.reference = per_worker
            return None
        votes = sum(now > ref / self._fraction for now, ref in zip(per_worker, self.reference))
        if votes * 2 > len(per_worker):
            self.switched = True
            return SetStrategy(self._to)
        return None
