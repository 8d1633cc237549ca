"""Jobs across emulated hosts (network namespaces, taiji_harness/netns.py): grow onto new hosts, shrink off
the newest, lose an agent, a link or the head, and refuse a wrong secret — with the invariants
(docs/design.md#invariants) audited (contiguous steps, identical replicas, exactly-once data) and no process
left in any host. Skipped, with the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from taiji_harness.netns import EmulatedHosts, etcd_command
from taiji_harness.testing import HostsJob, check_invariants, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _no_process_left(hosts: EmulatedHosts, *indices: int) -> None:
    for i in indices:
        wait_for(lambda i=i: not hosts.pids(i), 30, f"every process on host {i} to exit")


def test_grow_onto_a_second_host_then_a_third_and_shrink_off_the_newest(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    # rank 0 asks for 4 workers at step 5 (only 2 fit the head), then for 3 once 4 train
    job.start(
        ["-np", "2", "--nproc-per-node", "2", "--max-np", "5"],
        ["--batch", "16", "--steps", "100000", "--sizes", "4", "3", "--every", "8", "--step-delay", "0.02"],
    )
    job.wait_log("resize requested by test schedule: 2 -> 4")
    job.join(1, 1)
    job.wait_log("3 worker(s)")
    twin = hosts3.run(
        1,
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "join",
            f"{job.job_id}@{job.head}:{job.PORT}",
            "--secret-file",
            str(job.secret_file),
            "--nproc-per-node",
            "1",
            "--host",
            hosts3.address(1),
            "--timeout",
            "5",
        ],
        timeout=60,
        env=job.env,
    )
    assert twin.returncode == 2 and "refused by the job's controller" in twin.stdout, (
        twin.stdout + twin.stderr
    )
    job.join(2, 1)  # joins while training; the job grows onto it
    assert job.finish() == 0, job.log()[-4000:]
    for i in (1, 2):
        assert job.agents[i].wait(timeout=30) == 0, job.log(f"agent{i}")
    launcher = job.log()
    assert f"host {hosts3.address(1)} joined" in launcher and f"host {hosts3.address(2)} joined" in launcher
    assert "shrink 4 -> 3" in launcher, launcher[-3000:]
    # the shrink dropped the newest worker, which ran on the newest host
    assert f"{hosts3.address(2)} rank 3 |" in job.log("agent2")
    result = check_invariants(tmp_path, 16)
    assert result["sizes"][-2:] == [4, 3], result
    _no_process_left(hosts3, 0, 1, 2)


def test_nnodes_waits_for_its_hosts_starts_across_them_and_refuses_one_more(hosts3, tmp_path):
    """`--nnodes 2:2`: the job starts only once a second host joined, with a worker on each; a
    third host is refused (exit 2) and changes nothing."""
    job = HostsJob(hosts3, tmp_path)
    job.start(
        ["--nnodes", "2:2", "--nproc-per-node", "1"],
        ["--batch", "16", "--steps", "300", "--step-delay", "0.02"],
    )
    job.wait_log("waiting for 1 more host(s) to join")
    assert "cluster v1" not in job.log()
    job.join(1, 1)
    job.wait_log("cluster v1: 2 worker(s)")
    wait_for(lambda: len(hosts3.pids(1)) >= 2, 30, "a worker beside the agent on host 1")
    extra = job.join(2, 1)
    assert extra.wait(timeout=60) == 2, job.log("agent2")
    assert "MAX of --nnodes" in job.log("agent2"), job.log("agent2")
    assert job.finish() == 0, job.log()[-4000:]
    assert job.agents[1].wait(timeout=30) == 0, job.log("agent1")
    assert check_invariants(tmp_path, 16)["sizes"] == [2]
    _no_process_left(hosts3, 0, 1, 2)


@pytest.mark.skipif(shutil.which("tc") is None, reason="no tc (iproute2) to shape the links")
def test_hierarchical_allreduce_across_shaped_hosts_survives_losing_a_non_leader_then_a_leader(
    hosts3, tmp_path
):
    """`--topology hierarchical` on 2 hosts x 2 with slower links between hosts: host 1's
    non-leader (w3) is killed mid-allreduce, then its leader (w2): each time the survivors
    rebuild the plan's groups for the new version and retry the step (exactly once, identical
    replicas), down to host 0 alone."""
    job = HostsJob(hosts3, tmp_path)
    job.env["TAIJI_FAULTS"] = json.dumps(
        [
            {"action": "kill", "worker": "w3", "step": 15, "phase": "allreduce"},
            {"action": "kill", "worker": "w2", "step": 40, "phase": "allreduce"},
        ]
    )
    for i in (0, 1):
        hosts3.shape(i)
    job.start(
        ["--nnodes", "2:2", "--nproc-per-node", "2", "--topology", "hierarchical", "--max-failures", "3"],
        ["--batch", "16", "--steps", "70", "--step-delay", "0.02"],
    )
    job.join(1, 2)
    assert job.finish() == 0, job.log()[-4000:]
    assert job.agents[1].wait(timeout=30) == 0, job.log("agent1")[-3000:]
    assert check_invariants(tmp_path, 16)["sizes"] == [4, 3, 2]
    _no_process_left(hosts3, 0, 1)


def _grown_to_four(job: HostsJob, steps: int = 400, timeout: float = 3, *script_args: str) -> None:
    """Host 0 trains with 2 workers; host 1 joins with 2 slots; a step commits at 4."""
    job.start(
        ["-np", "2", "--nproc-per-node", "2", "--max-np", "4"],
        ["--batch", "16", "--steps", str(steps), "--step-delay", "0.03", *script_args],
        timeout=timeout,
    )
    job.join(1, 2)
    job.wait_log("4 worker(s)")
    # a step committed at 4 workers: the joiners on host 1 train
    wait_for(
        lambda: (job.out / "w3.jsonl").exists() and (job.out / "w3.jsonl").stat().st_size > 0,
        60,
        "a step committed by worker w3 (on host 1)",
    )


def test_agent_killed_its_workers_leave_in_one_version(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    # v1 2 workers, v2 4, v3 the 2 left: the workers stop after their first step at v3, not at step 400
    _grown_to_four(job, 400, 30, "--stop-at-version", "3")
    killed = time.time()
    job.agents[1].send_signal(signal.SIGKILL)  # its workers die with it (parent-death signal)
    assert job.finish() == 0, job.log()[-4000:]
    # the survivors learn of the lost host from the new version, not one by one from each other's
    # closed sockets (~1 s apart) nor from a collective timeout (30 s here)
    assert job.resumed_after(killed, 2) < 1.0, job.log()[-3000:]
    launcher = job.log()
    assert f"host {hosts3.address(1)} is lost" in launcher, launcher[-3000:]
    assert "tether to the controller closed" in launcher, launcher[-3000:]  # at once, not by a stale beat
    assert "drop failed w2, w3" in launcher, launcher[-3000:]  # both in one version
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 4, 2], result
    _no_process_left(hosts3, 0, 1)


def test_an_agent_killed_at_many_points_of_a_step_every_survivor_commits_the_same_steps(hosts3, tmp_path):
    """Host 1's agent (2 of 4 workers) is SIGKILLed three times, at different points of a 30 ms step,
    and joins again each time: every survivor commits every step exactly once — none skipped by a
    worker whose attempt failed while its peers committed (the audit checks each worker's steps) —
    and the survivors go on within a second each time."""
    job = HostsJob(hosts3, tmp_path)
    job.start(
        ["-np", "2", "--nproc-per-node", "2", "--max-np", "4"],
        ["--batch", "16", "--steps", "100000", "--step-delay", "0.03", "--stop-at-version", "8"],
        timeout=30,
    )
    offsets = random.Random(31).sample(range(30), 3)  # ms after a commit at 4 workers
    for cycle, offset in enumerate(offsets):
        job.join(1, 2)
        job.wait_log(f"cluster v{2 * cycle + 2}: 4 worker(s)")
        seen = len(job.commits())
        wait_for(
            lambda seen=seen: any(r["size"] == 4 for r in job.commits()[seen:]),
            60,
            "a step committed at 4 workers",
        )
        time.sleep(offset / 1000)  # where in the step the kill lands (not a synchronisation)
        killed = time.time()
        job.agents[1].send_signal(signal.SIGKILL)
        job.agents[1].wait(timeout=30)
        job.wait_log(f"cluster v{2 * cycle + 3}: 2 worker(s)")
        wait_for(
            lambda killed=killed: any(r["time"] > killed and r["size"] == 2 for r in job.commits()),
            60,
            "a step at 2",
        )
        assert job.resumed_after(killed, 2) < 1.5, job.log()[-3000:]
    job.join(1, 2)
    assert job.finish() == 0, job.log()[-4000:]
    assert job.agents[1].wait(timeout=30) == 0, job.log("agent1")[-3000:]
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 4, 2, 4, 2, 4, 2, 4], result
    _no_process_left(hosts3, 0, 1)


@pytest.mark.parametrize(
    "store",
    [
        "tcp",
        pytest.param(
            "etcd",
            marks=pytest.mark.skipif(
                shutil.which("etcd") is None, reason="no etcd server binary (apt-get install -y etcd-server)"
            ),
        ),
    ],
)
def test_link_down_the_host_is_dropped_and_its_workers_stop(hosts3, tmp_path, store):
    job = HostsJob(hosts3, tmp_path, store=store)
    patience = 12.0  # the agent's --timeout: longer than an etcd call's own retries (10 s)
    job.start(
        ["-np", "2", "--nproc-per-node", "2", "--max-np", "4"],
        ["--batch", "16", "--steps", "400", "--step-delay", "0.03"],
        timeout=30,
    )
    job.join(1, 2, extra=["--timeout", f"{patience:g}"])
    job.wait_log("4 worker(s)")
    wait_for(lambda: any(r["size"] == 4 for r in job.commits()), 60, "a step committed at 4 workers")
    exited: list[float] = []
    agent = job.agents[1]
    threading.Thread(target=lambda: exited.append(agent.wait() and time.time()), daemon=True).start()
    cut = time.time()
    hosts3.link_down(1)
    assert job.finish() == 0, job.log()[-4000:]
    # the survivors, stuck in the step's allreduce with the cut-off host, abandon it once the new
    # version drops that host (its liveness timeout, 2 s), not when the 30 s collective timeout ends
    assert job.resumed_after(cut, 2) < 2 + 3.0, job.log()[-3000:]
    assert f"host {hosts3.address(1)} is lost" in job.log(), job.log()[-3000:]
    result = check_invariants(tmp_path, 16)
    assert result["sizes"][-1] == 2, result
    # cut off, the agent keeps trying for its --timeout, then stops its workers and says why
    assert agent.wait(timeout=60) == 1
    wait_for(lambda: exited, 5, "the agent's exit time")
    gave_up = exited[0] - cut
    assert patience - 1 < gave_up < patience + 15, gave_up
    assert "lost the job store" in job.log("agent1"), job.log("agent1")[-2000:]
    assert "frame #" not in job.log("agent1"), job.log("agent1")[-2000:]
    _no_process_left(hosts3, 0, 1)


def test_head_killed_with_the_tcp_store_every_host_stops(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    _grown_to_four(job)
    job.launcher.send_signal(signal.SIGKILL)
    assert job.agents[1].wait(timeout=60) == 1
    assert "lost the job store" in job.log("agent1"), job.log("agent1")[-2000:]
    _no_process_left(hosts3, 0, 1)


def test_wrong_or_missing_secret_is_refused_and_changes_nothing(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    job.start(
        ["-np", "1", "--nproc-per-node", "1", "--max-np", "3"],
        ["--batch", "16", "--steps", "150", "--step-delay", "0.02"],
    )
    job.wait_log("cluster v1")
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(os.urandom(32).hex())
    wrong.chmod(0o600)
    refused = job.join(1, 1, secret_file=wrong)
    assert refused.wait(timeout=60) == 1
    assert "is not this job's" in job.log("agent1") and "Nothing was changed" in job.log("agent1")
    loose = tmp_path / "loose.secret"
    loose.write_text(job.secret_file.read_text())
    loose.chmod(0o644)
    assert job.join(2, 1, secret_file=loose).wait(timeout=60) == 2
    assert "readable by other users" in job.log("agent2")
    assert job.finish() == 0, job.log()[-3000:]
    assert "joined" not in job.log() and "cluster v2" not in job.log()
    assert check_invariants(tmp_path, 16)["sizes"] == [1]
    _no_process_left(hosts3, 0, 1, 2)


@pytest.mark.skipif(
    shutil.which("etcd") is None, reason="no etcd server binary (apt-get install -y etcd-server)"
)
def test_etcd_store_grow_across_hosts_then_a_frozen_agent_is_dropped(hosts3, tmp_path):
    """An agent frozen (SIGSTOP) stops beating and renewing its lease: the launcher drops the host's
    workers in one version, when its silence reaches the liveness timeout or etcd deletes its leased
    key, whichever comes first; thawed, the agent learns it was dropped and stops them."""
    job = HostsJob(hosts3, tmp_path, store="etcd")
    _grown_to_four(job)
    assert f"store etcd://{hosts3.address(0)}:{HostsJob.PORT}" in job.log()
    agent = job.agents[1]
    agent.send_signal(signal.SIGSTOP)
    lost = f"host {hosts3.address(1)} is lost"
    try:
        wait_for(lambda: lost in job.log(), 60, "the frozen agent's host to be dropped")
    finally:
        agent.send_signal(signal.SIGCONT)
    why = job.log().split(lost, 1)[1].split("\n", 1)[0]
    assert "lease expired" in why or "has not been heard from" in why, why
    assert job.finish() == 0, job.log()[-4000:]
    assert agent.wait(timeout=60) in (0, 1), job.log("agent1")[-3000:]
    assert "drop failed w2, w3" in job.log(), job.log()[-3000:]
    assert check_invariants(tmp_path, 16)["sizes"] == [2, 4, 2]
    _no_process_left(hosts3, 0, 1)


@pytest.mark.skipif(
    shutil.which("etcd") is None, reason="no etcd server binary (apt-get install -y etcd-server)"
)
def test_etcd_head_killed_an_agent_takes_over_and_training_goes_on(hosts3, tmp_path):
    """The store on a third host (the user's etcd); the launcher's host dies; the agent of host 1
    wins the election, drops host 0's workers in one version, and the job trains to its end."""
    etcd_host = hosts3.address(2)
    data = tmp_path / "etcd-data"
    etcd = hosts3.popen(
        2,
        etcd_command(etcd_host, str(data)),
        stdout=open(tmp_path / "etcd.log", "w"),
        stderr=subprocess.STDOUT,
    )
    job = HostsJob(hosts3, tmp_path, store=f"etcd://{etcd_host}:2379")
    _grown_to_four(job)
    job.launcher.send_signal(signal.SIGKILL)  # the launcher's host dies: its workers die with it
    agent = job.agents[1]
    assert agent.wait(timeout=150) == 0, job.log("agent1")[-4000:]
    log = job.log("agent1")
    assert "took over job" in log and f"host {hosts3.address(0)} is lost" in log, log[-3000:]
    assert "its tether closed" in log, log[-3000:]  # at once, not after its beat went stale
    assert "drop failed w0, w1" in log, log[-3000:]
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 4, 2], result
    assert etcd.poll() is None
    _no_process_left(hosts3, 0, 1)


def test_a_store_nobody_serves_is_a_clear_error(hosts3, tmp_path):
    from taiji.cluster import auth

    secret = auth.write_secret_file(tmp_path / "s.secret", auth.new_secret())
    result = hosts3.run(
        1,
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "join",
            f"jx@{hosts3.address(0)}:29999",
            "--secret-file",
            str(secret),
            "--nproc-per-node",
            "1",
            "--host",
            hosts3.address(1),
            "--timeout",
            "3",
        ],
        timeout=60,
        env=dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR"),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot reach the job store" in result.stderr, result.stderr[-2000:]
    _no_process_left(hosts3, 1)


def test_a_placed_resize_shrinks_the_host_it_names_not_the_newest(hosts3, tmp_path):
    job = HostsJob(hosts3, tmp_path)
    job.start(
        ["-np", "2", "--nproc-per-node", "2", "--max-np", "4"],
        ["--batch", "16", "--steps", "100000", "--stop-at-version", "3", "--step-delay", "0.02"],
    )
    job.join(1, 2)  # the job grows onto the second host's two slots: v2, 4 workers
    job.wait_log("cluster v2: 4 worker(s)")
    head, second = job.head, hosts3.address(1)
    resize = subprocess.run(
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "resize",
            "--job",
            job.job_id,
            "--placement",
            f"{head}=1,{second}=2",
            "3",
        ],
        env=job.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert resize.returncode == 0, resize.stdout + resize.stderr
    assert job.finish() == 0, job.log()[-4000:]  # the workers stop at v3
    assert job.agents[1].wait(timeout=30) == 0, job.log("agent1")
    launcher = job.log()
    # without the placement the newest worker (w3, on the second host) would have left
    assert "cluster v3: 3 worker(s) ['w0', 'w2', 'w3'] (shrink 4 -> 3)" in launcher, launcher[-3000:]
    check_invariants(tmp_path, 16)
    _no_process_left(hosts3, 0, 1)
