"""Collectives across real processes with a rank killed (-9) or hung (SIGSTOP) mid-job, which
the others must see as a CommError within the timeout (tests/scripts/collectives_worker.py, started
as plain subprocesses against a store the test hosts)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from taiji import env
from taiji.cluster import spec
from taiji.cluster.store import JobStore, host_store
from taiji_harness.testing import REPO, SCRIPTS, wait_for

WORKER = str(SCRIPTS / "collectives_worker.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_killed_or_hung_rank_becomes_comm_error(tmp_path, fault):
    n, victim, timeout = 3, 1, 3.0
    server = host_store()
    job = JobStore(server, "faults")
    assert job.publish(spec.initial([spec.WorkerSpec(f"w{r}") for r in range(n)]))
    procs = []
    try:
        for r in range(n):
            environ = dict(
                os.environ,
                PYTHONUNBUFFERED="1",
                OMP_NUM_THREADS="1",
                **{
                    env.JOB_ID.name: "faults",
                    env.WORKER_ID.name: f"w{r}",
                    env.STORE_PORT.name: str(server.port),
                    env.TIMEOUT.name: str(timeout),
                },
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, WORKER, "fault", str(tmp_path)],
                    env=environ,
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_for(
            lambda: (
                all((tmp_path / f"ready{r}").exists() for r in range(n))
                or any(p.poll() is not None for p in procs)
            ),
            60,
            "workers to connect",
        )
        assert all(p.poll() is None for p in procs), [p.stdout.read() for p in procs if p.poll() is not None]
        os.kill(procs[victim].pid, getattr(signal, fault))
        server.set("test/go", "1")
        for r, p in enumerate(procs):
            if r != victim:
                p.wait(timeout=30)
        for r in range(n):
            if r == victim:
                continue
            outcome = json.loads((tmp_path / f"rank{r}.json").read_text())
            assert outcome["error"] in ("PeerLost", "CollectiveTimeout"), outcome
            assert outcome["elapsed"] < timeout + 5.0, outcome
            assert f"rank {r}" in outcome["message"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()
