"""`taiji run --ray` on a Ray cluster of emulated hosts: each Ray node runs in its own network
namespace (`ray start --block`, no dashboard, a small object store), started and ended by PID here
(never `ray stop`, which ends every Ray process on the machine). The job starts on 2 Ray nodes,
grows onto a third added while it trains, and goes on without a node whose raylet is killed; with
the store on etcd, an agent on another node takes over when the launcher's node dies — with the
invariants (docs/design.md#invariants) audited. Skipped, with the reason, where Ray or namespaces are
missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taiji_harness import ray_nodes
from taiji_harness.netns import EmulatedHosts, etcd_command
from taiji_harness.testing import HostsJob, check_invariants, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RAY_PORT = ray_nodes.PORT


def _ray_node(hosts: EmulatedHosts, i: int, out: Path, temp: str) -> subprocess.Popen:
    return ray_nodes.start_node(hosts, i, out / f"ray{i}.log", f"{temp}/{i}")


def _argvs(hosts: EmulatedHosts, i: int) -> list[list[bytes]]:
    found = []
    for pid in hosts.pids(i):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue  # exited meanwhile
    return found


def _committed_at(job: HostsJob, size: int) -> bool:
    try:
        return any(record["size"] == size for record in job.commits())
    except ValueError:  # a line being written
        return False


@pytest.fixture(scope="module")
def ray_hosts(tmp_path_factory):
    """Three emulated hosts; Ray's head on host 0 and a node on host 1 (host 2's is started by the test)."""
    why = ray_nodes.unavailable()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("ray")
    with ray_nodes.token_auth(), ray_nodes.temp_dir("tjray") as temp, EmulatedHosts(3) as hosts:
        for i in (0, 1):
            _start_node(hosts, i, out / f"ray{i}.log", temp)
        yield hosts, out, temp


def _start_node(hosts: EmulatedHosts, i: int, log_path: Path, temp: str) -> None:
    """A Ray node on host ``i``: what runs in its actors keeps its taiji files beside the logs."""
    ray_nodes.start_and_wait(hosts, i, log_path, temp, env={"TAIJI_HOME": str(log_path.parent / "home")})


def _guide_flags() -> list[str]:
    """The flags of ray.md's first `taiji run --ray` command, as written (its address is the guide's)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "ray.md").read_text()
    line = next(line for line in guide.splitlines() if line.startswith("taiji run --ray "))
    words = line.split("#")[0].split()
    return words[2 : words.index("python")]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _worker_pids(hosts: EmulatedHosts, i: int) -> list[int]:
    found = []
    for pid in hosts.pids(i):
        try:
            if b"elastic_train.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_the_guides_first_command_as_written_starts_here_grows_onto_the_other_node_with_the_environment(
    ray_hosts, tmp_path
):
    """ray.md's first command (its address replaced by this cluster's) on Ray nodes 0 and 1: one
    worker here, one on node 1 as its actor's agent places it; a variable exported for the launcher
    reaches the worker on the other node too; no manual `taiji join` recipe is printed."""
    hosts, _, _ = ray_hosts
    flags = _guide_flags()
    assert flags[:1] == ["--ray"] and "--nproc-per-node" in flags, flags
    flags[1] = f"{hosts.address(0)}:{RAY_PORT}"
    job = HostsJob(hosts, tmp_path)
    job.env["GUIDE_EXPORTED"] = "reaches-every-rank"  # `export GUIDE_EXPORTED=...; taiji run --ray ...`
    job.start(
        [*flags, "--join-timeout", "90"],
        ["--batch", "16", "--steps", "100000", "--step-delay", "0.05"],
        timeout=30,
    )
    try:
        wait_for(lambda: _committed_at(job, 2), 120, "a step committed by 2 workers (here and on node 1)")
        remote = [_environ(pid) for pid in _worker_pids(hosts, 1)]
        assert remote and all(e.get("GUIDE_EXPORTED") == "reaches-every-rank" for e in remote), remote
        assert all(e.get("TAIJI_HOME") != job.env["TAIJI_HOME"] for e in remote), remote  # the node's own
        job.launcher.send_signal(signal.SIGTERM)
        assert job.launcher.wait(timeout=60) == 128 + signal.SIGTERM, job.log()[-3000:]
    finally:
        if job.launcher.poll() is None:
            job.launcher.kill()
            job.launcher.wait()
    launcher = job.log()
    assert "job jmh: 1 worker(s) (min 1, max 8)" in launcher, launcher[:3000]
    assert (
        "add a host: copy" not in launcher and "stopping 2 worker(s) (1 here, 1 on other hosts)" in launcher
    ), launcher[-3000:]
    wait_for(lambda: not _worker_pids(hosts, 1), 30, "no worker left on node 1")


def test_a_job_on_two_ray_nodes_grows_onto_a_third_and_survives_a_killed_raylet(ray_hosts, tmp_path):
    hosts, ray_out, temp = ray_hosts
    job = HostsJob(hosts, tmp_path)
    job.start(
        [
            "--ray",
            f"{hosts.address(0)}:{RAY_PORT}",
            "--nnodes",
            "2:3",
            "--nproc-per-node",
            "1",
            "--join-timeout",
            "90",
        ],
        ["--batch", "16", "--steps", "100000", "--step-delay", "0.1", "--stop-at-version", "3"],
        timeout=30,
    )
    job.wait_log("cluster v1")
    _ray_node(hosts, 2, ray_out, temp)  # a node added while the job trains: the job grows onto it
    job.wait_log("3 worker(s)")
    wait_for(lambda: _committed_at(job, 3), 60, "a step committed by 3 workers")
    agents = [argv for argv in _argvs(hosts, 1) if b"join" in argv]
    assert agents and all(b"-" == argv[argv.index(b"--secret-file") + 1] for argv in agents), agents
    raylet = ray_nodes.raylet_pid(hosts, 1)
    assert raylet is not None
    killed = time.time()
    os.kill(raylet, signal.SIGKILL)  # the node goes away: its actor, agent and workers with it
    assert job.finish() == 0, job.log()[-4000:]
    launcher = job.log()
    assert f"host {hosts.address(1)} is lost" in launcher, launcher[-3000:]
    # the actor ended its agent when the raylet died: the tether closed, no heartbeat was waited for
    assert "tether to the controller closed" in launcher, launcher[-3000:]
    assert "[state-dump]" not in launcher and "Raylet is terminated" in launcher, launcher[
        -3000:
    ]  # one line of it
    assert "add a host: copy" not in launcher, launcher[:3000]  # nothing is handed over by hand on Ray
    resumed = job.resumed_after(killed, 2)  # 0.05-0.2 s measured here; under the 2 s liveness timeout
    assert resumed < 2.0, f"next step {resumed:.2f}s after the raylet was killed:\n{launcher[-3000:]}"
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 3, 2], result
    wait_for(
        lambda: (
            not any(
                b"taiji.launch.cli" in argv or b"elastic_train.py" in b" ".join(argv)
                for argv in _argvs(hosts, 1)
            )
        ),
        30,
        "no agent or worker left on the lost node",
    )


def test_a_gang_the_cluster_cannot_hold_yet_waits_for_a_node_then_starts_all_at_once(ray_hosts, tmp_path):
    """With one of hosts 1 and 2 without a Ray node (after the test above: host 1's), `--nnodes 3`
    needs 2 other hosts: nothing is placed (no agent anywhere), Ray is shown the demand (the
    autoscaler's view, `ray status`), and the job starts on all 3 hosts at once when a node comes."""
    hosts, ray_out, temp = ray_hosts
    missing = next(i for i in (1, 2) if ray_nodes.raylet_pid(hosts, i) is None)
    job = HostsJob(hosts, tmp_path)
    job.start(
        [
            "--ray",
            f"{hosts.address(0)}:{RAY_PORT}",
            "--nnodes",
            "3",
            "--nproc-per-node",
            "1",
            "--join-timeout",
            "120",
        ],
        ["--batch", "12", "--steps", "15"],
        timeout=30,
    )
    job.wait_log("waiting for Ray to place the job's first 2 other host(s) all at once")

    def demand_shown() -> bool:
        status = hosts.run(
            0, [str(ray_nodes.RAY), "status", "--address", f"{hosts.address(0)}:{RAY_PORT}"], timeout=60
        ).stdout
        return "from request_resources()" in status and "pending placement groups" in status

    wait_for(demand_shown, 90, "the job's demand in `ray status`")
    assert not any(b"join" in argv for i in (1, 2) for argv in _argvs(hosts, i)), (
        "part of the gang was placed"
    )
    assert job.launcher is not None and job.launcher.poll() is None, job.log()[-3000:]
    _start_node(hosts, missing, ray_out / f"ray{missing}b.log", f"{temp}/b")
    assert job.finish() == 0, job.log()[-4000:]
    assert check_invariants(tmp_path, 12)["sizes"] == [3]


def test_a_job_asking_for_what_no_ray_node_has_is_refused_naming_it(ray_hosts, tmp_path):
    hosts, _, _ = ray_hosts
    done = hosts.run(
        0,
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "run",
            "--ray",
            f"{hosts.address(0)}:{RAY_PORT}",
            "--nproc-per-node",
            "1",
            "-np",
            "1",
            "--ray-gpus-per-worker",
            "1",
            "--host",
            hosts.address(0),
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        timeout=60,
        cwd=str(tmp_path),
    )
    assert done.returncode == 2, done.stderr
    assert "no Ray node has the resources" in done.stderr and "GPU=1" in done.stderr, done.stderr
    assert f"{hosts.address(0)}: CPU=1, GPU=0" in done.stderr, done.stderr


def _actor_logs(temp: str) -> str:
    """What the job's agents (run by Ray actors, their output in the nodes' worker logs) said."""
    return "".join(p.read_text(errors="replace") for p in Path(temp).glob("**/logs/worker-*.out"))


@pytest.mark.skipif(
    shutil.which("etcd") is None, reason="no etcd server binary (apt-get install -y etcd-server)"
)
def test_the_launchers_node_lost_with_etcd_an_agent_on_another_node_takes_over(ray_hosts, tmp_path):
    """The store on etcd on the head's host (it outlives the launcher's node); the launcher on host
    1's Ray node; its first gang (`--nnodes 3`) places its agents' actors on hosts 0 and 2
    (detached, out of the placement group once it is placed: they outlive the launcher's
    process). Every process of host 1 is killed: an agent wins the election at once (its tether
    closed), drops the lost host's worker in one version and the job trains to its last step with
    exactly-once data; then the agents' actors end themselves."""
    hosts, ray_out, temp = ray_hosts
    for i in range(3):
        if ray_nodes.raylet_pid(hosts, i) is None:
            _start_node(hosts, i, ray_out / f"ray{i}c.log", f"{temp}/c")
    etcd = hosts.popen(
        0,
        etcd_command(hosts.address(0), str(tmp_path / "etcd-data")),
        stdout=open(tmp_path / "etcd.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        steps = 200
        job = HostsJob(hosts, tmp_path, job_id="jtk", store=f"etcd://{hosts.address(0)}:2379", home=1)
        job.start(
            [
                "--ray",
                f"{hosts.address(0)}:{RAY_PORT}",
                "--nnodes",
                "3",
                "--nproc-per-node",
                "1",
                "--join-timeout",
                "90",
            ],
            ["--batch", "12", "--steps", str(steps), "--step-delay", "0.05"],
            timeout=30,
        )
        job.wait_log("cluster v1: 3 worker(s)")
        wait_for(lambda: _committed_at(job, 3), 60, "a step committed by 3 workers")
        killed = time.time()
        hosts.kill(1)  # its raylet, the launcher, its worker: the node is lost
        assert job.launcher.wait(timeout=10) != 0

        def ended() -> bool:
            return not any(
                b"taiji.launch.cli" in argv or b"elastic_train.py" in b" ".join(argv)
                for i in (0, 2)
                for argv in _argvs(hosts, i)
            )

        wait_for(ended, 150, "the job to train to its end under its new controller")
        said = _actor_logs(temp)
        assert "took over job jtk" in said and f"host {hosts.address(1)} is lost" in said, said[-4000:]
        assert "its tether closed" in said, said[-4000:]  # at once, not after its beat went stale
        resumed = job.resumed_after(killed, 2)
        result = check_invariants(tmp_path, 12)
        assert result["sizes"] == [3, 2], result
        assert result["steps"] == steps, result
        print(f"next step at 2 workers {resumed:.2f}s after the launcher's node was killed")
        # nobody is left to end the agents' actors: each ended itself once its agent exited
        wait_for(
            lambda: not any(b"RayHostAgent" in b" ".join(argv) for i in (0, 2) for argv in _argvs(hosts, i)),
            30,
            "the job's actors to end",
        )
    finally:
        etcd.kill()
        etcd.wait(timeout=30)
