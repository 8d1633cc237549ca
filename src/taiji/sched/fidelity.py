"""Fidelity check: our Tiresias, Optimus and Pollux-like policies on Pollux's workloads against the
average JCTs Pollux's artifact published (SCHEDULER.md §3.1; 16 nodes × 4 GPUs, 60 s rounds, a
30 s restart for every reallocation — the settings of those runs).

``python -m taiji.sched.fidelity [--workloads 1-8|6] [--policies tiresias,optimus,pollux]`` prints
one line per policy and a JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
from typing import Sequence

import numpy as np

from taiji.errors import ConfigError
from taiji.sched.policies import make_policy
from taiji.sched.sim import SYSTEMS, SimConfig, simulate
from taiji.sched.workload import POLLUX_WORKLOADS, pollux_workload

logger = logging.getLogger(__name__)

# Mean over workloads 1-8 of the average JCT (s) at load 1.0 (results-jobload summary.json), the
# README's single run on workload 6, and Pollux's per-workload averages (the only per-workload
# values our source lists).
PUBLISHED_MEAN = {"pollux": 2751.1, "tiresias": 4038.2, "optimus": 5681.9}
PUBLISHED_WORKLOAD_6 = {"pollux": 2446.1, "tiresias": 3469.7, "optimus": 5301.9}
PUBLISHED_POLLUX = {1: 2089, 2: 3323, 3: 2188, 4: 2721, 5: 2674, 6: 2446, 7: 3616, 8: 2952}
POLLUX_SETTINGS = SimConfig(resize=SYSTEMS["restart"])   # 16x4, 60 s rounds, 30 s restarts


def fidelity(policies: Sequence[str], workloads: Sequence[int]) -> dict[str, dict[str, object]]:
    """Per policy: our average JCT per workload, their mean, the published value and the
    relative deviation ``ours/published − 1`` (workload 6 alone uses the README's run)."""
    published = PUBLISHED_WORKLOAD_6 if list(workloads) == [6] else PUBLISHED_MEAN
    if list(workloads) not in ([6], list(POLLUX_WORKLOADS)):
        raise ConfigError("published numbers exist for workload 6 alone or for workloads 1-8")
    report: dict[str, dict[str, object]] = {}
    for name in policies:
        averages = {index: simulate(pollux_workload(index), make_policy(name), POLLUX_SETTINGS).summary()["avg_jct_s"]
                    for index in workloads}
        ours = float(np.mean(list(averages.values())))
        report[name] = {"ours": round(ours, 1), "published": published[name],
                        "deviation": round(ours / published[name] - 1, 4),
                        "per_workload": {i: round(float(v), 1) for i, v in averages.items()}}
        if name == "pollux":
            report[name]["published_per_workload"] = {i: PUBLISHED_POLLUX[i] for i in workloads}
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taiji.sched.fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="1-8", choices=["1-8", "6"])
    parser.add_argument("--policies", default="tiresias,optimus,pollux")
    args = parser.parse_args(argv)
    workloads = list(POLLUX_WORKLOADS) if args.workloads == "1-8" else [6]
    report = fidelity([p for p in args.policies.split(",") if p], workloads)
    for name, row in report.items():
        print(f"{name:>9}: ours {row['ours']:7.0f} s  published {row['published']:7.0f} s  "
              f"deviation {row['deviation']:+.1%}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
