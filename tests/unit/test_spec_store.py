"""Cluster membership transitions and the versioned store (pure / in-process)."""

import os
import shutil
import threading
import time
import uuid

import pytest

from taiji.cluster import auth, spec
from taiji.cluster.fake_store import FakeStore
from taiji.cluster.store import JobStore, connect_store, host_store
from taiji.errors import AuthError, ConfigError, StoreError


def workers(*ids):
    return [spec.WorkerSpec(i) for i in ids]


def test_grow_appends_and_bumps_version():
    c1 = spec.initial(workers("a", "b"))
    c2 = spec.grow(c1, workers("c"))
    assert c2.version == 2 and c2.ids == ("a", "b", "c")
    assert c2.rank_of("a") == 0 and c2.rank_of("c") == 2 and c2.rank_of("zz") is None


def test_shrink_drops_newest_and_remove_keeps_order():
    c = spec.initial(workers("a", "b", "c", "d"))
    assert spec.shrink(c, 2).ids == ("a", "b")
    assert spec.remove(c, ["b"]).ids == ("a", "c", "d")
    assert spec.remove(c, ["a", "c"]).ids == ("b", "d")


@pytest.mark.parametrize(
    "bad",
    [
        lambda c: spec.shrink(c, 0),
        lambda c: spec.shrink(c, 3),
        lambda c: spec.remove(c, ["zz"]),
        lambda c: spec.remove(c, ["a", "b", "c"]),
        lambda c: spec.grow(c, []),
        lambda c: spec.grow(c, workers("a")),
    ],
)
def test_invalid_transitions_raise(bad):
    with pytest.raises(ConfigError):
        bad(spec.initial(workers("a", "b", "c")))


def test_config_json_round_trip():
    c = spec.grow(spec.initial([spec.WorkerSpec("a", "10.0.0.1")]), workers("b"))
    assert spec.ClusterConfig.from_json(c.to_json()) == c
    assert "lost" not in c.to_json()  # a config without lost members reads as before
    lost = spec.remove(spec.grow(c, workers("c", "d")), ["d", "b"], lost=True)
    assert lost.lost == ("b", "d") and spec.ClusterConfig.from_json(lost.to_json()) == lost


def test_a_config_dooms_only_the_members_it_dropped_as_lost():
    c = spec.initial(workers("a", "b", "c"))
    assert spec.remove(c, ["c"]).dooms(c.ids) == ()  # left by plan (it finishes the step)
    failed = spec.remove(c, ["c"], lost=True)
    assert failed.dooms(c.ids) == ("c",) and failed.dooms(("a", "b")) == ()


def _etcd_on_loopback():
    """An etcd server on loopback, stopped after use (skipped without the binary or client)."""
    if shutil.which("etcd") is None:
        pytest.skip("no etcd server binary (apt-get install -y etcd-server)")
    pytest.importorskip("etcd3gw")
    from taiji.launch.etcd_server import EtcdServer

    server = EtcdServer("127.0.0.1").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd_server():
    """One etcd server for this module's tests that share it."""
    yield from _etcd_on_loopback()


@pytest.fixture
def own_etcd_server():
    """An etcd server of this test's own (for a test that turns authentication on)."""
    yield from _etcd_on_loopback()


@pytest.fixture(params=["fake", "tcp", "etcd"])
def kv(request):
    if request.param == "fake":
        return FakeStore()
    if request.param == "tcp":
        return host_store()
    from taiji.cluster.store import open_store

    server = request.getfixturevalue("etcd_server")
    store = open_store(server.url, timeout=5)
    store.kv.set(f"taiji/{request.node.name}/x", "1")  # each test uses its own job prefix anyway
    return store


def test_key_value_semantics_match_tcpstore(kv):
    """compare_set, add and timed-out waits behave alike on every backend."""
    import datetime

    import torch.distributed as dist

    p = f"sem{uuid.uuid4().hex[:6]}/"
    assert kv.compare_set(p + "k", "", "a") == b"a"
    assert kv.compare_set(p + "k", "", "b") == b"a"
    assert kv.compare_set(p + "k", "a", "c") == b"c"
    assert kv.compare_set(p + "absent", "x", "y") == b"x"
    assert kv.add(p + "n", 2) == 2 and kv.add(p + "n", 3) == 5 and kv.add(p + "n", 0) == 5
    assert kv.check([p + "k"]) and not kv.check([p + "k", p + "nope"])
    kv.set(p + "v", b"\x00\xffbytes")
    assert kv.get(p + "v") == b"\x00\xffbytes"
    with pytest.raises((StoreError, dist.DistStoreError)):  # fake and etcd; TCPStore
        kv.wait([p + "never"], datetime.timedelta(seconds=0.2))


def _allreduce_in_groups(stores, prefix: str) -> list:
    """One thread per rank builds a gloo group on its own store (``stores[r]()``: a Python store,
    kept alive while its group lives) and allreduces rank + 1; each rank's result (None: failed)."""
    import datetime

    import torch
    import torch.distributed as dist

    from taiji.comm.addresses import gloo_device

    results = [None] * len(stores)

    def rank(r):
        mine = stores[r]()
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=20)
        opts._devices = [gloo_device("127.0.0.1")]
        group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, mine), r, len(stores), opts)
        t = torch.full((4,), float(r + 1))
        group.allreduce([t]).wait()
        results[r] = t

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_etcd_store_serves_gloo_rendezvous(etcd_server):
    """Process groups of two ranks (threads) rendezvous through the etcd-backed c10d store."""
    import torch

    from taiji.cluster.store import open_store

    results = _allreduce_in_groups([lambda: open_store(etcd_server.url, timeout=10)] * 2, f"pg{os.getpid()}")
    assert all(r is not None and torch.equal(r, torch.full((4,), 3.0)) for r in results)


def test_etcd_rendezvous_store_reads_a_group_at_once_and_waits_by_watch(etcd_server):
    """gloo's rendezvous on etcd (cluster/rendezvous.py): a rank's write and the read of its
    group's keys are one round trip, missing keys are waited for by a watch — never by polling
    reads; three ranks build a working group; a key nobody writes times out."""
    import collections
    import datetime

    import torch

    from taiji.cluster.etcd import EtcdKV
    from taiji.cluster.rendezvous import EtcdRendezvousStore, RendezvousAbandoned

    calls: collections.Counter = collections.Counter()

    class Counted(EtcdKV):
        def read_prefix(self, prefix, put=None):
            calls["read_prefix"] += 1
            return super().read_prefix(prefix, put)

        def puts_under(self, prefix, quiet_s):
            calls["watch"] += 1
            return super().puts_under(prefix, quiet_s)

        def wait(self, keys, timeout=None):
            calls["poll"] += 1
            return super().wait(keys, timeout)

    prefix = f"taiji/r{uuid.uuid4().hex[:6]}/pg/v1/grad"
    results = _allreduce_in_groups(
        [lambda: EtcdRendezvousStore(Counted(etcd_server.url, 10), timeout=20)] * 3, prefix
    )
    assert all(r is not None and torch.equal(r, torch.full((4,), 6.0)) for r in results)
    assert calls["poll"] == 0 and calls["read_prefix"] <= 3 + calls["watch"], calls
    lone = EtcdRendezvousStore(EtcdKV(etcd_server.url, 10))
    with pytest.raises(StoreError, match="wait timeout"):
        lone.wait([f"{prefix}/never/0"], datetime.timedelta(seconds=0.3))
    # the version the wait is for was abandoned (a rank it waits for is lost): it ends at once
    doomed = EtcdRendezvousStore(
        EtcdKV(etcd_server.url, 10), give_up=lambda: "cluster v2 dropped lost worker(s) w0"
    )
    began = time.monotonic()
    with pytest.raises(RendezvousAbandoned, match="dropped lost worker"):
        doomed.wait([f"{prefix}/never/0"], datetime.timedelta(seconds=30))
    assert time.monotonic() - began < 10


def test_etcd_rendezvous_wait_hears_a_key_written_after_its_read_at_once(etcd_server):
    """A rendezvous wait learns of a key written while it waits from its watch at once, not at
    etcd's next catch-up of lagging watches (every 100 ms): its watch starts from now and is live
    before the prefix is read, though other keys are written meanwhile (as a job's are). One
    watch serves a group's successive waits (gloo waits for one rank's key at a time)."""
    import collections

    from taiji.cluster.etcd import EtcdKV
    from taiji.cluster.rendezvous import EtcdRendezvousStore

    read, calls = threading.Event(), collections.Counter()

    class Told(EtcdKV):  # the real client, telling when the wait has read its group
        def read_prefix(self, prefix, put=None):
            found = super().read_prefix(prefix, put)
            read.set()
            return found

        def puts_under(self, prefix, quiet_s):
            calls["watch"] += 1
            return super().puts_under(prefix, quiet_s)

    writer, store = EtcdKV(etcd_server.url, 10), EtcdRendezvousStore(Told(etcd_server.url, 10), timeout=20)
    group = f"taiji/l{uuid.uuid4().hex[:6]}/pg/v1/grad/0/"
    lags = []
    for rank in range(5):
        read.clear()
        waiter = threading.Thread(target=store.wait, args=([group + str(rank)],))
        waiter.start()
        assert rank > 0 or read.wait(10)  # (then the group's watch is kept: nothing is read again)
        writer.set(f"{group}other/{rank}", "x")  # the job's other keys move etcd's revision
        writer.set(group + str(rank), "addr")
        written = time.monotonic()
        waiter.join(20)
        lags.append(time.monotonic() - written)
    assert sum(lags) < 0.15 and calls["watch"] <= 2, (lags, calls)


def test_etcd_watch_streams_every_new_config_in_its_events_and_stops_when_told(etcd_server, monkeypatch):
    """A worker's config watcher on etcd: a watch, not a poll, whose events carry the configs (no
    read per change: only the config there when the watch began is read); no version is missed,
    even ones published while the stream is being reopened, and a stop ends it within the reopen
    period. A config that fails its check is refused, not followed."""
    import collections
    import queue

    from taiji.cluster import etcd
    from taiji.cluster.etcd import EtcdKV
    from taiji.cluster.etcd_store import EtcdC10dStore

    WATCH_REOPEN_S = 0.5
    monkeypatch.setattr(etcd, "WATCH_REOPEN_S", WATCH_REOPEN_S)  # reopened often here: seen to lose nothing
    calls: collections.Counter = collections.Counter()

    class Counted(EtcdKV):
        def _post(self, path, payload, as_user=True):
            calls[path] += 1
            return super()._post(path, payload, as_user)

    job_id, signer = f"w{uuid.uuid4().hex[:6]}", auth.Signer(auth.new_secret())
    job = JobStore(EtcdC10dStore(EtcdKV(etcd_server.url, 5)), job_id, signer)
    assert job.can_watch and not JobStore(FakeStore(), "j").can_watch
    with pytest.raises(StoreError, match="cannot be watched"):
        next(JobStore(FakeStore(), "j").follow_configs(threading.Event()))
    config = spec.initial(workers("a"))
    assert job.publish(config)
    seen: queue.Queue[spec.ClusterConfig | BaseException] = queue.Queue()
    stop = threading.Event()

    def follow() -> None:
        try:
            for c in JobStore(EtcdC10dStore(Counted(etcd_server.url, 5)), job_id, signer).follow_configs(
                stop
            ):
                seen.put(c)
        except BaseException as exc:  # noqa: BLE001 - the test's thread says what ended it
            seen.put(exc)

    watcher = threading.Thread(target=follow)
    watcher.start()
    try:
        assert seen.get(timeout=5) == config  # the config when the watch began (read: one range)
        published = []
        for _ in range(3):
            config = spec.grow(config, workers(f"x{config.version}"))
            assert job.publish(config)
            published.append(config)
        assert [seen.get(timeout=5) for _ in range(3)] == published
        assert calls["/kv/range"] == 2, (
            calls
        )  # when the watch began: `latest` and its config; none per change
        done = threading.Event()  # published while the stream sits idle past a reopen
        done.wait(WATCH_REOPEN_S * 1.5)
        late = spec.grow(config, workers("late"))
        assert job.publish(late)
        assert seen.get(timeout=5) == late
        forged = spec.grow(late, workers("forged"))  # written with another secret
        assert JobStore(job.kv, job_id, auth.Signer(auth.new_secret())).publish(forged)
        assert isinstance(seen.get(timeout=5), AuthError)
    finally:
        stop.set()
        watcher.join(WATCH_REOPEN_S * 3)
    assert not watcher.is_alive()


def test_etcd_registrations_race_for_nothing_and_are_read_once_in_order(etcd_server):
    """Agents registering at once on etcd: one transaction each (no counter to retry on), distinct
    numbers 1..N, and the launcher reads each registration once, in order, from where it was."""
    import collections

    from taiji.cluster.etcd import EtcdKV
    from taiji.cluster.etcd_store import EtcdC10dStore
    from taiji.launch.hosts import agent_channel

    calls: collections.Counter = collections.Counter()

    class Counted(EtcdKV):
        def _post(self, path, payload, as_user=True):
            calls[path] += 1
            return super()._post(path, payload, as_user)

    job_id, signer, hosts = f"g{uuid.uuid4().hex[:6]}", auth.Signer(auth.new_secret()), 16
    jobs = [JobStore(EtcdC10dStore(Counted(etcd_server.url, 10)), job_id, signer) for _ in range(hosts)]
    gate, numbers = threading.Barrier(hosts), []

    def register(i: int) -> None:
        gate.wait()
        numbers.append(agent_channel.register(jobs[i], f"10.0.0.{i}", 8, 1, f"s{i}"))

    threads = [threading.Thread(target=register, args=(i,)) for i in range(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(numbers) == list(range(1, hosts + 1)) and calls["/kv/txn"] == hosts, (numbers, calls)
    seen, found = agent_channel.registrations_after(jobs[0], 0)
    assert sorted(r["address"] for r in found) == sorted(f"10.0.0.{i}" for i in range(hosts))
    assert agent_channel.registrations_after(jobs[0], seen) == (seen, [])  # (a position: etcd's revision)
    agent_channel.register(jobs[1], "10.0.1.1", 8, 1, "late")
    forger = JobStore(jobs[3].kv, job_id, auth.Signer(auth.new_secret()))  # another secret: ignored
    forger.enrol("hosts", {"address": "10.6.6.6", "slots": 8, "pid": 1, "session": "forged"})
    later, found = agent_channel.registrations_after(jobs[0], seen)
    assert later > seen and [r["address"] for r in found] == ["10.0.1.1"]


def test_etcd_lease_keeps_an_agent_alive_until_it_stops_renewing(etcd_server):
    """On etcd as on a TCP store an agent beats while its beat number moves; a silent one is 'quiet'
    (the controller judges the silence) though its leased key is still there, and 'expired' once
    etcd deletes it; the agent then learns its host was dropped."""
    import time

    from taiji.cluster.store import open_store
    from taiji.launch.hosts import agent_channel as hosts

    job = JobStore(open_store(etcd_server.url, timeout=5), f"l{uuid.uuid4().hex[:6]}")
    assert job.has_leases and not JobStore(FakeStore(), "j").has_leases
    agent = hosts.AgentChannel(job, "10.0.0.2", "s1", lease_ttl=2)
    head = hosts.AgentChannel(job.another_connection(), "10.0.0.2", "s1", lease_ttl=2)
    assert head.liveness() == "quiet"  # no lease yet: the controller judges silence itself
    agent.beat({"w1": 1})
    renewed_until = time.monotonic() + 3.0  # longer than the TTL: renewals keep it
    count = 1
    while time.monotonic() < renewed_until:
        count += 1
        agent.beat({"w1": count})
        assert head.liveness() == "beat" and head.worker_beats == {"w1": count}  # the summary of its workers
        threading.Event().wait(0.05)
    assert job.has("from-agent/10.0.0.2/s1/alive") and head.liveness() == "quiet"  # leased, yet silent
    deadline = time.monotonic() + 8.0
    while head.liveness() != "expired" and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert head.liveness() == "expired"
    with pytest.raises(hosts.LeaseExpired, match="dropped this host"):
        agent.beat({})
    left = hosts.AgentChannel(job, "10.0.0.3", "s2", lease_ttl=2)
    left.beat({})
    left.leave()  # a clean exit ends the lease at once
    assert not job.has("from-agent/10.0.0.3/s2/alive")


def test_etcd_server_listens_only_where_it_is_told_and_stops_clean(etcd_server):
    from taiji_harness.testing import listening_addresses

    pid = etcd_server.process.pid
    mine = [a for a in listening_addresses(pid) if a.endswith(f":{etcd_server.port}")]
    assert mine == [f"127.0.0.1:{etcd_server.port}"], mine
    assert all(a.startswith("127.0.0.1:") for a in listening_addresses(pid)), listening_addresses(pid)


def test_publish_is_compare_and_set(kv):
    job = JobStore(kv, "j1")
    assert job.latest_version() == 0
    c1 = spec.initial(workers("a"))
    assert job.publish(c1)
    assert not job.publish(c1), "v1 must be written once"
    rival = spec.ClusterConfig(1, tuple(workers("x")))
    assert not job.publish(rival)
    assert job.read_config() == c1
    c2 = spec.grow(c1, workers("b"))
    assert job.publish(c2) and job.latest_version() == 2
    assert job.read_config(1) == c1 and job.read_config() == c2


def test_concurrent_publishers_agree_on_one_winner(kv):
    job = JobStore(kv, "race")
    assert job.publish(spec.initial(workers("a")))
    wins = []
    barrier = threading.Barrier(8)

    def contender(i):
        barrier.wait()
        config = spec.ClusterConfig(2, tuple(workers("a", f"j{i}")))
        wins.append((i, job.publish(config)))

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    winners = [i for i, won in wins if won]
    assert len(winners) == 1
    assert job.read_config().ids == ("a", f"j{winners[0]}")


def test_jobs_are_isolated_by_prefix(kv):
    a, b = JobStore(kv, "a"), JobStore(kv, "b")
    assert a.publish(spec.initial(workers("x")))
    assert b.latest_version() == 0


def test_dropped_fake_store_raises_store_error():
    kv = FakeStore()
    job = JobStore(kv, "j")
    kv.drop()
    with pytest.raises(StoreError):
        job.latest_version()


def test_fake_store_get_times_out():
    kv = FakeStore(timeout=0.05)
    with pytest.raises(StoreError):
        kv.get("missing")


def test_the_job_store_listens_only_on_the_address_it_is_given():
    """TCPStore alone binds every interface even for 127.0.0.1; the job store has no
    authentication, so it must not be reachable from the network."""
    from taiji_harness.testing import listening_addresses

    store = host_store("127.0.0.1", 0, timeout=5)
    mine = [a for a in listening_addresses(os.getpid()) if a.endswith(f":{store.port}")]
    assert mine == [f"127.0.0.1:{store.port}"], mine
    client = connect_store("127.0.0.1", store.port, timeout=5)
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_a_launcher_started_etcd_admits_only_the_jobs_user_on_its_own_keys(own_etcd_server):
    from taiji.cluster.etcd import EtcdKV, job_credentials

    server = own_etcd_server
    secret = auth.new_secret()
    user, password = job_credentials("j", secret)
    EtcdKV(server.url, 5).enable_auth("j", auth.derive(secret, "etcd-root").hex(), password)
    job = EtcdKV(server.url, 5, (user, password))
    job.set("taiji/j/config/latest", "1")
    assert job.get("taiji/j/config/latest") == b"1" and job.add("taiji/j/n", 2) == 2
    stream = job.changes("taiji/j/config/latest", threading.Event())
    assert next(stream) == b"1"
    job.set("taiji/j/config/latest", "2")
    assert next(stream) == b"2"  # the watch stream authenticates too
    with pytest.raises(AuthError, match="permission denied"):
        job.set("taiji/other/x", "1")
    with pytest.raises(StoreError):
        EtcdKV(server.url, 5).set("taiji/j/x", "1")  # no user: refused
    with pytest.raises(AuthError, match="wrong secret"):
        EtcdKV(server.url, 5, job_credentials("j", auth.new_secret()))


def test_a_processes_etcd_connections_share_one_login_and_renew_it_once(own_etcd_server):
    """Connections made by another() present the first one's token (authenticating costs etcd a
    bcrypt check with its write lock held); when the server forgets the token, the first
    connection to notice renews it for all, and a watch stream follows."""
    import requests

    from taiji.cluster.etcd import EtcdKV, job_credentials

    server = own_etcd_server
    secret = auth.new_secret()
    root_password = auth.derive(secret, "etcd-root").hex()
    EtcdKV(server.url, 5).enable_auth("j", root_password, job_credentials("j", secret)[1])
    first = EtcdKV(server.url, 5, job_credentials("j", secret))
    others = [first.another() for _ in range(3)]
    for i, kv in enumerate(others):
        kv.set(f"taiji/j/k{i}", str(i))
    watcher = first.another()
    stream = watcher.changes("taiji/j/k0", threading.Event())
    assert next(stream) == b"0"
    assert first.authentications == 1, "another() authenticated again"
    # the server forgets every token (auth off and on again, as root)
    base = f"http://127.0.0.1:{server.port}/v3"
    token = requests.post(
        f"{base}/auth/authenticate", json={"name": "root", "password": root_password}, timeout=5
    ).json()["token"]
    requests.post(
        f"{base}/auth/disable", json={}, headers={"Authorization": token}, timeout=5
    ).raise_for_status()
    requests.post(f"{base}/auth/enable", json={}, timeout=5).raise_for_status()
    for i, kv in enumerate(others):
        assert kv.get(f"taiji/j/k{i}") == str(i).encode()
    assert first.authentications == 2, "one renewal serves every connection"
    first.set("taiji/j/k0", "moved")
    assert next(stream) == b"moved"
    assert first.authentications == 2


def test_a_config_lists_each_host_once_and_its_workers_as_runs_of_ids():
    placed = spec.ClusterConfig(
        4, tuple(spec.WorkerSpec(f"w{i}", f"10.0.{i // 8}.1") for i in range(1024)), lost=("w2000",)
    )
    data = placed.to_dict()
    assert len(data["hosts"]) == 128 and data["runs"][:2] == [[0, "w0", 8], [1, "w8", 8]]
    assert spec.ClusterConfig.from_json(placed.to_json()) == placed
    assert len(placed.to_json()) < 4000, "1,024 workers on 128 hosts in a few KB"
    # ids that do not count up, leading zeros, other stems, hosts revisited: each its own run, order kept
    odd = spec.ClusterConfig(
        1,
        tuple(
            spec.WorkerSpec(i, h)
            for i, h in [
                ("w1", "a"),
                ("w2", "b"),
                ("x", "a"),
                ("w007", "a"),
                ("w008", "a"),
                ("w9", "a"),
                ("w10", "a"),
                ("v11", "a"),
                ("w12", "b"),
                ("w13", "a"),
            ]
        ),
    )
    assert spec.ClusterConfig.from_json(odd.to_json()) == odd
    assert [r[2] for r in odd.to_dict()["runs"]] == [1, 1, 1, 1, 1, 2, 1, 1, 1]
    # a config written one entry per worker still reads
    assert spec.ClusterConfig.from_dict(
        {"version": 2, "workers": [{"id": "w0", "host": "h"}, {"id": "w1"}]}
    ) == spec.ClusterConfig(2, (spec.WorkerSpec("w0", "h"), spec.WorkerSpec("w1")))
    # the next version, a host lost: read anew, equal to what was written; the runs it shares with the
    # last one are made once (a reader of 1,024 workers makes the runs that changed, not every worker)
    fewer = spec.ClusterConfig(placed.version + 1, tuple(w for w in placed.workers if w.host != "10.0.5.1"))
    read_before = spec.ClusterConfig.from_json(placed.to_json())
    read_now = spec.ClusterConfig.from_json(fewer.to_json())
    assert (
        read_now == fewer and read_now.size == 1016 and "10.0.5.1" not in {w.host for w in read_now.workers}
    )
    assert read_now.workers[0] is read_before.workers[0] and read_now.workers[-1] is read_before.workers[-1]
    # the same ids on another host are other workers
    moved = spec.ClusterConfig(9, tuple(spec.WorkerSpec(f"w{i}", "elsewhere") for i in range(8)))
    assert spec.ClusterConfig.from_json(moved.to_json()) == moved


def test_an_agent_on_etcd_reads_its_orders_only_once_their_watched_count_moves(etcd_server):
    from taiji.cluster.auth import Signer, new_secret
    from taiji.cluster.store import open_store
    from taiji.launch.hosts.agent_channel import AgentChannel
    from taiji_harness.testing import wait_for

    class Counted(JobStore):
        reads = 0

        def records_after(self, stream, seen):
            Counted.reads += 1
            return super().records_after(stream, seen)

    job_id, signer = f"orders{uuid.uuid4().hex[:6]}", Signer(new_secret())
    launcher = AgentChannel(
        JobStore(open_store(etcd_server.url, timeout=10), job_id, signer), "10.0.0.2", "s1"
    )
    agent = AgentChannel(Counted(open_store(etcd_server.url, timeout=10), job_id, signer), "10.0.0.2", "s1")
    try:
        for _ in range(20):
            assert agent.new_commands() == []
        assert Counted.reads == 0, "nothing was sent: no read"
        launcher.send({"op": "spawn", "id": "w1"})
        launcher.send({"op": "kill", "id": "w1"})
        got: list = []
        wait_for(
            lambda: got.extend(agent.new_commands()) or len(got) == 2, 10, "both orders to reach the agent"
        )
        assert [c["op"] for c in got] == ["spawn", "kill"]
        reads = Counted.reads
        for _ in range(20):
            assert agent.new_commands() == []
        assert Counted.reads == reads, "read again though no order came"
    finally:
        agent.leave()


def test_the_launcher_follows_every_agents_liveness_with_one_watch(etcd_server):
    """On etcd the launcher reads no agent's keys per look: one watch of ``from-agent/`` keeps each
    agent's summary, and the deletion of its leased key (the lease ran out) wakes the controller."""
    from taiji.cluster.follow import PrefixFollower
    from taiji.cluster.store import open_store
    from taiji.launch.hosts import agent_channel as hosts
    from taiji_harness.testing import wait_for

    job = JobStore(open_store(etcd_server.url, timeout=5), f"w{uuid.uuid4().hex[:6]}")
    woken = threading.Event()
    watched = PrefixFollower(job.another_connection(), hosts.FROM_AGENTS, lambda key: woken.set())
    agents = [hosts.AgentChannel(job, f"10.0.0.{i}", "s", lease_ttl=2) for i in (2, 3)]
    heads = [hosts.AgentChannel(job, f"10.0.0.{i}", "s", lease_ttl=2, watched=watched) for i in (2, 3)]
    reads = []
    job.has = lambda name: reads.append(name) or JobStore.has(job, name)  # the heads must not read
    try:
        for n, agent in enumerate(agents):
            agent.beat({f"w{n}": 5})
        beaten: set[int] = set()  # a head says "beat" once per move of its agent's number
        wait_for(
            lambda: (
                beaten.update(i for i, h in enumerate(heads) if h.liveness() == "beat") or len(beaten) == 2
            ),
            10,
            "both agents' keys through the watch",
        )
        assert [h.worker_beats for h in heads] == [{"w0": 5}, {"w1": 5}] and not reads
        agents[0].beat({"w0": 6})
        wait_for(
            lambda: heads[0].liveness() == "beat" and heads[0].worker_beats == {"w0": 6}, 10, "the new count"
        )
        assert not reads
        assert woken.wait(10.0), (
            "a lease ran out (nobody renews them): its key's deletion wakes the controller"
        )
        wait_for(lambda: [h.liveness() for h in heads] == ["expired"] * 2, 10, "both leases to run out")
        # a silent agent's summary may have been read from the store itself (CONFIRM_AFTER_S), nothing else
        assert set(reads) <= {f"from-agent/10.0.0.{i}/s/summary" for i in (2, 3)}, reads
    finally:
        watched.close()


def test_a_watch_that_shows_no_beat_is_checked_against_the_store_before_an_agent_counts_as_silent(
    etcd_server,
):
    """The launcher's watch may run behind (a loaded host): an agent whose summary it has not shown
    move for CONFIRM_AFTER_S is read from the store itself, and beats if its number moved there."""
    from taiji.cluster.follow import PrefixFollower
    from taiji.cluster.store import open_store
    from taiji.launch.hosts import agent_channel as hosts
    from taiji_harness.testing import wait_for

    job = JobStore(open_store(etcd_server.url, timeout=5), f"b{uuid.uuid4().hex[:6]}")
    behind = PrefixFollower(
        job.another_connection(), "nothing-written-here/"
    )  # shows none of the agent's keys
    agent = hosts.AgentChannel(job, "10.0.0.2", "s", lease_ttl=2)
    head = hosts.AgentChannel(job, "10.0.0.2", "s", lease_ttl=2, watched=behind)
    reads = []
    job.has = lambda name: reads.append(name) or JobStore.has(job, name)
    try:
        agent.beat({"w0": 7})
        since = time.monotonic()
        assert head.liveness() == "quiet" and not reads  # within CONFIRM_AFTER_S the watch is trusted
        wait_for(lambda: head.liveness() == "beat", 10, "the beat read from the store")
        assert time.monotonic() - since >= hosts.CONFIRM_AFTER_S * 0.9 and head.worker_beats == {"w0": 7}
        assert set(reads) == {"from-agent/10.0.0.2/s/summary"}
        assert head.liveness() == "quiet"  # the number has not moved since
        agent.beat({"w0": 8})
        wait_for(lambda: head.liveness() == "beat", 10, "the next beat, read from the store in turn")
        assert head.worker_beats == {"w0": 8}
    finally:
        agent.leave()
        behind.close()


def _etcd_calls(server, method: str) -> int:
    """How many ``method`` calls (Range, Txn, Put...) the etcd server has answered, from its metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in lines
        if line.startswith("grpc_server_handled_total{") and f'grpc_method="{method}"' in line
    )


def test_racing_adds_count_every_one_and_a_lost_race_costs_one_round_trip(kv, request):
    """Many writers adding to one counter at once (agents registering together) each get a number of
    their own; on etcd a writer that lost a race retries in one transaction, without reading again."""
    from taiji.cluster.kv import SupportsConnections

    key, got, lock = f"race{uuid.uuid4().hex[:6]}/n", [], threading.Lock()

    def adder(mine):
        for _ in range(10):
            n = mine.add(key, 1)
            with lock:
                got.append(n)

    etcd = request.getfixturevalue("etcd_server") if isinstance(kv, SupportsConnections) else None
    reads = _etcd_calls(etcd, "Range") if etcd else 0
    threads = [threading.Thread(target=adder, args=(kv.another() if etcd else kv,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(1, 81)) and kv.add(key, 0) == 80
    if etcd:
        assert _etcd_calls(etcd, "Range") - reads <= 81 + 5, "a lost race read the key again"


def test_a_watched_doorbell_rings_by_one_write_and_each_ring_moves_it(etcd_server):
    """On etcd the launcher watches the doorbell: a ring is one plain write (no add, which every
    ringer racing it would retry), and the follower sees each ring as a new value."""
    from taiji.cluster.store import open_store
    from taiji_harness.testing import wait_for

    job = JobStore(open_store(etcd_server.url, timeout=5), f"bell{uuid.uuid4().hex[:6]}")
    bell = job.follow_doorbell()
    try:
        seen, txns = bell.value, _etcd_calls(etcd_server, "Txn")
        for _ in range(3):
            job.ring()
            wait_for(lambda seen=seen: bell.value != seen, 10, "the ring through the watch")
            seen = bell.value
        assert _etcd_calls(etcd_server, "Txn") == txns, "a ring raced an add"
    finally:
        bell.close()
