"""A short randomized fault soak in CI (benchmarks/soak.py; --runs 1000 for long runs)."""

import json
import subprocess
import sys

import pytest

from taiji_harness.testing import REPO


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_random_fault_soak_breaks_no_invariant():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--runs", "2", "--seed", "3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["runs"] == 2 and result["steps"] > 0
    for key in (
        "failed_runs",
        "divergences",
        "lost_samples",
        "duplicated_samples",
        "hangs",
        "orphans",
        "trajectory_mismatches",
    ):
        assert result[key] == 0, (key, json.dumps(result["broken"], indent=1))
