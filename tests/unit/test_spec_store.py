"""Cluster membership transitions and the versioned store (pure / in-process)."""
import os
import threading

import pytest

from taiji.cluster import spec
from taiji.cluster.store import FakeStore, JobStore, connect_store, host_store
from taiji.errors import ConfigError, StoreError


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


@pytest.mark.parametrize("bad", [
    lambda c: spec.shrink(c, 0), lambda c: spec.shrink(c, 3), lambda c: spec.remove(c, ["zz"]),
    lambda c: spec.remove(c, ["a", "b", "c"]), lambda c: spec.grow(c, []),
    lambda c: spec.grow(c, workers("a")),
])
def test_invalid_transitions_raise(bad):
    with pytest.raises(ConfigError):
        bad(spec.initial(workers("a", "b", "c")))


def test_config_json_round_trip():
    c = spec.grow(spec.initial([spec.WorkerSpec("a", "10.0.0.1")]), workers("b"))
    assert spec.ClusterConfig.from_json(c.to_json()) == c


@pytest.fixture(params=["fake", "tcp"])
def kv(request):
    return FakeStore() if request.param == "fake" else host_store()


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
    from _harness import listening_addresses
    store = host_store("127.0.0.1", 0, timeout=5)
    mine = [a for a in listening_addresses(os.getpid()) if a.endswith(f":{store.port}")]
    assert mine == [f"127.0.0.1:{store.port}"], mine
    client = connect_store("127.0.0.1", store.port, timeout=5)
    client.set("k", "v")
    assert store.get("k") == b"v"
