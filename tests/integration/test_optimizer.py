"""taiji.Optimizer in a user's own loop: a worker killed mid-allreduce; the survivors apply nothing
of the failed step, re-form, sync, retry the batch and finish with identical replicas."""
from __future__ import annotations

import json

import pytest

from taiji_harness.testing import REPO, taiji_run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_own_loop_survives_a_worker_killed_mid_allreduce(tmp_path):
    faults = json.dumps([{"action": "kill", "rank": 1, "step": 12, "phase": "allreduce"}])
    proc = taiji_run(3, ["python", str(REPO / "examples" / "own_loop.py"), "--steps", "40", "--out", str(tmp_path)],
                     extra=["--timeout", "5"], env={"TAIJI_FAULTS": faults}, timeout=200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    finals = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert not (tmp_path / "2.json").exists(), "three workers finished: the kill did not happen"
    assert [f["steps"] for f in finals] == [40, 40]
    assert finals[0]["digest"] == finals[1]["digest"], "replicas diverged"
    assert all(f["retries"] == 1 for f in finals), finals
    change = finals[0]["transitions"][0]
    assert (change["reason"], change["from_size"], change["to_size"], change["step"]) == ("failure", 3, 2, 12)
