"""Groups built ahead (runtime/ahead.py): which newer versions a worker builds while it trains, and,
with real gloo groups on a real TCPStore (threads as ranks), that a planned shrink's and a grow's
groups form in the background while the current version goes on training; that the lead reports the
new version only once they are built; that the transition then pays no rendezvous; and that a build
that failed is raised at the transition at once, not after another timeout."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from taiji.cluster import spec
from taiji.cluster.store import JobStore, connect_store, host_store
from taiji.comm.communicator import CommOptions, Communicator
from taiji.errors import CommError
from taiji.runtime.ahead import Ahead, worth_building_ahead
from taiji.runtime.membership import ElasticMembership
from taiji.runtime.peer import Peer, PeerOptions
from taiji_harness.latent_store import LatentStore

pytestmark = pytest.mark.timeout(120)

W = [spec.WorkerSpec(f"w{i}", "127.0.0.1") for i in range(4)]


def _versions():
    v1 = spec.initial(W[:3])
    return v1, spec.remove(v1, ["w2"]), spec.remove(v1, ["w2"], lost=True), spec.grow(v1, [W[3]])


def test_only_a_newer_version_that_keeps_this_worker_and_lost_nobody_is_built_ahead():
    v1, shrink, loss, grow = _versions()
    assert worth_building_ahead(v1, shrink, "w0") and worth_building_ahead(v1, grow, "w1")
    assert not worth_building_ahead(v1, shrink, "w2"), "a leaver builds nothing"
    assert not worth_building_ahead(v1, loss, "w0"), "a version that dropped a lost member is a failure"
    assert not worth_building_ahead(shrink, v1, "w0") and not worth_building_ahead(v1, v1, "w0"), "not newer"
    assert not worth_building_ahead(None, shrink, "w0"), "a joiner builds its groups when admitted"
    assert not worth_building_ahead(v1, grow, "w3"), "a joiner is not a member of the current version"


def _solo(version: int) -> Communicator:
    return Communicator(torch.distributed.HashStore(), 0, 1, version, CommOptions(timeout=5))


def test_each_version_is_built_once_and_none_at_or_below_the_one_moved_to():
    made, connections = [], []
    ahead = Ahead(
        lambda: connections.append(1) or (torch.distributed.HashStore(), torch.distributed.HashStore())
    )

    def make(version):
        return lambda: made.append(version) or _solo(version)

    assert ahead.start(3, make(3)) and not ahead.start(3, make(3)), "built once"
    assert ahead.start(5, make(5))
    assert made == [3, 5] and len(connections) <= 2, "a build's connections serve the next once it ended"
    assert ahead.take(4) is None  # moved to 4: v3's communicator is closed, v5's kept
    assert not ahead.start(4, make(4)) and not ahead.start(2, make(2)) and made == [3, 5]
    five = ahead.take(5)
    assert five is not None and five.version == 5 and ahead.ready(5)
    five.connect()
    assert five.allreduce(torch.ones(2)).tolist() == [1.0, 1.0]
    ahead.close()


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        time.sleep(0.005)


def _run(bodies: dict[str, object], timeout: float = 90.0) -> dict[str, object]:
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(name, body):
        try:
            results[name] = body()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in bodies.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not [t for t in threads if t.is_alive()], "a rank hung"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_a_planned_change_is_built_while_training_and_reported_only_once_built(change):
    """Three ranks train in v1; v2 is published (w2 leaves, or w3 joins). The lead keeps reporting v1
    while v2's groups form (each write to the store takes 0.3 s: the rendezvous is slow), training goes
    on meanwhile; once the lead reports v2 every member moves and its transition pays no rendezvous."""
    delay = 0.3
    server = host_store()
    job = JobStore(server, "ahead")
    v1, shrink, _, grow = _versions()
    v2 = shrink if change == "shrink" else grow
    assert job.publish(v1)
    admit = threading.Event()
    moved = {}

    def member(wid: str):
        def body():
            peer = Peer(
                LatentStore(connect_store("127.0.0.1", server.port), delay),
                JobStore(server, "ahead"),
                wid,
                v1,
                PeerOptions(timeout=30),
            )
            membership = ElasticMembership(peer)
            try:
                peer.comm.connect()
                membership.watch()  # as every worker's Transitions.sync does
                steps, reported = 0, []
                while True:  # the training loop: one allreduce a step, the lead's newest version rides it
                    newest = membership.newest_version() if peer.rank == 0 else 0
                    row = peer.comm.allreduce(torch.tensor([1.0, float(newest)]), "max")
                    steps += 1
                    reported.append(int(row[1]))
                    if steps == 3 and wid == "w0":
                        assert job.publish(v2)
                    if change == "grow" and not admit.is_set() and not peer.prepared(2):
                        admit.set()  # the joiner comes to the door only once the others build ahead
                    if reported[-1] > 1:
                        break
                began = time.perf_counter()
                if not peer.transition(job.read_config(reported[-1])):
                    return {"left": True, "steps": steps}
                peer.comm.connect()
                moved[wid] = time.perf_counter() - began
                total = peer.comm.allreduce(torch.ones(1))
                return {"steps": steps, "reported": reported, "total": float(total), "size": peer.comm.size}
            finally:
                membership.close()
                peer.close()

        return body

    def joiner():
        _wait(admit.is_set, 60, "the members building v2 ahead")
        peer = Peer(
            LatentStore(connect_store("127.0.0.1", server.port), delay),
            JobStore(server, "ahead"),
            "w3",
            None,
            PeerOptions(timeout=30),
            provisional=(3, 4),
        )
        try:
            assert peer.transition(v2)
            peer.comm.connect()
            return {"total": float(peer.comm.allreduce(torch.ones(1))), "size": peer.comm.size}
        finally:
            peer.close()

    bodies = {w.id: member(w.id) for w in W[:3]}
    if change == "grow":
        bodies["w3"] = joiner
    out = _run(bodies)
    size = v2.size
    lead = out["w0"]
    assert lead["reported"][:3] == [1, 1, 1] and lead["reported"][-1] == 2
    assert len(lead["reported"]) > 3, "training went on while v2's groups were built"
    for wid in v2.ids:
        assert out[wid]["total"] == float(size) and out[wid]["size"] == size
    for wid in (w.id for w in W[:3]):
        if wid in v2.ids:
            assert moved[wid] < delay / 2, f"{wid}'s transition paid a rendezvous: {moved}"
        else:
            assert out[wid]["left"]


def test_a_build_that_failed_is_raised_at_the_transition_at_once():
    """w1 never builds v2 (its watcher is not running): w0's build ahead times out (1 s) in the
    background; the transition to v2 then raises that failure without waiting for another timeout."""
    server = host_store()
    v1, two, _, _ = _versions()
    peer = Peer(
        connect_store("127.0.0.1", server.port), JobStore(server, "fail"), "w0", v1, PeerOptions(timeout=1.0)
    )
    try:
        assert peer.prepare(two) and not peer.prepared(2)
        _wait(lambda: peer.prepared(2), 30, "the build ahead to give up")
        assert peer.transition(two)
        began = time.perf_counter()
        with pytest.raises(CommError):
            peer.comm.connect()
        assert time.perf_counter() - began < 0.5
    finally:
        peer.close()
