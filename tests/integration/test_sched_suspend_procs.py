"""Suspend and resume with real jobs on one host (`taiji sched serve --slots 3`): a higher class's
arrival suspends a running job (final checkpoint, its launcher exits 75), the daemon is SIGKILLed
while the job is suspending and a restarted one re-adopts it, the job resumes from its checkpoint
at another size and finishes: every sample trained exactly once across its launchers, its model
that of an uninterrupted 1-worker run (the audit of tests/scripts/elastic_train.py). Decisions
alone: tests/unit/test_sched_suspend.py."""

import json
import os
import signal
import subprocess
import sys

import pytest

from taiji_harness.testing import ELASTIC_SCRIPT, check_invariants, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SLOTS, BATCH = 3, 16


def sched(env, state, *args):
    command, *rest = args
    proc = subprocess.run(
        [sys.executable, "-m", "taiji.launch.cli", "sched", command, "--state-dir", str(state), *rest],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def saved(state, job_id):
    try:
        jobs = {job["id"]: job for job in json.loads((state / "state.json").read_text())["jobs"]}
    except (OSError, ValueError, KeyError):
        return {}
    job = jobs.get(job_id, {})
    assert job.get("state") != "failed", job.get("reason")
    return job


def start_daemon(tmp_path, env, state):
    with open(tmp_path / "daemon.log", "a") as log:
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taiji.launch.cli",
                "sched",
                "serve",
                "--slots",
                str(SLOTS),
                "--policy",
                "drf",
                "--round",
                "0.5",
                "--min-run-factor",
                "0",
                "--min-left-factor",
                "0",
                "--state-dir",
                str(state),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def serving():
        try:
            return json.loads((state / "daemon.json").read_text())["pid"] == daemon.pid
        except (OSError, ValueError, KeyError):
            return daemon.poll() is not None

    wait_for(serving, 60, "the daemon to start")
    assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
    return daemon


def kill_everything(tmp_path, daemon):
    """The daemon and every launcher it started (each in a session of its own), by pid."""
    if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
    for entry in (tmp_path / "home" / "jobs").glob("sched-*.json"):
        try:
            os.killpg(json.loads(entry.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError, OSError):
            pass
    print((tmp_path / "daemon.log").read_text())


def test_a_suspended_job_resumes_at_another_size_exactly_once_across_a_daemon_restart(tmp_path):
    state, env = tmp_path / "sched", {**os.environ, "TAIJI_HOME": str(tmp_path / "home")}
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    out_a.mkdir()
    out_b.mkdir()
    daemon = start_daemon(tmp_path, env, state)
    try:
        a = sched(
            env,
            state,
            "submit",
            "--max-np",
            str(SLOTS),
            "--name",
            "long",
            "--",
            sys.executable,
            ELASTIC_SCRIPT,
            str(out_a),
            "--steps",
            "50",
            "--batch",
            str(BATCH),
            "--step-delay",
            "0.1",
        )
        wait_for(
            lambda: saved(state, a).get("size") == SLOTS and saved(state, a).get("step", 0) >= 5,
            90,
            "the first job on every slot",
        )
        b = sched(
            env,
            state,
            "submit",
            "--priority",
            "1",
            "--min-np",
            "2",
            "--max-np",
            "2",
            "--name",
            "urgent",
            "--",
            sys.executable,
            ELASTIC_SCRIPT,
            str(out_b),
            "--steps",
            "20",
            "--batch",
            str(BATCH),
            "--step-delay",
            "0.05",
        )
        wait_for(lambda: saved(state, a).get("suspending") is not None, 60, "the first job to be suspending")
        os.killpg(daemon.pid, signal.SIGKILL)  # while its launcher checkpoints and stops
        daemon.wait(10)
        daemon = start_daemon(tmp_path, env, state)
        assert (
            f"re-adopted job {a}" in (tmp_path / "daemon.log").read_text()
            or saved(state, a)["state"] == "suspended"
        )
        wait_for(
            lambda: saved(state, a).get("state") == "suspended" or saved(state, a).get("stopped_at", -1) >= 0,
            60,
            "the first job suspended",
        )
        stopped = saved(state, a)["stopped_at"]
        assert stopped > 0
        wait_for(lambda: saved(state, b).get("state") == "finished", 120, "the urgent job to finish")
        wait_for(lambda: saved(state, a).get("state") == "finished", 150, "the first job to finish")
        job = saved(state, a)
        sizes = [n for _, n in job["allocations"]]
        assert 0 in sizes and len(job["suspensions"]) == 1, job["allocations"]
        assert sizes[sizes.index(0) + 1] != SLOTS, f"it resumed at {SLOTS} again: {sizes}"
        audit = check_invariants(out_a, BATCH)  # contiguous steps, exactly-once, the 1-worker trajectory
        assert audit["steps"] == 50 and SLOTS in audit["sizes"], audit
        sched(env, state, "stop")
        assert daemon.wait(60) == 0
    finally:
        kill_everything(tmp_path, daemon)
