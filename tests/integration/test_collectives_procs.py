"""Collectives across real processes launched by `taiji run` (tests/scripts/collectives_worker.py).
A rank killed or hung mid-job: tests/faults/test_collectives_faults.py."""

import sys

import pytest

from taiji_harness.testing import SCRIPTS, read_rank_files, taiji_run

WORKER = str(SCRIPTS / "collectives_worker.py")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 4])
def test_collectives_across_launched_processes(tmp_path, n):
    proc = taiji_run(n, [sys.executable, WORKER, "check", str(tmp_path)], extra=["--timeout", "30"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_rank_files(tmp_path, n)
    total = sum(r + 1.0 for r in range(n))
    for r, res in enumerate(results):
        assert res["rank"] == r and res["size"] == n and res["version"] == 1
        assert res["sum"] == [total, float(sum(range(n)))]
        assert res["avg"] == pytest.approx([total / n, sum(range(n)) / n])
        assert res["min"] == [1.0, 0.0] and res["max"] == [float(n), float(n - 1)]
        assert res["bcast"] == [float(n - 1)] * 2 and res["gather"] == list(range(n))
