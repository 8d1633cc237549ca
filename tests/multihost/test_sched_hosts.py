"""The live scheduler across emulated hosts (`taiji sched serve --hosts` + one `taiji sched agent`
per host, network namespaces as in test_hosts.py): a job spreads over three hosts by placed
resizes, a newcomer takes a host it frees and gives it back; a killed daemon re-adopts its job
from the agents; a host that goes silent leaves the pool while its job shrinks through its own
recovery; a job whose home host is cut off is fenced there and resumes from its checkpoint on the
other hosts; a higher class's arrival suspends a job and the policy resumes it on another host.
Audited: no host ever holds more workers than its slots (rebuilt from the jobs' own
event logs), the invariants (docs/design.md#invariants) on the spread job, every job ends, and nothing is left
running once the daemon and the agents stop."""

from __future__ import annotations

import os
import signal

import pytest

from taiji.checkpoint.storage import Storage
from taiji_harness.netns import EmulatedHosts, unavailable
from taiji_harness.sched_hosts import SchedOnHosts
from taiji_harness.testing import check_invariants, committed_steps, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WHY_NOT = unavailable()


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
    assert sizes[:3] == [1, 3, 2] and 3 in sizes[3:], sizes  # spread, shrank for the newcomer, grew back
    assert not s.oversubscribed()
    check_invariants(s.out / "spread", batch=16)
    s.stop()


def test_a_killed_daemon_readopts_and_a_silent_host_leaves_the_pool(on_hosts):
    s = on_hosts
    job = s.spread("endless", 100000)
    os.killpg(s.daemon.pid, signal.SIGKILL)
    s.daemon.wait(10)
    s.serve()  # a new daemon: the job ran on meanwhile, and its agents report it
    s.all_up(daemons=2)
    assert "re-adopted job" in s.log("daemon") and s.placed(job, [1, 1, 1])
    lost = s.addresses[2]  # (what follows is observed by the new daemon: it reads the re-adopted job)
    s.hosts.link_down(2)  # host 2's agent falls silent and the job loses its workers there
    wait_for(
        lambda: s.placed(job, [1, 1, 0]) and f"host {lost} is down" in s.log("daemon"),
        60,
        "the job to shrink off the lost host and the daemon to count it down",
    )
    assert f"({lost} down)" in s.sched("status")
    assert not s.oversubscribed()
    s.sched("stop")
    assert s.daemon.wait(60) == 0, s.log("daemon")
    assert s.ended(job, "cancelled")
    # (the cut-off host's join stops its workers once the job's store is out of reach:
    # test_hosts.py::test_link_down_the_host_is_dropped_and_its_workers_stop;
    # stopping its agent stops the rest)
    for i in (0, 1, 2):
        s.agents[i].send_signal(signal.SIGTERM)
        assert s.agents[i].wait(30) == 0
        wait_for(lambda i=i: not s.hosts.pids(i), 30, f"every process on host {i} to exit")


@pytest.mark.timeout(600)
def test_a_higher_class_takes_a_jobs_home_host_and_the_policy_moves_it_to_a_freed_one(tmp_path):
    """A move the policy chooses: two --no-preempt jobs hold two hosts and a third job the third;
    a priority-1 arrival finds no free slot and suspends the third job (the only one it may); once
    one of the others is cancelled the policy resumes the suspended job from its checkpoint on the
    host that freed — not its home, which the arrival holds — and it trains on exactly once."""
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        s = SchedOnHosts(hosts, tmp_path, serve_args=("--min-run-factor", "0", "--min-left-factor", "0"))
        try:
            s.serve()
            for i in range(3):
                s.agent(i)
            s.all_up()
            fixed = [s.submit(name, 1, 100000, "--no-preempt") for name in ("fixed0", "fixed1")]
            wait_for(
                lambda: all(s.jobs().get(j, {}).get("size") == 1 for j in fixed), 90, "two fixed jobs running"
            )
            held = [s.jobs()[j]["home"] for j in fixed]
            home = ({0, 1, 2} - set(held)).pop()
            low = s.submit("low", 1, 200)
            wait_for(
                lambda: s.placed(low, [int(i == home) for i in range(3)]),
                90,
                "the third job on the third host",
            )
            wait_for(lambda: committed_steps(s.out / "low") >= 5, 90, "the third job to train")
            high = s.submit("high", 1, 40, "--priority", "1")
            wait_for(
                lambda: s.jobs()[low]["state"] == "suspended", 90, "the third job suspended for the arrival"
            )
            stopped_at = s.jobs()[low]["stopped_at"]
            wait_for(
                lambda: s.placed(high, [int(i == home) for i in range(3)]), 90, "the arrival on its home host"
            )
            s.sched("cancel", fixed[0])
            wait_for(lambda: s.jobs()[low]["state"] != "suspended", 120, "the third job to resume")
            assert s.jobs()[low]["home"] == held[0], (held, home, s.jobs()[low])  # moved: the freed host
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
            s.serve()  # on host 2: the job's launcher goes to host 0 (the policy's first host)
            for i in range(3):
                s.agent(i)
            s.all_up()
            job = s.submit("moved", 3, 120, "--checkpoint-every", "10")
            wait_for(lambda: s.placed(job, [1, 1, 1]), 90, "the job on all three hosts")
            checkpoints = Storage(str(s.state / "jobs" / job / "checkpoints"))
            wait_for(lambda: checkpoints.listing().latest is not None, 90, "its first periodic checkpoint")
            s.hosts.link_down(0)  # its home: the launcher and store are out of reach
            wait_for(lambda: "was lost" in s.log("daemon"), 90, "the job suspended off its lost home host")
            assert "no reply from the daemon" in s.log("agent0"), "host 0's agent fenced its launcher"
            wait_for(lambda: s.ended(job), 150, "the job to resume on hosts 1 and 2 and finish")
            homes = [p for _, p in s.jobs()[job]["allocations"]]
            assert 0 in homes, s.jobs()[job]["allocations"]
            check_invariants(s.out / "moved", batch=16)
        finally:
            print(s.log("daemon"), *(s.log(f"agent{i}") for i in range(3)), sep="\n")  # (leaving the hosts
            # kills everything still running in them: the daemon, the agents, the jobs)
