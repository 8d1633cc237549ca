"""A simulation's result (:mod:`taiji.sched.sim`): one record per job and the cluster's use over time."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class JobRecord:
    name: str
    application: str
    submit_time: float
    status: str  # "done", "rejected" or "unfinished"
    start_time: float | None = None
    end_time: float | None = None
    jct: float | None = None
    restarts: int = 0
    gpu_seconds: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class SimResult:
    policy: str
    records: tuple[JobRecord, ...]
    utilization: tuple[tuple[float, int], ...]  # (time, GPUs allocated from then on)

    def summary(self) -> dict[str, float | int | str | list[str]]:
        done = [r for r in self.records if r.status == "done"]
        jcts = np.array([r.jct for r in done], dtype=float)
        return {
            "policy": self.policy,
            "jobs": len(self.records),
            "completed": len(done),
            "avg_jct_s": float(jcts.mean()) if done else math.nan,
            "p99_jct_s": float(np.percentile(jcts, 99)) if done else math.nan,
            "makespan_s": (max(r.end_time for r in done) - min(r.submit_time for r in self.records))
            if done
            else math.nan,
            "gpu_hours": sum(r.gpu_seconds for r in self.records) / 3600.0,
            "restarts": sum(r.restarts for r in self.records),
            "rejected": [r.name for r in self.records if r.status == "rejected"],
            "unfinished": [r.name for r in self.records if r.status == "unfinished"],
        }

    def write_jsonl(self, path: str | Path) -> None:
        """One JSON object per job, in submission order."""
        with open(path, "w", encoding="utf-8") as out:
            for record in self.records:
                out.write(json.dumps(asdict(record)) + "\n")
