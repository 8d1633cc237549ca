"""The live scheduler with real jobs on one host (`taiji sched serve|submit|status|stop`): a
second job's arrival shrinks the first, its end grows the first back, the slots are never
oversubscribed, and nothing is left running after the daemon stops. Decisions alone:
tests/unit/test_sched_daemon.py, tests/unit/test_sched_rounds.py, tests/unit/test_sched_live_model.py."""

import json
import os
import signal
import subprocess
import sys

import pytest

from taiji_harness.testing import SCRIPTS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SLOTS = 2


def sched(env, state, *args, check=True):
    command, *rest = args
    proc = subprocess.run(
        [sys.executable, "-m", "taiji.launch.cli", "sched", command, "--state-dir", str(state), *rest],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def saved_jobs(state):
    try:
        return {job["id"]: job for job in json.loads((state / "state.json").read_text())["jobs"]}
    except (OSError, ValueError, KeyError):
        return {}


def state_of(state, job_id, *wanted):
    """True once the job is in one of ``wanted``; fails at once if it failed instead."""
    job = saved_jobs(state).get(job_id, {})
    assert job.get("state") != "failed" or "failed" in wanted, job.get("reason")
    return job.get("state") in wanted


def oversubscribed_instants(jobs):
    """Instants at which the observed workers of all jobs exceed the slots."""
    changes = sorted((t, job_id, n) for job_id, job in jobs.items() for t, n in job["allocations"])
    holding, bad = {}, []
    for t, job_id, n in changes:
        holding[job_id] = n
        if sum(holding.values()) > SLOTS:
            bad.append((t, dict(holding)))
    return bad


def start_daemon(tmp_path, env, state):
    log = open(tmp_path / "daemon.log", "a")
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
            "--state-dir",
            str(state),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()

    def started():
        try:
            return json.loads((state / "daemon.json").read_text())["pid"] == daemon.pid
        except (OSError, ValueError, KeyError):
            return daemon.poll() is not None

    wait_for(started, 60, "the daemon to start")
    assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
    return daemon


def clean_up(tmp_path, state, daemon):
    """Kill the daemon and every job launcher it started (they run in sessions of their own)."""
    if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
    for job in saved_jobs(state).values():
        for entry in (tmp_path / "home" / "jobs").glob(f"sched-{job['id']}.json"):
            try:
                os.killpg(json.loads(entry.read_text())["pid"], signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError, OSError):
                pass
    print((tmp_path / "daemon.log").read_text())


def launcher_running(tmp_path, job_id):
    entry = tmp_path / "home" / "jobs" / f"sched-{job_id}.json"
    try:
        os.kill(json.loads(entry.read_text())["pid"], 0)
        return True
    except (OSError, ValueError, KeyError):
        return False


TRAIN = [sys.executable, str(SCRIPTS / "elastic_train.py")]


def one_job_on_both_slots(tmp_path, env, state):
    """Submit an endless job and wait until it runs on both slots; its id."""
    (tmp_path / "out").mkdir()
    job = sched(
        env,
        state,
        "submit",
        "--max-np",
        "2",
        "--",
        *TRAIN,
        str(tmp_path / "out"),
        "--steps",
        "100000",
        "--step-delay",
        "0.01",
    ).stdout.strip()
    wait_for(
        lambda: state_of(state, job, "running") and saved_jobs(state)[job]["size"] == 2,
        90,
        "the job on both slots",
    )
    return job


def test_a_second_job_shrinks_the_first_and_its_end_grows_it_back(tmp_path):
    state = tmp_path / "sched"
    env = {**os.environ, "TAIJI_HOME": str(tmp_path / "home")}
    daemon = start_daemon(tmp_path, env, state)
    try:
        train = TRAIN
        (tmp_path / "long").mkdir()
        (tmp_path / "short").mkdir()
        long_job = sched(
            env,
            state,
            "submit",
            "--max-np",
            "2",
            "--name",
            "long",
            "--",
            *train,
            str(tmp_path / "long"),
            "--steps",
            "100000",
            "--step-delay",
            "0.01",
        ).stdout.strip()
        wait_for(
            lambda: state_of(state, long_job, "running") and saved_jobs(state)[long_job]["size"] == 2,
            90,
            "the first job on both slots",
        )
        short_job = sched(
            env,
            state,
            "submit",
            "--max-np",
            "1",
            "--name",
            "short",
            "--",
            *train,
            str(tmp_path / "short"),
            "--steps",
            "60",
            "--step-delay",
            "0.01",
        ).stdout.strip()
        wait_for(lambda: state_of(state, short_job, "finished"), 120, "the second job to end")
        wait_for(lambda: saved_jobs(state)[long_job]["size"] == 2, 60, "the first job to grow back")
        table = sched(env, state, "status").stdout
        assert "long" in table and "short" in table and "finished" in table, table
        jobs = saved_jobs(state)
        assert [n for _, n in jobs[long_job]["allocations"]] == [2, 1, 2], jobs[long_job]["allocations"]
        assert [n for _, n in jobs[short_job]["allocations"]][:1] == [1] and jobs[short_job][
            "state"
        ] == "finished"
        assert oversubscribed_instants(jobs) == []
        sched(env, state, "stop")
        assert daemon.wait(60) == 0
        jobs = saved_jobs(state)
        assert jobs[long_job]["state"] == "cancelled" and "stopped" in jobs[long_job]["reason"]
        assert not (state / "daemon.json").exists()
        png = tmp_path / "allocations.png"
        assert sched(env, state, "plot", "-o", str(png)).stdout.strip() == str(png)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        registry = tmp_path / "home" / "jobs"
        assert not list(registry.glob("*.json")) if registry.exists() else True, "a launcher was left running"
    finally:
        clean_up(tmp_path, state, daemon)


def test_a_killed_daemon_leaves_its_jobs_running_and_a_restarted_one_adopts_them(tmp_path):
    state, env = tmp_path / "sched", {**os.environ, "TAIJI_HOME": str(tmp_path / "home")}
    daemon = start_daemon(tmp_path, env, state)
    try:
        job = one_job_on_both_slots(tmp_path, env, state)
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
        assert launcher_running(tmp_path, job), "the job died with its daemon"
        assert "no scheduler daemon answered" in sched(env, state, "status", check=False).stderr
        daemon = start_daemon(tmp_path, env, state)
        assert "re-adopted job " + job in (tmp_path / "daemon.log").read_text()
        assert job in sched(env, state, "status").stdout
        assert sched(env, state, "cancel", job).stdout.strip() == f"{job}: cancelled"
        wait_for(lambda: not launcher_running(tmp_path, job), 30, "the cancelled job's launcher to exit")
        sched(env, state, "stop")
        assert daemon.wait(60) == 0
    finally:
        clean_up(tmp_path, state, daemon)


def test_a_job_whose_launcher_is_killed_fails_with_the_reason_and_frees_its_slots(tmp_path):
    state, env = tmp_path / "sched", {**os.environ, "TAIJI_HOME": str(tmp_path / "home")}
    daemon = start_daemon(tmp_path, env, state)
    try:
        job = one_job_on_both_slots(tmp_path, env, state)
        entry = json.loads((tmp_path / "home" / "jobs" / f"sched-{job}.json").read_text())
        os.killpg(
            entry["pid"], signal.SIGKILL
        )  # its launcher and (through their parent-death signal) its workers
        wait_for(lambda: state_of(state, job, "failed"), 30, "the daemon to notice")
        saved = saved_jobs(state)[job]
        assert "exited with -9" in saved["reason"] and saved["size"] == 0
        assert "0/2 slots in use" in sched(env, state, "status").stdout
        sched(env, state, "stop")
        assert daemon.wait(60) == 0
    finally:
        clean_up(tmp_path, state, daemon)
