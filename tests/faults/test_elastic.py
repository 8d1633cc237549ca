"""The invariants (docs/design.md#invariants) under resizes and injected faults, with real processes.

Every worker logs each committed step (tests/scripts/elastic_train.py). The checks:
1. replicas are bitwise identical after every committed step (one digest per step);
2. within an epoch every sample is consumed exactly once (committed spans tile the epoch);
3. the final parameters match an uninterrupted 1-worker run with the same global batch;
4. the job ends (no hang) and leaves no process behind (the launcher's own tests cover orphans;
   here every run has a hard timeout and is killed with its whole session on failure).
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from taiji_harness.testing import ELASTIC_SCRIPT, REPO, check_invariants, run_elastic, stop_launcher

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def test_resizes_1_3_2_4_1_keep_every_invariant(tmp_path):
    proc = run_elastic(
        tmp_path,
        1,
        "--steps",
        "3000",
        "--step-delay",
        "0.005",
        "--sizes",
        "3",
        "2",
        "4",
        "1",
        launcher_args=["--max-np", "4"],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [1, 3, 2, 4, 1]
    transitions = json.loads((tmp_path / "w0.transitions.json").read_text())
    assert [t["to_size"] for t in transitions] == [3, 2, 4, 1]
    # rank 0's run directory: a metrics line per step, the resizes as events, and a timeline
    from taiji.metrics.runlog import read_jsonl

    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert len(metrics) == result["steps"] and {m["size"] for m in metrics} == {1, 2, 3, 4}
    assert any(m["gns"] is not None for m in metrics if m["size"] > 1)
    assert [e["size"] for e in events if e["kind"] == "resize"] == [3, 2, 4, 1]
    assert events[0]["kind"] == "start" and events[-1]["kind"] == "end"
    plot = subprocess.run(
        [sys.executable, "-m", "taiji.launch.cli", "plot", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "run" / "timeline.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("phase", ["allreduce", "compute"])
def test_worker_killed_mid_step_survivors_retry_and_keep_invariants(tmp_path, phase):
    faults = [{"action": "kill", "rank": 1, "step": 12, "phase": phase}]
    proc = run_elastic(tmp_path, 3, "--steps", "40", faults=faults)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [3, 2]
    assert "worker w1 (rank 1) killed by SIGKILL" in proc.stdout
    recovery = [
        t for t in json.loads((tmp_path / "w0.transitions.json").read_text()) if t["reason"] == "failure"
    ]
    assert len(recovery) == 1 and recovery[0]["step"] == 12  # the failed step is the one redone
    from taiji.metrics.runlog import read_jsonl

    kinds = [e["kind"] for e in read_jsonl(tmp_path / "run" / "events.jsonl")]
    assert kinds == ["start", "failure", "recovery", "end"]


def test_crash_with_replace_spawns_a_replacement_that_joins(tmp_path):
    faults = [{"action": "kill", "rank": 2, "step": 10, "phase": "allreduce"}]
    # v1 start, v2 without the failed worker, v3 with its replacement
    proc = run_elastic(
        tmp_path,
        3,
        "--steps",
        "3000",
        "--step-delay",
        "0.005",
        "--stop-at-version",
        "3",
        launcher_args=["--replace"],
        faults=faults,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16)
    assert result["sizes"][-2:] == [2, 3]
    assert (tmp_path / "w3.jsonl").exists(), "the replacement w3 never trained"


def test_hung_worker_is_detected_by_timeout_killed_and_removed(tmp_path):
    faults = [{"action": "hang", "rank": 1, "step": 8, "phase": "allreduce"}]
    proc = run_elastic(tmp_path, 3, "--steps", "30", faults=faults)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "suspected hang" in proc.stdout
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [3, 2]


def test_worker_killed_during_state_sync_of_a_grow(tmp_path):
    faults = [{"action": "kill", "worker": "w1", "phase": "sync"}]
    proc = run_elastic(
        tmp_path,
        2,
        "--steps",
        "150",
        "--step-delay",
        "0.005",
        "--sizes",
        "3",
        launcher_args=["--max-np", "3"],
        faults=faults,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 2] or result["sizes"] == [2]
    assert not (tmp_path / "w1.jsonl").read_text().count('"version": 2')


def test_below_min_np_without_a_joiner_fails_with_a_clear_error(tmp_path):
    faults = [
        {"action": "kill", "rank": 1, "step": 5, "phase": "allreduce"},
        {"action": "hang", "worker": "w2", "phase": "boot"},
    ]
    proc = run_elastic(
        tmp_path, 2, "--steps", "400", launcher_args=["--min-np", "2", "--join-timeout", "4"], faults=faults
    )
    assert proc.returncode == 128 + 9, proc.stdout[-4000:] + proc.stderr
    assert "below --min-np 2" in proc.stdout and "w1" in proc.stdout


def test_resize_and_status_from_another_terminal(tmp_path):
    args = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--max-np",
        "3",
        "--",
        sys.executable,
        ELASTIC_SCRIPT,
        str(tmp_path),
        "--steps",
        "100000",
        "--step-delay",
        "0.005",
    ]
    env = dict(os.environ, TAIJI_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    cli = [sys.executable, "-m", "taiji.launch.cli"]
    try:
        job_id = None
        for line in launcher.stdout:
            if line.startswith("taiji: job ") and job_id is None:
                job_id = line.split()[2].rstrip(":")
            if "cluster v1" in line:
                break
        bad = subprocess.run(
            cli + ["resize", "--job", "nope", "2"], capture_output=True, text=True, env=env, timeout=60
        )
        assert bad.returncode != 0 and "no running job 'nope'" in bad.stderr
        ok = subprocess.run(
            cli + ["resize", "--job", job_id, "3"], capture_output=True, text=True, env=env, timeout=60
        )
        assert ok.returncode == 0, ok.stderr
        for line in launcher.stdout:
            if "cluster v2: 3 worker(s)" in line:
                break
        status = subprocess.run(
            cli + ["status", "--job", job_id], capture_output=True, text=True, env=env, timeout=60
        )
        assert status.returncode == 0 and f"job {job_id}: cluster v2, 3 worker(s)" in status.stdout, status
        below = subprocess.run(
            cli + ["resize", "--job", job_id, "0"], capture_output=True, text=True, env=env, timeout=60
        )
        assert below.returncode != 0 and "cannot resize to 0" in below.stderr
        subprocess.run(
            cli + ["resize", "--job", job_id, "9"], capture_output=True, text=True, env=env, timeout=60
        )
        for line in launcher.stdout:
            if "clamped to --max-np 3" in line:
                break
        else:
            raise AssertionError("the launcher never logged the clamp")
        listed = subprocess.run(cli + ["ls"], capture_output=True, text=True, env=env, timeout=60)
        assert any(line.startswith(job_id) and " running " in line for line in listed.stdout.splitlines()), (
            listed
        )
        # a SIGKILLed launcher cannot unregister: the next command notices, says so, and prunes
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        dead = subprocess.run(
            cli + ["status", "--job", job_id], capture_output=True, text=True, env=env, timeout=60
        )
        assert dead.returncode == 1 and f"job {job_id} is not running (its launcher" in dead.stderr, dead
        assert "Traceback" not in dead.stderr and len(dead.stderr.splitlines()) == 1
        gone = subprocess.run(
            cli + ["resize", "--job", "nope", "2"], capture_output=True, text=True, env=env, timeout=60
        )
        assert "running: none" in gone.stderr, "the dead job is no longer listed as known"
    finally:
        stop_launcher(launcher)


def test_a_busy_rank_is_waited_for_not_killed(tmp_path):
    """Issue 17 item 1: rank 0 evaluates for 6 s (three collective timeouts) in user code while its
    peer waits. Its heartbeat is fresh, so it is busy, not hung: no worker is stopped, the step the
    peer gave up on is retried in rebuilt groups of the same members, and every invariant holds."""
    proc = run_elastic(
        tmp_path, 2, "--steps", "40", "--pause", "0", "10", "6", launcher_args=["--timeout", "2"]
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "stopping worker" not in proc.stdout, proc.stdout[-4000:]
    assert "w0 is busy" in proc.stdout and "rebuild the groups" in proc.stdout, proc.stdout[-4000:]
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2], result["sizes"]


def test_a_stopped_worker_outside_any_collective_is_found_by_its_heartbeat(tmp_path):
    """SIGSTOP while its peers are not waiting on it yet (in compute): the heartbeat stops, and the
    launcher stops the worker after --liveness-timeout, not after the collective timeout."""
    faults = [{"action": "hang", "rank": 1, "step": 8, "phase": "compute"}]
    # (a collective timeout far above the liveness timeout, yet short enough that a run in which
    # the heartbeat path misses does not cost the suite a minute)
    proc = run_elastic(
        tmp_path,
        3,
        "--steps",
        "30",
        faults=faults,
        launcher_args=["--timeout", "20", "--liveness-timeout", "2"],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "stopped or frozen" in proc.stdout or "heartbeat stopped" in proc.stdout, proc.stdout[-4000:]
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [3, 2]


def test_a_stopped_worker_in_a_decoupled_phase_is_found_by_its_heartbeat(tmp_path):
    """PairAveraging trains in decoupled phases: no collective waits on a SIGSTOPped worker until the
    phase's sync point. The heartbeat finds it within --liveness-timeout instead."""
    # at its first local step: which step indices a worker runs in a decoupled phase depends on
    # what it claims there (a fixed index could be one that rank 2 never runs, and nothing would hang)
    faults = [{"action": "hang", "rank": 2, "step": -1, "phase": "compute"}]
    proc = run_elastic(
        tmp_path,
        3,
        "--steps",
        "60",
        "--strategy",
        "pair_averaging",
        faults=faults,
        launcher_args=["--timeout", "60", "--liveness-timeout", "2"],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "stopped or frozen" in proc.stdout, proc.stdout[-4000:]


def test_every_worker_failing_at_the_same_step_in_every_version_stops_the_job_with_the_reason(tmp_path):
    """A failure that rebuilding the groups cannot cure (every worker's collectives fail at step 5,
    in every version) ends the job after ``max_rebuilds`` versions with a reason that says so,
    instead of rebuilding versions for ever."""
    faults = [{"action": "raise", "phase": "allreduce", "step": 5, "repeat": True}]
    proc = run_elastic(tmp_path, 2, "--steps", "40", faults=faults, timeout=180)
    assert proc.returncode != 0, proc.stdout[-4000:]
    out = proc.stdout + proc.stderr
    assert "every worker failed at step 5 in 11 cluster versions in a row" in out, out[-4000:]
    assert out.count("every worker reported a failure: rebuild the groups") == 10, out[-4000:]
