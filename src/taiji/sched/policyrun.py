"""One policy's instrumented run in the simulator, shared by ``taiji sched simulate``
(:mod:`taiji.sched.cli`) and ``benchmarks/scheduler.py``: the policy built by name as the run needs
it (told the resize cost, seeded), every decision timed, each job's GPU count over time kept, and
progress reported.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.costs import ResizeCost
from taiji.sched.policies import make_policy
from taiji.sched.policy import JobView, Policy
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.simresult import SimResult
from taiji.sched.workload import JobSpec

# (time, GPUs held from then on) for one job: the steps its allocation went through
Steps = list[tuple[float, int]]


def configured_policy(
    name: str, *, seed: int, resize: ResizeCost, fidelity: str = "taiji", round_s: float | None = None
) -> Policy:
    """``make_policy(name, resize, fidelity, round_s=...)`` (a policy that weighs a change against its cost
    must see the cost the simulator charges, or a cost sweep measures nothing; PCRR plans its first slot
    as long as the simulator's rounds), seeded where it has a dataclass field ``seed`` (the randomized
    rounding of PCRR)."""
    policy = make_policy(name, resize=resize, fidelity=fidelity, round_s=round_s)
    if dataclasses.is_dataclass(policy) and any(
        spec.name == "seed" and spec.init for spec in dataclasses.fields(policy)
    ):
        policy = dataclasses.replace(policy, seed=seed)
    return policy


@dataclass
class _Instrumented:
    """Wraps a policy for the simulator: times every decision, keeps each job's GPU count over
    time (the simulator's result holds only the cluster total) and reports progress."""

    inner: Policy
    submit_times: Sequence[float]  # sorted, to count arrivals by bisection
    on_round: Callable[[float, int], None] | None = None  # (simulated time, jobs finished or rejected)
    decision_s: list[float] = field(default_factory=list)
    active_jobs: list[int] = field(default_factory=list)
    steps: dict[str, Steps] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    def allocate(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]:
        started = time.perf_counter()
        answer = self.inner.allocate(now, cluster, jobs)
        self.decision_s.append(time.perf_counter() - started)
        self.active_jobs.append(len(jobs))
        for job in jobs:
            allocation = answer.get(job.name)
            gpus = allocation.replicas if allocation is not None else 0
            history = self.steps.setdefault(job.name, [])
            if (history[-1][1] if history else 0) != gpus:
                history.append((now, gpus))
        if self.on_round is not None:
            # every arrival so far that is no longer active has finished (or was rejected)
            self.on_round(now, bisect.bisect_right(self.submit_times, now) - len(jobs))
        return answer


@dataclass(frozen=True)
class PolicyRun:
    """One policy's simulation with what the command and the benchmark report beyond SimResult."""

    result: SimResult
    decision_s: tuple[float, ...]  # wall seconds of every call to the policy
    active_jobs: tuple[int, ...]  # active jobs at each of those calls
    allocations: dict[str, Steps]  # job -> (time, GPUs) steps, ending at 0 when it completes
    wall_s: float

    @property
    def name(self) -> str:
        return self.result.policy

    def decision_stats(self, min_active: int = 1) -> dict[str, float | int]:
        """Decision seconds per call over the calls that saw at least ``min_active`` jobs (by
        default the calls with work to decide: idle rounds would dilute the mean)."""
        chosen = [s for s, n in zip(self.decision_s, self.active_jobs, strict=False) if n >= min_active]
        if not chosen:
            return {"rounds": 0, "mean_s": math.nan, "median_s": math.nan, "max_s": math.nan}
        return {
            "rounds": len(chosen),
            "mean_s": float(np.mean(chosen)),
            "median_s": float(np.median(chosen)),
            "max_s": float(max(chosen)),
            "mean_active_jobs": float(np.mean([n for n in self.active_jobs if n >= min_active])),
        }

    def summary(self) -> dict[str, object]:
        summary = dict(self.result.summary())
        summary["mean_utilization"] = mean_utilization(self.result, self.end_time())
        summary["decision"] = self.decision_stats()
        summary["wall_s"] = round(self.wall_s, 3)
        return summary

    def end_time(self) -> float:
        ends = [r.end_time for r in self.result.records if r.end_time is not None]
        last_change = self.result.utilization[-1][0] if self.result.utilization else 0.0
        return max(ends + [last_change])


def mean_utilization(result: SimResult, until: float) -> float:
    """Time-weighted mean of the GPUs allocated over [first change, until], in GPUs."""
    points = list(result.utilization)
    if not points or until <= points[0][0]:
        return 0.0
    busy = sum(
        used * (min(end, until) - start)
        for (start, used), (end, _) in zip(points, points[1:] + [(until, 0)], strict=False)
        if start < until
    )
    return busy / (until - points[0][0])


def run_policy(
    specs: Sequence[JobSpec],
    name: str,
    config: SimConfig,
    *,
    seed: int = 0,
    progress: bool = False,
    fidelity: str = "taiji",
) -> PolicyRun:
    """Simulate ``specs`` under the policy ``name`` (seeded, told ``config.resize``, in ``fidelity``
    mode), with a progress bar on stderr when ``progress`` is set and tqdm is installed."""
    policy = configured_policy(
        name, seed=seed, resize=config.resize, fidelity=fidelity, round_s=config.interval_s
    )
    bar = _progress_bar(name, len(specs)) if progress else None
    instrumented = _Instrumented(
        policy, sorted(spec.submit_time for spec in specs), on_round=None if bar is None else _updater(bar)
    )
    started = time.perf_counter()
    try:
        result = simulate(specs, instrumented, config)
        if bar is not None:  # completions after the last round never reached the bar
            bar.update(sum(r.status != "unfinished" for r in result.records) - bar.n)
    finally:
        if bar is not None:
            bar.close()
    wall_s = time.perf_counter() - started
    allocations = {job: list(steps) for job, steps in instrumented.steps.items()}
    for record in result.records:  # a finished job frees its GPUs at its completion, not at a round
        if record.end_time is not None and record.name in allocations:
            allocations[record.name].append((record.end_time, 0))
    return PolicyRun(
        result, tuple(instrumented.decision_s), tuple(instrumented.active_jobs), allocations, wall_s
    )


def _progress_bar(name: str, total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience (taiji[progress]); the run does not need it
        return None
    return tqdm(total=total, desc=f"{name:>10}", unit="job", file=sys.stderr, leave=True, dynamic_ncols=True)


def _updater(bar) -> Callable[[float, int], None]:
    def update(now: float, finished: int) -> None:
        bar.set_postfix_str(f"t={now / 3600:.1f}h", refresh=False)
        bar.update(max(finished - bar.n, 0))

    return update
