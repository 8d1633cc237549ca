"""A preemption notice to one of 3 hosts of a job (network-namespace hosts, taiji_harness/netns.py):
`taiji drain` on that host (a SIGTERM to its `taiji join` agent) is a planned shrink placed off that
host — its workers leave at the next step boundary, no step fails, the agent exits 0 — audited with
the invariants of docs/design.md#invariants.
Skipped, with the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import sys

import pytest

from taiji_harness.testing import HostsJob, check_invariants, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_sigterm_to_an_agent_is_a_planned_shrink_off_its_host(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    try:
        job.start(
            ["-np", "2", "--nproc-per-node", "2", "--max-np", "4"],
            ["--batch", "16", "--steps", "100000", "--stop-at-version", "3", "--step-delay", "0.03"],
        )
        job.join(
            1, 2, extra=["--grace", "30"]
        )  # the job grows onto the second host's two slots: v2, 4 workers
        job.wait_log("cluster v2: 4 worker(s)")
        wait_for(
            lambda: (tmp_path / "w3.jsonl").exists() and (tmp_path / "w3.jsonl").stat().st_size > 0,
            60,
            "a step committed by worker w3 (on host 1)",
        )
        drained = hosts3.run(
            1,
            [sys.executable, "-m", "taiji.launch.cli", "drain", "--job", job.job_id],
            timeout=60,
            env=job.env,
        )
        assert drained.returncode == 0 and "the agent left after" in drained.stdout, (
            drained.stdout + drained.stderr
        )
        assert job.agents[1].wait(timeout=60) == 0, job.log("agent1")[-3000:]
        assert job.finish() == 0, job.log()[-4000:]  # the workers stop once at v3
    finally:
        for proc in [job.launcher, *job.agents.values()]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    launcher = job.log()
    assert "cluster v3: 2 worker(s) ['w0', 'w1'] (shrink 4 -> 2)" in launcher, launcher[-3000:]
    assert "drop failed" not in launcher and "failed first" not in launcher, launcher[-3000:]
    agent = job.log("agent1")  # then the job ends (--stop-at-version 3): the agent leaves or is told to stop
    assert "asked the job to shrink off this host" in agent and "dropped as lost" not in agent, agent[-2000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["kind"] == "failure"], "a planned shrink fails no step"
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 4, 2], result
    for i in (0, 1):
        wait_for(lambda i=i: not hosts3.pids(i), 30, f"every process on host {i} to exit")
