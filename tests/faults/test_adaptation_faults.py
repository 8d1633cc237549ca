"""Policies across resizes and failures, with real processes (tests/scripts/elastic_train.py):
policy state survives resizes and a crash, and a policy raising on one worker stops the whole job.
Policies inside the Job with ranks as threads: tests/unit/test_adaptation.py."""

import json

import pytest

from taiji_harness.testing import check_invariants, run_elastic


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_policy_state_and_batch_changes_survive_resizes_and_a_crash(tmp_path):
    """The cycling-batch policy decides from its own counter: a joiner that did not continue the
    policy's state would decide differently and the decision check would stop the job."""
    faults = [{"action": "kill", "rank": 1, "step": 30, "phase": "allreduce"}]
    proc = run_elastic(
        tmp_path,
        2,
        "--steps",
        "3000",
        "--step-delay",
        "0.005",
        "--sizes",
        "4",
        "3",
        "--policy",
        "cycle",
        launcher_args=["--max-np", "4", "--replace"],
        faults=faults,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16, policy="cycle")
    assert 4 in result["sizes"] and result["sizes"][-1] == 3, result
    records = [json.loads(line) for line in (tmp_path / "w0.jsonl").read_text().splitlines()]
    spans = {r["span"][1] - r["span"][0] for r in records}
    assert {14, 17, 20} <= spans, f"the policy's batch sizes were not all used: {spans}"
    assert len({r["lr"] for r in records}) >= 3, "linear LR scaling did not follow the batch"
    from taiji.metrics.runlog import read_jsonl

    policy_events = [e for e in read_jsonl(tmp_path / "run" / "events.jsonl") if e["kind"] == "policy"]
    assert policy_events and all(e["policy"] == "CyclingBatch" for e in policy_events)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_policy_raising_on_one_worker_stops_the_whole_job_with_its_name(tmp_path):
    proc = run_elastic(tmp_path, 3, "--steps", "200", "--policy", "raise", timeout=100)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "RaiseOnRank.after_step raised at step 7" in output and "bad policy" in output
    assert "worker w1 reported an error no worker can recover from" in output, output[-3000:]
