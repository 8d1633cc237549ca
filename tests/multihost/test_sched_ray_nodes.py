"""`taiji sched serve --ray` on a Ray cluster of emulated hosts (one `ray start --block` per network
namespace, started and ended by PID here: taiji_harness/ray_nodes.py): the scheduler's hosts are
the cluster's nodes, with no agent and no hosts file. The first job runs on the head node, the
second on a node added after it; a killed daemon re-adopts both from their named, detached Ray
actors; a third node added while they train joins the pool and one job grows onto it, the other
onto the node that frees (each job ends after its first resize); a node whose raylet is killed
leaves the pool. A job whose home node (its launcher's) is lost resumes from its checkpoint on
the node left. Audited: the invariants (docs/design.md#invariants) on each job (exactly-once data included),
no host ever held more workers than its slot, and no process of a job left on any host once the daemon
stops. Skipped, with the reason, where Ray or namespaces are missing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from taiji.checkpoint.storage import Storage
from taiji_harness import ray_nodes
from taiji_harness.netns import EmulatedHosts
from taiji_harness.sched_hosts import SchedOnHosts
from taiji_harness.testing import check_invariants, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # ~3 min quiet, 12.5 min at load 8-10


def _job_processes(hosts: EmulatedHosts, i: int) -> list[str]:
    """What of a job (a launcher, an agent, a worker) still runs on host ``i``."""
    found = []
    for pid in hosts.pids(i):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        if "taiji.launch.cli" in argv or "elastic_train.py" in argv:
            found.append(f"{pid}: {argv}")
    return found


def test_two_jobs_on_ray_nodes_grow_onto_a_node_added_and_survive_a_daemon_restart(tmp_path):
    why = ray_nodes.unavailable()
    if why:
        pytest.skip(why)
    with ray_nodes.token_auth(), ray_nodes.temp_dir("tjrs") as temp, EmulatedHosts(3) as hosts:
        s = SchedOnHosts(
            hosts,
            tmp_path,
            pool_args=("--ray", f"{hosts.address(0)}:{ray_nodes.PORT}", "--slots", "1", "--max-hosts", "3"),
        )
        try:
            _run(s, hosts, tmp_path, temp)
        finally:
            print(s.log("daemon"))


def _run(s: SchedOnHosts, hosts: EmulatedHosts, out: Path, temp: str) -> None:
    def up(i: int, times: int = 1) -> bool:  # (each daemon says it once for every node it finds)
        return s.log("daemon", all_of_it=True).count(f"host {s.addresses[i]} is up") >= times

    def add_node(i: int) -> None:  # (its processes, the jobs' actors among them, find TAIJI_HOME in s.env)
        ray_nodes.start_and_wait(hosts, i, out / f"ray{i}.log", temp, env=s.env)
        if s.daemon is not None:
            wait_for(lambda: up(i), 60, f"Ray node {i} in the pool")

    add_node(0)  # the head
    s.serve()
    wait_for(lambda: up(0), 60, "the head node in the pool")
    # each job ends once it has resized once (config v2): what makes it resize is the pool growing
    jobs = [
        s.submit(name, 2, 100000, step_delay=0.1, train_args=("--stop-at-version", "2"))
        for name in ("first", "second")
    ]
    wait_for(lambda: s.jobs()[jobs[0]].get("size") == 1, 240, "the first job running on the head node")
    add_node(1)  # the second job starts there
    wait_for(lambda: s.jobs()[jobs[1]].get("size") == 1, 240, "the second job running on the added node")
    assert s.jobs()[jobs[1]]["placement"] == [0, 1, 0], s.jobs()[jobs[1]]
    assert not any("sched agent" in p for i in range(3) for p in _job_processes(hosts, i))

    os.killpg(s.daemon.pid, signal.SIGKILL)  # their actors are detached: the jobs train on
    s.daemon.wait(10)
    s.serve()
    wait_for(lambda: up(0, 2) and up(1, 2), 60, "the new daemon's pool")
    assert all(f"re-adopted job {j} " in s.log("daemon", all_of_it=True) for j in jobs), s.log("daemon")

    add_node(2)  # a third node while both train: one job grows onto it, then the other onto what it frees
    wait_for(lambda: all(s.ended(j) for j in jobs), 600, "both jobs to grow once and finish")
    grown = [s.jobs()[j]["allocations"] for j in jobs]
    assert all(2 in [n for _, n in a] for a in grown), grown
    assert "3 host(s)" in s.sched("status")
    assert not s.oversubscribed()
    for name in ("first", "second"):
        assert check_invariants(out / name, batch=16)["sizes"] == [1, 2]
    raylet = ray_nodes.raylet_pid(hosts, 2)
    assert raylet is not None
    os.kill(raylet, signal.SIGKILL)  # a node leaves the cluster: its host leaves the pool once Ray says so
    wait_for(
        lambda: f"host {s.addresses[2]} is down" in s.log("daemon", all_of_it=True),
        120,
        "the removed node out of the pool",
    )
    assert f"({s.addresses[2]} down)" in s.sched("status")
    s.sched("stop")
    assert s.daemon.wait(60) == 0, s.log("daemon")
    for i in range(3):  # every launcher, agent and worker is gone (the Ray nodes end with the hosts)
        wait_for(lambda i=i: not _job_processes(hosts, i), 60, f"no job's process left on host {i}")


def _home_of(hosts: EmulatedHosts, job_dir: Path) -> int | None:
    """The host whose processes include the launcher (`taiji run`) of the job writing to ``job_dir``."""
    for i in range(hosts.n):
        for pid in hosts.pids(i):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # exited meanwhile
            if (
                b"run" in argv
                and str(job_dir).encode() in argv
                and any(b"taiji.launch.cli" in a for a in argv)
            ):
                return i
    return None


def test_a_job_whose_home_ray_node_is_lost_resumes_from_its_checkpoint_on_the_node_left(tmp_path):
    """The head on host 2 with no CPU (it holds no slot: not in the pool, and the cluster outlives
    the loss of a pool node), the daemon there too; the job runs on the nodes of hosts 0 and 1.
    Every process of its launcher's node is killed: the daemon tells its home lost (the
    launcher's actor died), suspends it at its latest checkpoint and resumes it on the node left."""
    why = ray_nodes.unavailable()
    if why:
        pytest.skip(why)
    with ray_nodes.token_auth(), ray_nodes.temp_dir("tjrh") as temp, EmulatedHosts(3) as hosts:
        s = SchedOnHosts(
            hosts,
            tmp_path,
            home=2,
            pool_args=("--ray", f"{hosts.address(2)}:{ray_nodes.PORT}", "--slots", "1", "--max-hosts", "2"),
        )
        try:
            ray_nodes.start_and_wait(hosts, 2, tmp_path / "ray2.log", temp, head=2, cpus=0, env=s.env)
            for i in (0, 1):
                ray_nodes.start_and_wait(hosts, i, tmp_path / f"ray{i}.log", temp, head=2, env=s.env)
            s.serve()
            job = s.submit("moved", 2, 160, "--checkpoint-every", "10", step_delay=0.05)
            wait_for(lambda: s.placed(job, [1, 1]), 240, "the job on both pool nodes")
            checkpoints = Storage(str(s.state / "jobs" / job / "checkpoints"))
            wait_for(lambda: checkpoints.listing().latest is not None, 120, "its first periodic checkpoint")
            home = _home_of(hosts, tmp_path / "moved")
            assert home in (0, 1), home
            hosts.kill(home)  # its raylet, the launcher's actor, the launcher, its store and worker
            wait_for(
                lambda: f"its home host {hosts.address(home)} was lost" in s.log("daemon"),
                120,
                "the job suspended off its lost home node",
            )
            wait_for(lambda: s.ended(job), 300, "the job to resume on the node left and finish")
            resumed = [
                line for line in s.log("daemon", all_of_it=True).splitlines() if "resuming from step" in line
            ]
            assert resumed and f"placed {hosts.address(1 - home)}=1" in resumed[-1], resumed
            assert _home_of(hosts, tmp_path / "moved") is None
            check_invariants(tmp_path / "moved", batch=16)
            s.sched("stop")
            assert s.daemon.wait(60) == 0, s.log("daemon")
            for i in range(2):
                wait_for(lambda i=i: not _job_processes(hosts, i), 60, f"no job's process left on host {i}")
        finally:
            print(s.log("daemon"))
