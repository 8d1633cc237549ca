"""Fidelity check: our Tiresias, Optimus and Pollux-like policies on Pollux's workloads against the
results Pollux's artifact published, job by job (docs/reference/scheduler-model.md#pollux; 16 nodes × 4 GPUs,
60 s rounds, a 30 s restart for every reallocation — the settings of those runs).

The reference is the artifact's per-job JCTs at load 1.0 (``data/results/<policy>-1.0.json.gz``,
provenance in ``data/README.md``): Pollux's simulator reproduces them exactly for Tiresias and
Optimus; its Pollux policy (NSGA-II) is stochastic, and ours is a greedy stand-in, so that row is
a comparison, not a reproduction. Tiresias and Optimus run in the ``pollux`` fidelity mode
(:mod:`taiji.sched.policies.common`) unless ``--mode taiji`` asks for taiji's own choices.

Per policy and workload it reports, besides the average JCT: the per-job agreement — the mean of
``|ln(ours/theirs)|`` over the jobs and the share of jobs within ±25% — and the deviation
``ours/theirs − 1`` of the average, the p99 JCT and the makespan (last completion − first
submission). Averages alone let opposite per-job errors cancel.

``python -m taiji.sched.fidelity [--workloads 1-8|6|1,3] [--policies tiresias,optimus,pollux]
[--mode pollux|taiji]`` prints one line per policy and workload and a JSON object last.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np

from taiji.errors import ConfigError
from taiji.sched.costs import SYSTEMS
from taiji.sched.csvio import data_root
from taiji.sched.policies import FIDELITY_MODES, make_policy
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.simresult import SimResult
from taiji.sched.workload import POLLUX_WORKLOADS, pollux_workload

logger = logging.getLogger(__name__)

POLLUX_SETTINGS = SimConfig(resize=SYSTEMS["restart"])  # 16x4, 60 s rounds, 30 s restarts
PUBLISHED_POLICIES = ("tiresias", "optimus", "pollux")
WITHIN = 0.25  # "agrees" = within ±25% of the published JCT


@functools.cache
def published_jcts(policy: str) -> dict[int, dict[str, float]]:
    """The artifact's JCT (s) of every job: workload number → job name → JCT."""
    if policy not in PUBLISHED_POLICIES:
        raise ConfigError(
            f"no published results for {policy!r}; there are for {', '.join(PUBLISHED_POLICIES)}"
        )
    raw = gzip.decompress(data_root().joinpath("results", f"{policy}-1.0.json.gz").read_bytes())
    jcts = json.loads(raw)["jcts"]
    return {
        int(key.rsplit("-", 1)[1]): {name: float(jct) for name, jct in jobs.items()}
        for key, jobs in jcts.items()
    }


def makespan(submits: Sequence[float], ends: Sequence[float]) -> float:
    return max(ends) - min(submits)


def agreement(result: SimResult, published: Mapping[str, float]) -> dict[str, float]:
    """Per-job agreement of one simulated workload with the published JCTs of the same jobs."""
    done = [r for r in result.records if r.status == "done"]
    missing = sorted(set(published) - {r.name for r in done})
    if missing:
        raise ConfigError(f"{result.policy}: jobs {missing[:5]} did not finish, the reference has them")
    ours = np.array([r.jct for r in done], dtype=float)
    theirs = np.array([published[r.name] for r in done], dtype=float)
    log_ratio = np.log(ours / theirs)
    submits = [r.submit_time for r in done]
    ours_makespan = makespan(submits, [r.end_time for r in done])
    theirs_makespan = makespan(submits, [s + t for s, t in zip(submits, theirs, strict=False)])
    return {
        "avg_jct_s": round(float(ours.mean()), 1),
        "published_avg_jct_s": round(float(theirs.mean()), 1),
        "mean_abs_log_ratio": round(float(np.abs(log_ratio).mean()), 4),
        "within_25pct": round(float(np.mean(np.abs(ours / theirs - 1) <= WITHIN)), 4),
        "deviation": round(float(ours.mean() / theirs.mean() - 1), 4),
        "p99_deviation": round(float(np.percentile(ours, 99) / np.percentile(theirs, 99) - 1), 4),
        "makespan_deviation": round(float(ours_makespan / theirs_makespan - 1), 4),
        "log_ratios": log_ratio.tolist(),
        "p99_s": (float(np.percentile(ours, 99)), float(np.percentile(theirs, 99))),
        "makespan_s": (ours_makespan, theirs_makespan),
    }


def _overall(rows: Sequence[Mapping[str, object]]) -> dict[str, float]:
    """Over several workloads: per-job figures over all their jobs; average, p99 and makespan as the
    mean over workloads, ours against theirs (as Pollux reports its mean JCT)."""
    log_ratio = np.concatenate([np.asarray(row["log_ratios"]) for row in rows])

    def deviation(key: str) -> float:
        pairs = np.array([row[key] for row in rows], dtype=float)
        return round(float(pairs[:, 0].mean() / pairs[:, 1].mean() - 1), 4)

    ours = float(np.mean([row["avg_jct_s"] for row in rows]))
    published = float(np.mean([row["published_avg_jct_s"] for row in rows]))
    return {
        "ours": round(ours, 1),
        "published": round(published, 1),
        "deviation": round(ours / published - 1, 4),
        "mean_abs_log_ratio": round(float(np.abs(log_ratio).mean()), 4),
        "within_25pct": round(float(np.mean(np.abs(np.exp(log_ratio) - 1) <= WITHIN)), 4),
        "p99_deviation": deviation("p99_s"),
        "makespan_deviation": deviation("makespan_s"),
        "jobs": int(log_ratio.size),
    }


def fidelity(
    policies: Sequence[str], workloads: Sequence[int], mode: str = "pollux"
) -> dict[str, dict[str, object]]:
    """Per policy: the overall figures (:func:`_overall`) and ``per_workload`` (:func:`agreement`,
    without the raw ratios), our policies in fidelity ``mode``."""
    bad = sorted(set(workloads) - set(POLLUX_WORKLOADS))
    if bad or not workloads:
        raise ConfigError(
            f"published per-job results exist for workloads 1-8, got {list(workloads) or 'none'}"
        )
    report: dict[str, dict[str, object]] = {}
    for name in policies:
        published = published_jcts(name)
        rows = {
            index: agreement(
                simulate(pollux_workload(index), make_policy(name, fidelity=mode), POLLUX_SETTINGS),
                published[index],
            )
            for index in workloads
        }
        report[name] = {
            **_overall(list(rows.values())),
            "mode": mode,
            "per_workload": {
                index: {
                    key: value
                    for key, value in row.items()
                    if key not in ("log_ratios", "p99_s", "makespan_s")
                }
                for index, row in rows.items()
            },
        }
    return report


def parse_workloads(text: str) -> list[int]:
    """``1-8``, ``6`` or ``1,3,5``."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-"))
            return list(range(low, high + 1))
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise ConfigError(f"--workloads {text!r}: expected e.g. 1-8, 6 or 1,3") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taiji.sched.fidelity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workloads", default="1-8", help="1-8 (default), one number, or a comma list")
    parser.add_argument("--policies", default=",".join(PUBLISHED_POLICIES))
    parser.add_argument(
        "--mode",
        default="pollux",
        choices=FIDELITY_MODES,
        help="fidelity mode of tiresias and optimus (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    report = fidelity([p for p in args.policies.split(",") if p], parse_workloads(args.workloads), args.mode)
    for name, row in report.items():
        lines = [(f"w{index}", figures) for index, figures in row["per_workload"].items()] + [("all", row)]
        for label, figures in lines:
            print(
                f"{name:>9} {label:>3}: per job mean |ln ratio| {figures['mean_abs_log_ratio']:.3f}, "
                f"within ±25% {figures['within_25pct']:.0%}; avg {figures['deviation']:+.1%}, "
                f"p99 {figures['p99_deviation']:+.1%}, makespan {figures['makespan_deviation']:+.1%}"
            )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
