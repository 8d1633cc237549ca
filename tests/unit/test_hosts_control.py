"""Many hosts without processes: placement and host events in the pure controller, the secret
and signed records, the agents' store protocol, and `taiji join`'s argument checks (issue 15)."""

import argparse
import json
from dataclasses import replace

import pytest

from taiji.cluster import auth
from taiji.cluster.controller import (
    Beat,
    Bounds,
    FailureReported,
    HostBeat,
    HostJoined,
    HostLost,
    Proposal,
    Publish,
    Spawn,
    Tick,
    WorkerExited,
    WorkerReady,
    initial_state,
)
from taiji.cluster.fake_store import FakeStore
from taiji.cluster.spec import ClusterConfig, WorkerSpec
from taiji.cluster.store import JobStore
from taiji.errors import AuthError, ConfigError
from taiji.launch.arguments import parse_join
from taiji.launch.hosts import agent_channel as hosts
from taiji.launch.parser import build_parser
from taiji.launch.worker_env import WorkerSettings, worker_env
from taiji_harness.testing import actions_of, feed

HEAD, H2, H3 = "10.0.0.1", "10.0.0.2", "10.0.0.3"


run, of = feed, actions_of


def grown(slots=(2, 2), max_np=8):
    """The head with slots[0] workers, then one host per further entry, every joiner admitted."""
    s = initial_state(slots[0], Bounds(max_np=max_np, stale_after=1.0, host_timeout=5.0), HEAD, slots[0])
    for i, n in enumerate(slots[1:]):
        s, acts = run(s, HostJoined(f"10.0.0.{i + 2}", n))
        for spawn in of(acts, Spawn):
            s, _ = run(s, *[WorkerReady(w) for w in spawn.ids])
    return s


def test_a_proposal_beyond_the_slots_waits_for_a_host_and_joiners_go_where_slots_are_free():
    s = initial_state(2, Bounds(max_np=8), HEAD, 2)
    s, acts = run(s, Proposal(4))
    assert not of(acts, Spawn) and not of(acts, Publish), "no free slot: nothing to spawn yet"
    s, acts = run(s, HostJoined(H2, 3))
    [spawn] = of(acts, Spawn)
    assert [(w.id, w.host) for w in spawn.workers] == [("w2", H2), ("w3", H2)]
    s, acts = run(s, WorkerReady("w2"), WorkerReady("w3"))
    [pub] = of(acts, Publish)
    assert [w.host for w in pub.config.workers] == [HEAD, HEAD, H2, H2]


def test_a_joining_host_grows_the_job_onto_its_slots_up_to_max_np():
    s = initial_state(2, Bounds(max_np=5), HEAD, 2)
    s, acts = run(s, HostJoined(H2, 2))
    assert s.desired == 4 and [len(sp.ids) for sp in of(acts, Spawn)] == [2]
    s, acts = run(s, HostJoined(H3, 2))
    assert s.desired == 5, "clamped to max_np"
    assert [w.host for sp in of(acts, Spawn) for w in sp.workers] == [H3]


def test_a_host_registering_twice_or_with_no_slots_is_ignored():
    s = grown()
    s2, acts = run(s, HostJoined(H2, 2))
    assert s2 == s and "registered again" in acts[0].message
    s3, acts = run(s, HostJoined(H3, 0))
    assert s3 == s and "0 slots" in acts[0].message


def test_a_lost_host_takes_all_its_members_in_one_version_as_one_failure():
    s = grown((2, 2))
    assert s.config.size == 4 and s.failures == 0
    s, acts = run(s, HostLost(H2, "agent left"))
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w0", "w1") and pub.config.version == s.config.version
    # marked lost: the survivors abandon the old version's collectives at once, not at their timeout
    assert pub.config.lost == ("w2", "w3") and pub.config.dooms(("w0", "w1", "w2", "w3")) == ("w2", "w3")
    assert s.failures == 1 and all(h.address != H2 for h in s.hosts)
    # its workers' exits, if they still arrive, change nothing
    s, acts = run(s, WorkerExited("w2", -9, True), WorkerExited("w3", -9, True))
    assert not of(acts, Publish) and s.failures == 1


def test_a_silent_agent_is_lost_after_host_timeout_or_sooner_when_its_peers_report():
    s = grown((2, 2))
    s, _ = run(s, HostBeat(H2, 0.0))
    s, acts = run(s, Tick(), now=4.0)
    assert not of(acts, Publish), "within host_timeout and no report: not lost yet"
    s, acts = run(s, Tick(), now=5.5)
    assert of(acts, Publish)[0].config.ids == ("w0", "w1")
    # the fast path: peers reported failed collectives and the agent has been silent > stale_after
    s = grown((2, 2))
    s, _ = run(s, HostBeat(H2, 10.0))
    s, _ = run(s, FailureReported("w0", s.config.version), FailureReported("w1", s.config.version), now=10.5)
    s, acts = run(s, Tick(), now=11.2)
    assert of(acts, Publish)[0].config.ids == ("w0", "w1")


def test_with_replace_a_lost_host_is_refilled_where_slots_are_free():
    s = initial_state(2, Bounds(max_np=4, replace=True), HEAD, 2)
    for address in (H2, H3):
        s, acts = run(s, HostJoined(address, 1))
        s, _ = run(s, *[WorkerReady(w) for sp in of(acts, Spawn) for w in sp.ids])
    assert s.config.size == 4
    s, acts = run(s, HostLost(H3, "link down"))
    assert of(acts, Publish)[0].config.size == 3
    assert not of(acts, Spawn), "no free slot is left on the other hosts"
    s, acts = run(s, HostJoined(H3, 1))  # it comes back: the lost worker is replaced there
    assert [w.host for sp in of(acts, Spawn) for w in sp.workers] == [H3]


def test_the_launchers_own_host_cannot_be_lost():
    s = grown()
    assert run(s, HostLost(HEAD, "?")) == (s, [])


def test_members_killed_as_hung_on_a_lost_host_leave_without_waiting_for_their_exit():
    s = grown((2, 2))
    s, _ = run(s, HostBeat(H2, 0.0))
    for w in ("w0", "w1", "w2", "w3"):
        s, _ = run(s, Beat(w, 0.0))
    s, acts = run(
        s, FailureReported("w0", s.config.version), FailureReported("w1", s.config.version), now=0.5
    )
    s, acts = run(s, Tick(), now=1.5)  # the agent is silent too: the host is lost, no exit awaited
    assert of(acts, Publish)[0].config.ids == ("w0", "w1") and not s.killed


# -- the secret and signed records --------------------------------------------------------------


def test_sealed_records_open_only_with_the_same_secret_and_under_the_same_key():
    secret = auth.new_secret()
    signer = auth.Signer(secret)
    sealed = signer.seal("taiji/j/config/v2", {"version": 2})
    assert signer.open("taiji/j/config/v2", sealed) == {"version": 2}
    with pytest.raises(AuthError):
        auth.Signer(auth.new_secret()).open("taiji/j/config/v2", sealed)
    with pytest.raises(AuthError):
        signer.open("taiji/j/config/v3", sealed)  # replayed under another key
    tampered = json.loads(sealed)
    tampered["record"]["version"] = 3
    with pytest.raises(AuthError):
        signer.open("taiji/j/config/v2", json.dumps(tampered))
    with pytest.raises(AuthError):
        signer.open("taiji/j/config/v2", b'{"version": 2}')


def test_derived_keys_differ_per_use():
    secret = auth.new_secret()
    assert len({auth.derive(secret, label) for label in ("sign", "p2p", "etcd")}) == 3


def test_secret_file_is_private_and_checked_on_read(tmp_path):
    path = auth.write_secret_file(tmp_path / "jobs" / "j.secret", secret := auth.new_secret())
    assert (path.stat().st_mode & 0o777) == 0o600
    assert auth.read_secret_file(str(path)) == secret
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by other users"):
        auth.read_secret_file(str(path))
    (tmp_path / "short").write_text("abcd")
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(ConfigError, match="holds 2 bytes"):
        auth.read_secret_file(str(tmp_path / "short"))
    with pytest.raises(ConfigError, match="cannot read"):
        auth.read_secret_file(str(tmp_path / "missing"))
    import io

    assert auth.read_secret_file("-", stdin=io.StringIO(secret.hex() + "\n")) == secret


def test_a_forged_config_or_proposal_is_rejected_by_a_signed_job_store():
    kv = FakeStore()
    secret = auth.new_secret()
    job = JobStore(kv, "j", auth.Signer(secret))
    assert job.publish(ClusterConfig(1, (WorkerSpec("w0"),)))
    assert job.read_config().ids == ("w0",)
    intruder = JobStore(kv, "j", auth.Signer(auth.new_secret()))
    assert intruder.publish(ClusterConfig(2, (WorkerSpec("evil"),)))
    with pytest.raises(AuthError, match="not signed with the job's secret"):
        job.read_config()
    intruder.propose(99, "intruder")
    job.propose(3, "user")
    seq, found = job.proposals_after(0)
    assert seq == 2 and found == [{"size": 3, "source": "user"}]


def test_agent_channel_streams_commands_events_and_beats():
    job = JobStore(FakeStore(), "j", auth.Signer(auth.new_secret()))
    head, agent = hosts.AgentChannel(job, H2, "s1"), hosts.AgentChannel(job, H2, "s1")
    settings = WorkerSettings("j", HEAD, 29400, ("python", "train.py"), interpreter="python")
    hosts.publish_settings(job, settings)
    assert hosts.read_settings(job) == settings
    assert hosts.register(job, H2, 2, 123, "s1") == 1
    assert hosts.registrations_after(job, 0) == (
        1,
        [{"address": H2, "slots": 2, "pid": 123, "session": "s1"}],
    )
    head.send({"op": "spawn", "id": "w2", "rank": 2, "size": 3})
    assert agent.new_commands() == [{"op": "spawn", "id": "w2", "rank": 2, "size": 3}]
    assert agent.new_commands() == []
    bell = job.doorbell()
    head.send(
        {"op": "spawn", "id": "w3", "rank": 3, "size": 5}, {"op": "spawn", "id": "w4", "rank": 4, "size": 5}
    )
    assert [c["id"] for c in agent.new_commands()] == ["w3", "w4"]  # a host's orders in one record, in order
    assert job.doorbell() == bell  # orders are the agent's to read: the launcher's doorbell stays quiet
    agent.report({"op": "exit", "id": "w2", "code": 0, "tail": []})
    assert [e["op"] for e in head.new_events()] == ["exit"]
    assert head.liveness() == "quiet"
    agent.beat({"w2": 3})
    assert head.liveness() == "beat" and head.worker_beats == {"w2": 3}  # its workers' counts, one record
    assert head.liveness() == "quiet"  # a store without leases: the agent's beat number must move
    rejoined = hosts.AgentChannel(job, H2, "s2")  # the same address, a new agent: no replay
    assert rejoined.new_commands() == [] and rejoined.new_events() == []


def test_worker_env_carries_identity_local_rank_and_the_secret(monkeypatch):
    import sys

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    settings = WorkerSettings(
        "j", HEAD, 29400, ("/head/python", "train.py"), interpreter="/head/python", cuda_backend="gloo"
    )
    secret = auth.new_secret()
    environ = worker_env(settings, secret, "w3", 3, 4, host=H2, local_rank=1, local_size=2, host_rank=1)
    assert (
        environ["TAIJI_WORKER_ID"],
        environ["RANK"],
        environ["LOCAL_RANK"],
        environ["LOCAL_WORLD_SIZE"],
        environ["GROUP_RANK"],
        environ["TAIJI_STORE_HOST"],
    ) == ("w3", "3", "1", "2", "1", HEAD)
    assert environ["TAIJI_CUDA_BACKEND"] == "gloo"  # `taiji run --cuda-backend`, on every host
    assert bytes.fromhex(environ["TAIJI_SECRET"]) == secret
    assert settings.command_here() == (sys.executable, "train.py")
    assert WorkerSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


def _join_args(*argv):
    return build_parser().parse_args(["join", *argv])


def test_join_arguments_are_checked(tmp_path):
    path = auth.write_secret_file(tmp_path / "s", auth.new_secret())
    cfg = parse_join(
        _join_args("j1@10.0.0.1:29400", "--secret-file", str(path), "--nproc-per-node", "2", "--host", H2)
    )
    assert (cfg.job_id, cfg.store_url, cfg.slots, cfg.host) == ("j1", f"tcp://{HEAD}:29400", 2, H2)
    with pytest.raises(ConfigError, match="JOB@HOST:PORT"):
        parse_join(
            _join_args("10.0.0.1:29400", "--secret-file", str(path), "--nproc-per-node", "2", "--host", H2)
        )
    with pytest.raises(ConfigError, match="at least 1"):
        parse_join(_join_args("j@h:1", "--secret-file", str(path), "--nproc-per-node", "0", "--host", H2))
    with pytest.raises(
        ConfigError, match="needs --secret-file"
    ):  # (or --slurm JOB: tests/unit/test_slurm_allocation.py)
        parse_join(_join_args("j@h:1", "--nproc-per-node", "1", "--host", H2))
    assert isinstance(
        _join_args("j@h:1", "--secret-file", "-", "--nproc-per-node", "1", "--host", H2), argparse.Namespace
    )


# -- taking over a running job's controller (etcd mode) -----------------------------------------


def test_exactly_one_agent_wins_the_election_and_terms_increase():
    import threading

    job = JobStore(FakeStore(), "j", auth.Signer(auth.new_secret()))
    wins, barrier = [], threading.Barrier(6)

    def contend(i):
        barrier.wait()
        wins.append(hosts.elect(job, f"10.0.0.{i}", b""))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(wins) == 1
    first = hosts.owner(job)
    assert first.startswith(b"1:")
    assert not hosts.elect(job, H3, b""), "it judged the launcher's controller, which was replaced since"
    assert hosts.elect(job, H3, first) and hosts.owner(job) == f"2:{H3}".encode()


def test_adopted_state_drops_the_dead_controllers_host_in_one_version():
    from taiji.cluster.controller import Host, adopted_state

    config = ClusterConfig(
        2, (WorkerSpec("w0", HEAD), WorkerSpec("w1", HEAD), WorkerSpec("w2", H2), WorkerSpec("w3", H2))
    )
    s = adopted_state(config, Bounds(max_np=4), (Host(H2, 2), Host(HEAD, 2)), 1003, now=10.0)
    assert s.desired == 4 and set(s.beats) == {"w0", "w1", "w2", "w3"} and set(s.host_beats) == {HEAD}
    s, acts = run(s, HostLost(HEAD, "controller gone"), now=10.1)
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w2", "w3") and pub.config.version == 3
    s, acts = run(s, Proposal(4), now=10.2)
    assert not of(acts, Spawn), "the dead host's slots left the pool; host 1's are full"
    s, acts = run(s, HostJoined(H3, 2), now=10.3)
    assert [sp.ids for sp in of(acts, Spawn)] == [("w1003", "w1004")], "new ids past the old controller's"


def test_bounds_and_controller_records_round_trip():
    job = JobStore(FakeStore(), "j", auth.Signer(auth.new_secret()))
    bounds = Bounds(min_np=2, max_np=7, replace=True, host_timeout=3.5)
    hosts.publish_bounds(job, bounds)
    assert hosts.read_bounds(job) == bounds
    hosts.publish_controller(job, HEAD, 42, 2, survivable=True, tether=f"{HEAD}:4000")
    assert hosts.read_controller(job) == {
        "host": HEAD,
        "pid": 42,
        "slots": 2,
        "survivable": True,
        "tether": f"{HEAD}:4000",
    }
    hosts.beat_controller(job, 5)
    assert hosts.controller_beat(job) == 5


def test_below_min_np_with_no_free_slot_the_job_stops_after_the_join_timeout():
    s = initial_state(2, Bounds(min_np=4, max_np=4, join_timeout=10), HEAD, 2)
    s, acts = run(s, HostJoined(H2, 2))
    s, _ = run(s, *[WorkerReady(w) for sp in of(acts, Spawn) for w in sp.ids])
    assert s.config.size == 4
    s, acts = run(s, HostLost(H2, "gone"), now=1.0)
    assert not of(acts, Spawn) and not of(acts, Publish) and s.removed_pending == ("w2", "w3")
    s, acts = run(s, Tick(), now=5.0)
    assert not s.finished
    s, acts = run(s, Tick(), now=11.5)
    assert s.finished and "no free slot" in acts[-1].reason


def test_nnodes_places_the_first_workers_across_the_hosts_that_joined_and_refuses_beyond_max():
    from taiji.cluster.controller import Host, RefuseHost

    bounds = Bounds(max_np=6, max_hosts=2, host_timeout=5.0)
    s = initial_state(4, bounds, HEAD, 2, others=(Host(H2, 2),), now=100.0)
    assert [(w.id, w.host) for w in s.config.workers] == [("w0", HEAD), ("w1", HEAD), ("w2", H2), ("w3", H2)]
    assert s.host_beats == {H2: 100.0} and s.next_index == 4
    s2, acts = run(s, HostJoined(H3, 2))
    assert (
        s2 == s and of(acts, RefuseHost) == [RefuseHost(H3, acts[0].reason)] and "--nnodes" in acts[0].reason
    )
    with pytest.raises(ValueError, match="do not fit the 4 slots of 2 host"):
        initial_state(5, bounds, HEAD, 2, others=(Host(H2, 2),))


def _run_args(*argv):
    from taiji.launch.arguments import parse_run

    return parse_run(build_parser().parse_args(["run", *argv, "python", "-c", "pass"]))


def test_nnodes_sets_the_start_size_the_hosts_and_max_np():
    cfg = _run_args("--nnodes", "2:3", "--nproc-per-node", "2")
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts, cfg.max_hosts) == (4, 6, 2, 3)
    cfg = _run_args("--nnodes", "2", "--nproc-per-node", "2", "-np", "3", "--max-np", "3")
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts, cfg.max_hosts) == (3, 3, 2, 2)
    assert _run_args("-np", "2").max_hosts == 0  # no --nnodes: no host limit
    for argv, message in (
        (["--nnodes", "2:3"], "needs --nproc-per-node"),
        (["--nnodes", "3:2", "--nproc-per-node", "2"], "MIN <= MAX"),
        (["--nnodes", "a:b", "--nproc-per-node", "2"], "MIN:MAX"),
        (["--nnodes", "1:2", "--nproc-per-node", "2", "-np", "3"], "must fit"),
        ([], "how many workers"),
    ):
        with pytest.raises(ConfigError, match=message):
            _run_args(*argv)


# -- tethers: each end sees the other's process die as its connection closing ----------------


def test_tether_hello_is_checked_and_a_dead_agent_or_controller_is_seen_at_once():
    import subprocess
    import sys

    from taiji.launch.hosts.tether import Tether, TetherServer, answers
    from taiji_harness.testing import wait_for

    secret = auth.new_secret()
    server = TetherServer("127.0.0.1", secret)
    script = (
        "import sys; from taiji.launch.hosts.tether import Tether; "
        f"t = Tether({server.address!r}, bytes.fromhex({secret.hex()!r}), {H2!r}, 's1'); "
        "print('tethered', flush=True); sys.stdin.read()"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout.readline().strip() == "tethered"
        with pytest.raises(AuthError, match="refused this agent's tether"):
            Tether(server.address, auth.new_secret(), H3, "s2")  # not the job's secret
        assert answers(server.address)
        leaving = Tether(server.address, secret, H3, "s3")
        leaving.close()  # on purpose (it says bye): not a death
        agent.kill()  # its kernel closes the socket, no bye
        agent.wait(timeout=30)
        lost = []
        wait_for(lambda: bool(lost.extend(server.lost()) or lost), 5, "the killed agent's tether to close")
        assert lost == [(H2, "s1")]
        again = Tether(server.address, secret, H2, "s4")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
        server.close()
    assert again.broken.wait(5), "the agent did not see the controller's end close"
    assert not leaving.broken.is_set()  # closed by its own side: not a controller's death
    assert not answers(server.address)  # nothing listens there now: refused at once
    assert server.lost() == []
    again.close()


def test_a_dropped_tether_reads_as_the_agents_death_and_a_closed_one_does_not():
    from taiji.launch.hosts.tether import Tether, TetherServer
    from taiji_harness.testing import wait_for

    secret = auth.new_secret()
    server = TetherServer("127.0.0.1", secret)
    try:
        leaving, dying = Tether(server.address, secret, H2, "s1"), Tether(server.address, secret, H3, "s2")
        leaving.close()
        dying.drop()  # as the simulated hosts of benchmarks/control_scale.py --live die
        lost: list = []
        wait_for(lambda: bool(lost.extend(server.lost()) or lost), 5, "the dropped tether to be seen")
        assert lost == [(H3, "s2")]
        assert not dying.broken.is_set()  # closed by its own side: not the controller's death
    finally:
        server.close()


def test_a_placed_proposal_chooses_which_hosts_shrink_and_where_joiners_go():
    from taiji.cluster.controller import Log

    s = grown((2, 2, 2), max_np=6)  # w0 w1 on the head, w2 w3 on H2, w4 w5 on H3
    assert [w.host for w in s.config.workers] == [HEAD, HEAD, H2, H2, H3, H3]
    s, acts = run(s, Proposal(3, "sched", ((HEAD, 1), (H3, 2))))
    config = of(acts, Publish)[0].config
    assert [(w.id, w.host) for w in config.workers] == [("w0", HEAD), ("w4", H3), ("w5", H3)], (
        "the hosts holding more than wanted lose their newest members (not the newest overall)"
    )
    s, acts = run(s, Proposal(5, "sched", ((HEAD, 1), (H2, 2), (H3, 2))))
    assert [w.host for spawn in of(acts, Spawn) for w in spawn.workers] == [H2, H2]
    booting = s
    for refused, why in [
        (Proposal(4, "sched", ((HEAD, 1), (H3, 2))), "add up to 3, not 4"),
        (Proposal(3, "sched", (("10.9.9.9", 1), (H3, 2))), "not one of this job's hosts"),
        (Proposal(4, "sched", ((HEAD, 2), (H3, 2))), "still joining"),
    ]:
        after, acts = run(booting, refused)
        assert after == booting and not of(acts, Spawn) and not of(acts, Publish)
        assert "refused" in of(acts, Log)[0].message and why in of(acts, Log)[0].message
    s, _ = run(s, *[WorkerReady(j.id) for j in s.joiners])
    assert [w.host for w in s.config.workers] == [HEAD, H3, H3, H2, H2]
    for refused, why in [
        (Proposal(5, "sched", ((HEAD, 2), (H2, 1), (H3, 2))), "moves workers between hosts"),
        (Proposal(4, "sched", ((HEAD, 3), (H3, 1))), "has 2 slot(s), not 3"),
        (Proposal(2, "sched", ((HEAD, 1), (HEAD, 1))), "names a host twice"),
    ]:
        after, acts = run(s, refused)
        assert after == s and why in of(acts, Log)[0].message, of(acts, Log)


def test_a_placement_ends_when_membership_changes_on_its_own():
    s = grown((2, 2, 2), max_np=8)
    s, acts = run(s, Proposal(3, "sched", ((HEAD, 1), (H3, 2))))
    assert s.placement
    s, acts = run(s, HostJoined("10.0.0.9", 2))  # a new host: the job grows onto it as without a placement
    assert not s.placement and [w.host for spawn in of(acts, Spawn) for w in spawn.workers]
    s = grown((2, 2), max_np=4)
    s = replace(s, bounds=replace(s.bounds, replace=True))
    s, _ = run(s, Proposal(3, "sched", ((HEAD, 2), (H2, 1))))
    s, acts = run(s, HostJoined(H3, 2), HostLost(H2, "gone"))
    assert not s.placement and H3 in [w.host for spawn in of(acts, Spawn) for w in spawn.workers], (
        "the lost host's share is refilled where slots are free"
    )
