"""taiji.Optimizer in a user's own loop: a worker killed mid-allreduce; the survivors apply nothing
of the failed step (or, when one of them committed it before the kill cut the others off, adopt
that commit), re-form, sync, retry or go on, and finish with identical replicas."""

from __future__ import annotations

import json

import pytest

from taiji_harness.testing import REPO, taiji_run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_own_loop_survives_a_worker_killed_mid_allreduce(tmp_path):
    faults = json.dumps([{"action": "kill", "rank": 1, "step": 12, "phase": "allreduce"}])
    proc = taiji_run(
        3,
        ["python", str(REPO / "examples" / "own_loop.py"), "--steps", "40", "--out", str(tmp_path)],
        extra=["--timeout", "5"],
        env={"TAIJI_FAULTS": faults},
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    finals = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert not (tmp_path / "2.json").exists(), "three workers finished: the kill did not happen"
    assert [f["steps"] for f in finals] == [40, 40]
    assert finals[0]["digest"] == finals[1]["digest"], "replicas diverged"
    changes = [
        (c["reason"], c["from_size"], c["to_size"], c["step"]) for c in (f["transitions"][0] for f in finals)
    ]
    assert changes[0] == changes[1], changes  # one transition, the same on both survivors
    if changes[0] == ("failure", 3, 2, 12):  # neither committed step 12: both retry it
        assert all(f["retries"] == 1 for f in finals), finals
    else:  # the killed worker's last bucket went out: a survivor committed step 12; the other's attempt
        # failed and it adopted that commit in the sync (one retry). The survivor that committed moved on
        # at the new version's notice (no retry) or, when it had already begun step 13's allreduce
        # before the notice came (a loaded machine), saw that attempt fail (one retry of step 13)
        assert changes[0] == ("failure", 3, 2, 13), changes
        assert sorted(f["retries"] for f in finals) in ([0, 1], [1, 1]), finals


@pytest.mark.timeout(240)
def test_own_loop_whose_every_worker_fails_at_one_step_in_every_version_stops_saying_why(tmp_path):
    faults = json.dumps([{"action": "raise", "step": 7, "phase": "allreduce", "repeat": True}])
    proc = taiji_run(
        2,
        ["python", str(REPO / "examples" / "own_loop.py"), "--steps", "40", "--out", str(tmp_path)],
        extra=["--timeout", "5"],
        env={"TAIJI_FAULTS": faults},
        timeout=200,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "every worker failed at step 7 in 11 cluster versions in a row" in out, (
        out[-4000:]
    )
    assert not (tmp_path / "0.json").exists(), "the loop finished although step 7 never committed"
