"""The live scheduler across hosts without processes: the Scheduler's placements (a job starts on
one host and grows onto others; a host that is down leaves the pool), the daemon's view of its
agents (orders out, reports in, joins before placed resizes, lost hosts), the hosts file, the
per-host audit, and the controller rule the agents rely on (a joining host's slots are not grown
onto when ``grow_on_join`` is off). Processes: tests/multihost/test_sched_hosts.py."""

import signal
from pathlib import Path

import pytest

from taiji.cluster.controller import Bounds, HostJoined, Proposal, Spawn, initial_state
from taiji.errors import ConfigError
from taiji.launch.sched.hosts import AgentHosts, job_secret, read_hosts_file
from taiji.sched.cluster import Allocation
from taiji.sched.live import placement_timeline
from taiji.sched.livejob import Observed
from taiji.sched.rounds import Change, Rounds, oversubscribed_instants
from taiji.sched.scheduler import Scheduler, clamp, start_on_one_host
from taiji_harness.testing import actions_of, feed

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


class Placing:
    """A policy that places each job as it is told (placements on the hosts it is shown)."""

    name = "placing"

    def __init__(self):
        self.plan, self.hosts_seen = {}, []

    def allocate(self, now, cluster, jobs):
        self.hosts_seen.append(cluster.num_hosts)
        return {
            job.name: Allocation(tuple(self.plan[job.name][: cluster.num_hosts]), job.spec.batch_size)
            for job in jobs
            if job.name in self.plan
        }


def observe(sched, now, job_id, placement, version):
    sched.observe(
        now,
        job_id,
        Observed(
            size=sum(placement),
            version=version,
            step=int(now * 10),
            batch_size=64,
            position=640,
            end=64000,
            samples_per_s=500.0,
            placement=tuple(placement),
        ),
    )


def test_a_job_starts_on_one_host_then_grows_onto_others_and_a_newcomer_gets_a_freed_host():
    policy = Placing()
    sched = Scheduler(slots=2, policy=policy, hosts=3)
    a = sched.submit(0.0, ["a"], max_np=6)
    policy.plan = {a.id: (2, 2, 2)}
    assert sched.round(0.0) == [Change(a.id, (0, 0, 0), (2, 0, 0))], "starts on one host"
    sched.launched(0.0, a.id, home=0)
    observe(sched, 1.0, a.id, (2, 0, 0), 1)
    assert sched.round(2.0) == [Change(a.id, (2, 0, 0), (2, 2, 2))], "grows onto the others"
    observe(sched, 3.0, a.id, (2, 2, 2), 2)
    b = sched.submit(4.0, ["b"], min_np=2, max_np=2)
    policy.plan = {a.id: (2, 2, 0), b.id: (0, 0, 2)}
    assert sched.round(5.0) == [Change(a.id, (2, 2, 2), (2, 2, 0))], "the shrink first"
    observe(sched, 6.0, a.id, (2, 2, 0), 3)
    assert sched.tick(6.0) == [Change(b.id, (0, 0, 0), (0, 0, 2))], "then b where a left"
    assert sched.jobs[a.id].placement == [2, 2, 0]


def test_min_np_must_fit_one_host_and_the_error_says_why():
    sched = Scheduler(slots=2, policy=Placing(), hosts=3)
    with pytest.raises(ConfigError, match="per host"):
        sched.submit(0.0, ["a"], min_np=3, max_np=6)


def test_a_host_that_is_down_is_hidden_from_the_policy_and_gets_no_worker():
    policy = Placing()
    sched = Scheduler(slots=1, policy=policy, hosts=3)
    sched.host_state(1, False)
    a = sched.submit(0.0, ["a"], max_np=3)
    policy.plan = {a.id: (1, 1)}  # the policy sees two hosts: 0 and 2
    [start] = sched.round(0.0)
    assert policy.hosts_seen == [2] and start.after in ((1, 0, 0), (0, 0, 1))
    sched.launched(0.0, a.id, home=start.after.index(1))
    observe(sched, 1.0, a.id, start.after, 1)
    assert sched.round(2.0) == [Change(a.id, start.after, (1, 0, 1))]
    assert sched.rounds.slots == (1, 0, 1)
    sched.host_state(1, True)
    assert sched.rounds.slots == (1, 1, 1)


def test_clamping_keeps_a_running_job_within_its_bounds_where_it_runs():
    assert clamp([0, 0, 0], 2, 4, (0, 1, 1), home=1, slots=(1, 1, 1)) == (0, 1, 1), (
        "each host up to its slots"
    )
    assert clamp([0, 0, 0], 2, 4, (0, 1, 1), home=1, slots=(2, 2, 2)) == (0, 2, 0), "its home first"
    assert clamp([3, 3, 0], 1, 4, (0, 0, 0), home=0, slots=(4, 4, 4)) == (2, 2, 0)
    assert start_on_one_host([1, 3, 2], max_np=8, slots_per_host=2) == (0, 2, 0)


def test_the_hosts_file_lists_identical_hosts(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(f"# the cluster\n{A} 4\n\n{B} 4  # second\n")
    assert read_hosts_file(str(path)) == [(A, 4), (B, 4)]
    for text, why in (
        (f"{A} 4\n{B} 2\n", "same count"),
        (f"{A} 4\n{A} 4\n", "twice"),
        (f"{A}\n", "ADDRESS SLOTS"),
        ("# nothing\n", "no host"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=why):
            read_hosts_file(str(path))


def poll(hosts, now, address, slots=1, processes=None, launchers=None, boot="b1"):
    return hosts.on_poll(
        now,
        {
            "host": address,
            "slots": slots,
            "boot": boot,
            "processes": processes or {},
            "launchers": launchers or {},
        },
    )


def test_agents_get_launch_join_and_resize_orders_joins_before_the_placed_resize():
    hosts = AgentHosts([(A, 1), (B, 1), (C, 1)], host_timeout=3.0)
    assert hosts.poll_hosts(0.0) == [(0, False), (1, False), (2, False)], "down until their agents poll"
    for address in (A, B, C):
        assert poll(hosts, 0.5, address) == {"ok": True, "orders": [], "fence_s": 30.0}
    assert hosts.poll_hosts(1.0) == [(0, True), (1, True), (2, True)]
    hosts.launch("s1", 0, ["-np", "1", "--", "python", "t.py"], "/w", Path("/w/l.log"))
    [launch] = poll(hosts, 1.1, A)["orders"]
    assert launch["op"] == "launch" and launch["args"][:3] == ["--nproc-per-node", "1", "--no-grow-on-join"]
    assert hosts.running("s1"), "ordered, not reported yet: still starting"
    status = {"workers": ["w0"], "hosts": [[A, 1, 1]], "joiners": []}
    running = {"s1/launcher": None}
    poll(hosts, 1.5, A, processes=running, launchers={"s1": {"status": status, "store": f"{A}:999"}})
    assert hosts.status("s1") == status and hosts.outcome("s1") is None
    hosts.resize("s1", 3, (1, 1, 1))
    assert poll(hosts, 1.6, A, processes=running)["orders"] == [], "no resize before B and C joined"
    for address in (B, C):
        [join] = poll(hosts, 1.7, address)["orders"]
        assert join == {"op": "join", "job": "s1", "store": f"{A}:999"}
    hosts.poll_hosts(1.8)
    assert all(not poll(hosts, 1.9, address)["orders"] for address in (B, C)), "each host told to join once"
    joined = {**status, "hosts": [[A, 1, 1], [B, 1, 0], [C, 1, 0]]}
    poll(hosts, 2.0, A, processes=running, launchers={"s1": {"status": joined, "store": f"{A}:999"}})
    hosts.poll_hosts(2.1)
    [resize] = poll(
        hosts, 2.2, A, processes=running, launchers={"s1": {"status": joined, "store": f"{A}:999"}}
    )["orders"]
    assert resize["op"] == "control" and resize["request"]["placement"] == {A: 1, B: 1, C: 1}
    hosts.signal("s1", signal.SIGTERM)
    assert poll(hosts, 2.3, A, processes=running)["orders"] == [
        {"op": "signal", "job": "s1", "sig": signal.SIGTERM}
    ]
    poll(hosts, 2.4, A, processes={"s1/launcher": 0})
    assert hosts.outcome("s1") == 0
    hosts.forget("s1")
    orders = poll(hosts, 2.5, B, processes={"s1/join": None})["orders"]
    assert [o["op"] for o in orders] == ["signal", "forget"], "its joins are stopped"


def test_what_runs_for_no_job_of_the_daemon_is_stopped_and_a_stray_launcher_keeps_its_host_down():
    hosts = AgentHosts([(A, 1), (B, 1)], host_timeout=3.0)
    hosts.launch("s1", 1, ["-np", "1"], "", Path("/w/l.log"))
    hosts.signal("s1", signal.SIGTERM)
    hosts.forget("s1")  # it failed (say, while B was cut off): what was still queued for it is dropped
    assert [o["op"] for o in hosts.agents[B].orders] == ["signal", "forget"]
    stray = {"s1/launcher": None, "s9/join": None}
    orders = poll(hosts, 1.0, B, processes=stray)["orders"]
    assert sorted((o["job"], o["sig"]) for o in orders if o["op"] == "signal") == [
        ("s1", signal.SIGTERM),
        ("s1", signal.SIGTERM),
        ("s9", signal.SIGTERM),
    ]
    poll(hosts, 1.0, A)
    assert (1, True) not in hosts.poll_hosts(1.5), "a host holding a stray launcher stays down"
    assert poll(hosts, 2.0, B, processes=stray)["orders"] == [], "told once"
    assert {o["sig"] for o in poll(hosts, 20.0, B, processes=stray)["orders"]} == {signal.SIGKILL}
    poll(hosts, 21.0, B, processes={"s1/launcher": -9})
    assert (1, True) in hosts.poll_hosts(21.5)


def test_a_silent_home_host_loses_its_job_and_unknown_or_misconfigured_agents_are_refused():
    hosts = AgentHosts([(A, 1), (B, 1)], host_timeout=3.0)
    assert poll(hosts, 0.0, "10.9.9.9")["refused"] and poll(hosts, 0.0, A, slots=2)["refused"]
    hosts.adopt("s1", 0)
    poll(hosts, 0.0, A, processes={"s1/launcher": None})
    hosts.poll_hosts(1.0)
    assert hosts.running("s1") and hosts.outcome("s1") is None
    assert (0, False) in hosts.poll_hosts(10.0)
    assert hosts.outcome("s1") == 128 + signal.SIGKILL and hosts.status("s1") is None


def test_job_secrets_are_derived_per_job():
    assert job_secret(b"k" * 32, "s1") == job_secret(b"k" * 32, "s1") != job_secret(b"k" * 32, "s2")
    assert len(job_secret(b"k" * 32, "s1")) == 32


def test_the_per_host_audit_from_the_jobs_event_logs():
    addresses = [A, B]
    first = placement_timeline(
        [
            {"kind": "start", "time": 0.0, "size": 1, "hosts": {A: 1}},
            {"kind": "resize", "time": 5.0, "size": 2, "hosts": {A: 1, B: 1}},
            {"kind": "resize", "time": 9.0, "size": 1, "hosts": {A: 1}},
            {"kind": "end", "time": 20.0},
        ],
        addresses,
    )
    assert first == [(0.0, (1, 0)), (5.0, (1, 1)), (9.0, (1, 0)), (20.0, (0, 0))]
    fits = placement_timeline([{"kind": "start", "time": 10.0, "size": 1, "hosts": {B: 1}}], addresses)
    early = placement_timeline([{"kind": "start", "time": 8.0, "size": 1, "hosts": {B: 1}}], addresses)
    assert oversubscribed_instants((1, 1), {"a": first, "b": fits}) == []
    assert oversubscribed_instants((1, 1), {"a": first, "b": early}) == [8.0]


def test_a_joining_host_is_not_grown_onto_when_a_scheduler_places_the_workers():
    s = initial_state(1, Bounds(max_np=4, grow_on_join=False), A, 1)
    s, acts = feed(s, HostJoined(B, 2))
    assert s.desired == 1 and not actions_of(acts, Spawn)
    s, acts = feed(s, Proposal(3, "taiji sched", ((A, 1), (B, 2))))
    assert [w.host for sp in actions_of(acts, Spawn) for w in sp.workers] == [B, B]


def test_a_shrink_on_the_way_to_other_hosts_never_asks_for_fewer_workers_than_min_np():
    changes = Rounds(slots=(2, 2, 2)).start(0.0, {"a": (2, 2, 0)}, {"a": (0, 0, 2)}, minimum={"a": 2})
    assert changes == [Change("a", (2, 2, 0), (2, 0, 0))], "the move keeps 2 workers until its grow lands"
    changes = Rounds(slots=(2, 2, 2)).start(0.0, {"a": (2, 1, 0)}, {"a": (0, 1, 2)}, minimum={"a": 3})
    assert all(sum(c.after) >= 3 for c in changes), changes
