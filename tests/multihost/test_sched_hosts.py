"""The live scheduler across emulated hosts (`taiji sched serve --hosts` + one `taiji sched agent`
per host, network namespaces as in test_hosts.py): a job spreads over three hosts by placed
resizes, a newcomer takes a host it frees and gives it back; a killed daemon re-adopts its job
from the agents; a host that goes silent leaves the pool while its job shrinks through its own
recovery; a job whose home host is cut off is fenced there and resumes from its checkpoint on the
other hosts; a higher class's arrival suspends a job and the policy resumes it on another host.
Audited: no host ever holds more workers than its slots (rebuilt from the jobs' own
event logs), DESIGN §6's invariants on the spread job, every job ends, and nothing is left running
once the daemon and the agents stop."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from taiji_harness.testing import SCRIPTS, check_invariants, committed_steps, wait_for
from taiji_harness.netns import EmulatedHosts, unavailable

from taiji.checkpoint.storage import Storage
from taiji.sched.live import placement_timeline
from taiji.sched.rounds import oversubscribed_instants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WHY_NOT = unavailable()
PORT = 29470
TRAIN = [sys.executable, str(SCRIPTS / "elastic_train.py")]


class SchedOnHosts:
    """A daemon on host ``home`` (serving the hosts' 1 slot each) and an agent on every host."""

    def __init__(self, hosts: EmulatedHosts, out: Path, home: int = 0, serve_args: tuple[str, ...] = ()):
        self.hosts, self.out, self.state = hosts, out, out / "sched"
        self.home, self.serve_args = home, serve_args
        self.env = dict(os.environ, TAIJI_HOME=str(out / "home"), PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
        self.addresses = [hosts.address(i) for i in range(hosts.n)]
        (out / "hosts.txt").write_text("".join(f"{a} 1\n" for a in self.addresses))
        self.daemon: subprocess.Popen | None = None
        self.agents: dict[int, subprocess.Popen] = {}

    def cli(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "taiji.launch.cli", "sched", command, "--state-dir", str(self.state), *args]

    def serve(self) -> None:
        previous = self.daemon.pid if self.daemon is not None else None
        with open(self.out / "daemon.log", "a") as log:
            self.daemon = self.hosts.popen(self.home, self.cli("serve", "--hosts", str(self.out / "hosts.txt"),
                                                               "--address", f"{self.addresses[self.home]}:{PORT}",
                                                               "--policy", "drf", "--round", "0.5", "--host-timeout",
                                                               "3", *self.serve_args),
                                           stdout=log, stderr=subprocess.STDOUT, env=self.env)

        def serving() -> bool:
            assert self.daemon.poll() is None, self.log("daemon")
            try:
                return json.loads((self.state / "daemon.json").read_text())["pid"] not in (None, previous)
            except (OSError, ValueError, KeyError):
                return False
        wait_for(serving, 60, "the daemon to serve")

    def agent(self, i: int) -> None:
        with open(self.out / f"agent{i}.log", "a") as log:
            self.agents[i] = self.hosts.popen(i, self.cli("agent", "--host", self.addresses[i], "--slots", "1"),
                                              stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def all_up(self, daemons: int = 1) -> None:
        """Every host's agent polls the daemon (the ``daemons``-th one started here)."""
        wait_for(lambda: all(self.log("daemon", all_of_it=True).count(f"host {a} is up") >= daemons
                             for a in self.addresses), 30, "every host's agent to poll the daemon")

    def spread(self, name: str, steps: int) -> str:
        """A daemon and every agent up, then a job that grows onto all three hosts; its id."""
        self.serve()
        for i in range(self.hosts.n):
            self.agent(i)
        self.all_up()
        job = self.submit(name, 3, steps)
        wait_for(lambda: self.placed(job, [1, 1, 1]), 90, "the job on all three hosts")
        return job

    def sched(self, *args: str) -> str:
        done = self.hosts.run(self.home, self.cli(*args), env=self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def submit(self, name: str, max_np: int, steps: int, *options: str) -> str:
        (self.out / name).mkdir()
        return self.sched("submit", "--max-np", str(max_np), "--name", name, *options, "--", *TRAIN,
                          str(self.out / name), "--steps", str(steps), "--step-delay", "0.01").strip()

    def jobs(self) -> dict[str, dict]:
        try:
            return {j["id"]: j for j in json.loads((self.state / "state.json").read_text())["jobs"]}
        except (OSError, ValueError, KeyError):
            return {}

    def placed(self, job: str, placement: list[int]) -> bool:
        seen = self.jobs().get(job, {})
        assert seen.get("state") != "failed", seen.get("reason")
        return seen.get("state") == "running" and seen.get("placement") == placement

    def ended(self, job: str, state: str = "finished") -> bool:
        seen = self.jobs().get(job, {})
        assert seen.get("state") in (None, "queued", "running", "suspended", state), (seen.get("state"), seen.get("reason"))
        return seen.get("state") == state

    def oversubscribed(self) -> list[float]:
        timelines = {}
        for job in self.jobs():
            path = self.state / "jobs" / job / "run" / "events.jsonl"
            events = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
            timelines[job] = placement_timeline(events, self.addresses)
        return oversubscribed_instants((1,) * len(self.addresses), timelines)

    def log(self, name: str, all_of_it: bool = False) -> str:
        path = self.out / f"{name}.log"
        text = path.read_text() if path.exists() else ""
        return text if all_of_it else text[-3000:]

    def stop(self) -> None:
        """`sched stop`, then the agents; every process on every host is gone."""
        self.sched("stop")
        assert self.daemon is not None and self.daemon.wait(60) == 0, self.log("daemon")
        for agent in self.agents.values():
            agent.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            assert agent.wait(30) == 0
        for i in range(self.hosts.n):
            wait_for(lambda: not self.hosts.pids(i), 30, f"every process on host {i} to exit")


@pytest.fixture
def on_hosts(tmp_path):
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        setup = SchedOnHosts(hosts, tmp_path)
        try:
            yield setup
        finally:
            print(setup.log("daemon"), *(setup.log(f"agent{i}") for i in range(3)), sep="\n")


def test_a_job_spreads_over_hosts_makes_room_for_a_newcomer_and_takes_it_back(on_hosts):
    s = on_hosts
    spread = s.spread("spread", 750)
    short = s.submit("short", 1, 60)
    wait_for(lambda: s.ended(short), 90, "the newcomer to run on the freed host and finish")
    wait_for(lambda: s.ended(spread), 150, "the first job to finish")
    table = s.sched("status")
    assert "finished" in table and "3 host(s)" in table, table
    sizes = [n for _, n in s.jobs()[spread]["allocations"]]
    assert sizes[:3] == [1, 3, 2] and 3 in sizes[3:], sizes   # spread, shrank for the newcomer, grew back
    assert not s.oversubscribed()
    check_invariants(s.out / "spread", batch=16)
    s.stop()


def test_a_killed_daemon_readopts_and_a_silent_host_leaves_the_pool(on_hosts):
    s = on_hosts
    job = s.spread("endless", 100000)
    os.killpg(s.daemon.pid, signal.SIGKILL)
    s.daemon.wait(10)
    s.serve()   # a new daemon: the job ran on meanwhile, and its agents report it
    s.all_up(daemons=2)
    assert "re-adopted job" in s.log("daemon") and s.placed(job, [1, 1, 1])
    lost = s.addresses[2]   # (what follows is observed by the new daemon: it reads the re-adopted job)
    s.hosts.link_down(2)   # host 2's agent falls silent and the job loses its workers there
    wait_for(lambda: s.placed(job, [1, 1, 0]) and f"host {lost} is down" in s.log("daemon"), 60,
             "the job to shrink off the lost host and the daemon to count it down")
    assert f"({lost} down)" in s.sched("status")
    assert not s.oversubscribed()
    s.sched("stop")
    assert s.daemon.wait(60) == 0, s.log("daemon")
    assert s.ended(job, "cancelled")
    # (the cut-off host's join stops its workers once the job's store is out of reach:
    # test_hosts.py::test_link_down_the_host_is_dropped_and_its_workers_stop; stopping its agent stops the rest)
    for i in (0, 1, 2):
        s.agents[i].send_signal(signal.SIGTERM)
        assert s.agents[i].wait(30) == 0
        wait_for(lambda: not s.hosts.pids(i), 30, f"every process on host {i} to exit")


@pytest.mark.timeout(600)
def test_a_higher_class_takes_a_jobs_home_host_and_the_policy_moves_it_to_a_freed_one(tmp_path):
    """A move the policy chooses: two --no-preempt jobs hold two hosts and a third job the third;
    a priority-1 arrival finds no free slot and suspends the third job (the only one it may); once
    one of the others is cancelled the policy resumes the suspended job from its checkpoint on the
    host that freed — not its home, which the arrival holds — and it trains on exactly once."""
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        s = SchedOnHosts(hosts, tmp_path, serve_args=("--min-run-factor", "0"))
        try:
            s.serve()
            for i in range(3):
                s.agent(i)
            s.all_up()
            fixed = [s.submit(name, 1, 100000, "--no-preempt") for name in ("fixed0", "fixed1")]
            wait_for(lambda: all(s.jobs().get(j, {}).get("size") == 1 for j in fixed), 90, "two fixed jobs running")
            held = [s.jobs()[j]["home"] for j in fixed]
            home = ({0, 1, 2} - set(held)).pop()
            low = s.submit("low", 1, 200)
            wait_for(lambda: s.placed(low, [int(i == home) for i in range(3)]), 90, "the third job on the third host")
            wait_for(lambda: committed_steps(s.out / "low") >= 5, 90, "the third job to train")
            high = s.submit("high", 1, 40, "--priority", "1")
            wait_for(lambda: s.jobs()[low]["state"] == "suspended", 90, "the third job suspended for the arrival")
            stopped_at = s.jobs()[low]["stopped_at"]
            wait_for(lambda: s.placed(high, [int(i == home) for i in range(3)]), 90, "the arrival on its home host")
            s.sched("cancel", fixed[0])
            wait_for(lambda: s.jobs()[low]["state"] != "suspended", 120, "the third job to resume")
            assert s.jobs()[low]["home"] == held[0], (held, home, s.jobs()[low])   # moved: the freed host
            wait_for(lambda: s.ended(high) and s.ended(low), 240, "both jobs to finish")
            s.sched("cancel", fixed[1])
            assert stopped_at > 0 and len(s.jobs()[low]["suspensions"]) == 1, s.jobs()[low]
            assert not s.oversubscribed()
            check_invariants(s.out / "low", batch=16)
            s.stop()
        finally:
            print(s.log("daemon"), *(s.log(f"agent{i}") for i in range(3)), sep="\n")


def test_a_job_whose_home_host_is_cut_off_resumes_from_its_checkpoint_on_the_others(tmp_path):
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        s = SchedOnHosts(hosts, tmp_path, home=2, serve_args=("--fence", "2", "--checkpoint-grace", "10"))
        try:
            s.serve()   # on host 2: the job's launcher goes to host 0 (the policy's first host)
            for i in range(3):
                s.agent(i)
            s.all_up()
            job = s.submit("moved", 3, 120, "--checkpoint-every", "10")
            wait_for(lambda: s.placed(job, [1, 1, 1]), 90, "the job on all three hosts")
            checkpoints = Storage(str(s.state / "jobs" / job / "checkpoints"))
            wait_for(lambda: checkpoints.listing().latest is not None, 90, "its first periodic checkpoint")
            s.hosts.link_down(0)   # its home: the launcher and store are out of reach
            wait_for(lambda: "was lost" in s.log("daemon"), 90, "the job suspended off its lost home host")
            assert "no reply from the daemon" in s.log("agent0"), "host 0's agent fenced its launcher"
            wait_for(lambda: s.ended(job), 150, "the job to resume on hosts 1 and 2 and finish")
            homes = [p for _, p in s.jobs()[job]["allocations"]]
            assert 0 in homes, s.jobs()[job]["allocations"]
            check_invariants(s.out / "moved", batch=16)
        finally:
            print(s.log("daemon"), *(s.log(f"agent{i}") for i in range(3)), sep="\n")   # (leaving the hosts
            # kills everything still running in them: the daemon, the agents, the jobs)
