"""Collectives on 1-4 ranks (threads against a real TCPStore), async handles, timeouts,
peer loss, the debug-mode shape check and consensus."""

import math
import threading
import time

import pytest
import torch

from taiji.comm.communicator import CommOptions, Communicator
from taiji.errors import CollectiveTimeout, CommError, ConfigError, ConsensusError, MismatchError, PeerLost
from taiji_harness.latent_store import LatentStore
from taiji_harness.testing import run_threads

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allreduce_ops_broadcast_allgather_barrier(n):
    def body(peer):
        c, r = peer.comm, peer.rank
        out = {}
        for op in ("sum", "avg", "min", "max"):
            t = torch.tensor([r + 1.0, -r, 2.0 * r], dtype=torch.float64)
            c.allreduce(t, op)
            out[op] = t.tolist()
        ints = torch.tensor([r + 1], dtype=torch.int64)
        c.allreduce(ints, "sum")
        out["int_sum"] = ints.item()
        b = torch.full((3,), float(r))
        c.broadcast(b, src=n - 1)
        out["bcast"] = b.tolist()
        out["gather"] = [x.item() for x in c.allgather(torch.tensor([r * 10]))]
        c.barrier()
        return out

    results = run_threads(n, body)
    ranks = range(n)
    expected = {
        "sum": [sum(r + 1.0 for r in ranks), -sum(ranks), 2.0 * sum(ranks)],
        "avg": [sum(r + 1.0 for r in ranks) / n, -sum(ranks) / n, 2.0 * sum(ranks) / n],
        "min": [1.0, -(n - 1), 0.0],
        "max": [float(n), 0.0, 2.0 * (n - 1)],
    }
    for res in results:
        for op, values in expected.items():
            assert res[op] == pytest.approx(values), op
        assert res["int_sum"] == n * (n + 1) // 2
        assert res["bcast"] == [float(n - 1)] * 3
        assert res["gather"] == [r * 10 for r in ranks]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_allreduce_floating_dtypes(dtype):
    def body(peer):
        t = torch.full((5,), peer.rank + 1.0, dtype=dtype)
        peer.comm.allreduce(t, "avg")
        return t

    for t in run_threads(2, body):
        assert t.dtype == dtype and torch.equal(t, torch.full((5,), 1.5, dtype=dtype))


def test_async_handles_on_independent_channels():
    def body(peer):
        c = peer.comm
        handles = [c.allreduce(torch.full((1000,), float(i)), "sum", async_op=True) for i in range(5)]
        ctrl = c.allreduce(torch.tensor([1.0]), "sum", channel="ctrl", async_op=True)
        gathered = c.allgather(torch.tensor([peer.rank]), async_op=True)
        return (
            [h.wait()[0].item() for h in handles],
            ctrl.wait().item(),
            [g.item() for g in gathered.wait()],
            all(h.is_completed() for h in handles),
        )

    for sums, ctrl, gathered, completed in run_threads(3, body):
        assert sums == [0.0, 3.0, 6.0, 9.0, 12.0] and ctrl == 3.0 and gathered == [0, 1, 2] and completed


def test_rank_that_never_joins_times_out_with_a_clear_error():
    release = threading.Event()

    def body(peer):
        peer.comm.connect()
        if peer.rank == 2:
            release.wait(30)  # connected, then absent from the collective, but alive
            return None
        started = time.monotonic()
        try:
            peer.comm.allreduce(torch.ones(4), "sum")
        except CollectiveTimeout as exc:
            return time.monotonic() - started, str(exc)
        finally:
            if peer.rank == 0:
                release.set()
        return "no error"

    # the timeout bounds the groups' connect too: 8 s, as gloo may take seconds to connect right after
    # another group's construction failed in this process (tests/unit/test_ahead.py's failed build),
    # and three threads' groups took over 4 s to connect on a loaded 2-core machine
    results = run_threads(3, body, timeout=8.0)
    for rank in (0, 1):
        elapsed, message = results[rank]
        assert 7.5 < elapsed < 20.0
        assert f"rank {rank}" in message and "allreduce" in message and "'grad'" in message


def test_an_abandoned_version_ends_waits_at_once_and_its_collectives_go_to_the_reaper():
    """A newer version dropped a member as lost: waits in flight, and later ones, end with PeerLost
    at once rather than at the timeout (gloo cannot abort a collective: it is left behind)."""
    release, waiting = threading.Event(), threading.Barrier(2)
    comms = {}

    def body(peer):
        peer.comm.connect()
        comms[peer.rank] = peer.comm
        if peer.rank == 2:
            release.wait(30)  # alive, connected, and never in the collective (a cut-off host)
            return None
        try:
            handle = peer.comm.allreduce(torch.ones(4), "sum", async_op=True)
            waiting.wait(10)
            if peer.rank == 0:
                peer.comm.abandon("cluster v2 dropped lost worker(s) w2")
            started = time.monotonic()
            with pytest.raises(PeerLost) as info:
                handle.wait()
            elapsed = time.monotonic() - started
            with pytest.raises(PeerLost):  # a later wait on this version fails at once too
                peer.comm.allreduce(torch.ones(4), "sum")
            return elapsed, str(info.value), time.monotonic() - started
        finally:
            if peer.rank == 0:
                comms[1].abandon("cluster v2 dropped lost worker(s) w2")
            waiting.abort()
            release.set()

    results = run_threads(3, body, timeout=30)
    elapsed, message, both = results[0]
    assert elapsed < 2.0 and both < 5.0, results  # not the 30 s timeout
    assert "abandoned: cluster v2 dropped lost worker(s) w2" in message and "rank 0" in message


def test_rank_that_never_connects_times_out_naming_the_op():
    release = threading.Event()

    def body(peer):
        if peer.rank == 1:
            release.wait(30)
            return None
        try:
            with pytest.raises(CollectiveTimeout) as info:
                peer.comm.broadcast(torch.ones(2), src=0)
        finally:
            release.set()
        return str(info.value)

    message = run_threads(2, body, timeout=1)[0]
    assert "broadcast (connecting the group)" in message and "timed out after 1s" in message


def test_peer_that_leaves_mid_job_surfaces_as_comm_error():
    def body(peer):
        peer.comm.allreduce(torch.ones(2), "sum")
        if peer.rank == 1:
            peer.close()  # tears its connections down, like a crashed process
            return None
        with pytest.raises((PeerLost, CollectiveTimeout)) as info:
            for _ in range(3):
                peer.comm.allreduce(torch.ones(2), "sum")
        return type(info.value).__name__

    results = run_threads(2, body, timeout=3)
    assert results[0] in ("PeerLost", "CollectiveTimeout")


def test_debug_mode_names_mismatching_ranks():
    def body(peer):
        peer.comm.options = CommOptions(timeout=5, debug=True)
        shape = (3,) if peer.rank != 1 else (4,)
        with pytest.raises(MismatchError) as info:
            peer.comm.allreduce(torch.ones(shape), "sum")
        return str(info.value)

    for message in run_threads(3, body):
        assert "rank 1" in message and "(4,)" in message and "(3,)" in message
        assert "rank 2" not in message.split("but", 1)[1]


def test_consensus_names_the_ranks_that_differ():
    def body(peer):
        peer.comm.consensus(torch.arange(4.0), "weights")  # agreed: no error
        peer.comm.consensus(b"decision:resize(4)", "decision")
        value = 1.0 if peer.rank in (0, 1) else 2.0
        with pytest.raises(ConsensusError) as info:
            peer.comm.consensus(torch.tensor([value]), "lr")
        return str(info.value)

    for message in run_threads(4, body):
        assert "ranks [2, 3]" in message and "lr" in message


def test_closed_communicator_and_bad_arguments():
    def body(peer):
        with pytest.raises(ConfigError):
            peer.comm.allreduce(torch.ones(1), "prod")
        with pytest.raises(ConfigError):
            peer.comm.allreduce(torch.ones(1, dtype=torch.int64), "avg")
        with pytest.raises(ConfigError):
            peer.comm.broadcast(torch.ones(1), src=5)
        peer.comm.barrier()
        peer.comm.close()
        with pytest.raises(CommError, match="closed"):
            peer.comm.allreduce(torch.ones(1), "sum")

    run_threads(2, body)


def test_size_one_needs_no_network():
    import torch.distributed as dist

    c = Communicator(dist.HashStore(), 0, 1, 1)
    t = torch.tensor([3.0])
    assert c.allreduce(t, "avg").item() == 3.0
    assert [x.item() for x in c.allgather(torch.tensor([7]))] == [7]
    c.barrier()
    with pytest.raises(ConfigError):
        Communicator(dist.HashStore(), 1, 1, 1)


def test_an_nccl_misuse_is_a_config_error_that_says_what_to_do():
    """Two workers on one GPU under NCCL fail the same way on every retry: the worker ends with a
    message naming the remedy instead of rebuilding its groups again and again. (The text is what
    NCCL 2.28 raised for two ranks on one H100.)"""
    from taiji.comm.failures import collective_error

    exc = RuntimeError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run "
        "with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually "
        "reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and "
        "rank 0 both on CUDA device 60"
    )
    where = dict(op="broadcast", channel="ctrl", rank=1, size=2, timeout=60.0, version=3)
    err = collective_error(exc, **where)
    assert isinstance(err, ConfigError) and not isinstance(err, CommError)
    assert "Duplicate GPU detected : rank 1 and rank 0" in str(err) and "--cuda-backend gloo" in str(err)
    assert isinstance(collective_error(RuntimeError("Connection closed by peer"), **where), PeerLost)
    assert isinstance(collective_error(RuntimeError("Timed out waiting 60000ms"), **where), CollectiveTimeout)


def test_the_cuda_backend_is_nccl_or_gloo_from_the_launcher(monkeypatch):
    """`taiji run --cuda-backend gloo` (workers sharing a GPU) reaches every worker's communicator
    through TAIJI_CUDA_BACKEND; anything but nccl or gloo is refused where it is given. (The CUDA
    groups themselves: tests/gpu.)"""
    import torch.distributed as dist

    from taiji.launch.parser import build_parser

    assert CommOptions().cuda_backend == "nccl"
    monkeypatch.setenv("TAIJI_CUDA_BACKEND", "gloo")
    assert CommOptions().cuda_backend == "gloo"
    monkeypatch.setenv("TAIJI_CUDA_BACKEND", "mpi")
    with pytest.raises(ConfigError, match="TAIJI_CUDA_BACKEND='mpi'"):
        CommOptions()
    with pytest.raises(ConfigError, match="nccl or gloo"):
        Communicator(dist.HashStore(), 0, 1, 1, CommOptions(cuda_backend="nccl2"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "-np", "2", "--cuda-backend", "mpi", "train.py"])


def test_float32_pieces_hold_every_bit_of_a_float64():
    from taiji.comm.transfer import float32_pieces, float64_from_pieces

    values = [1795538915.2211607, float(2**52 - 1), -2.5e7 / 7, 0.1, 0.0, float("inf"), -float("inf")]
    import numpy as np

    pieces = float32_pieces(values + [float("nan")])
    assert pieces.dtype == np.float32 and pieces.shape == (3, len(values) + 1)
    back = float64_from_pieces(pieces).tolist()
    assert back[:-1] == values and math.isnan(back[-1])
    # a slot summed with zeros from the other workers (what a sum-allreduce does) is unchanged
    summed = torch.from_numpy(pieces[:, :-1].copy()) + torch.zeros(3, len(values))
    assert float64_from_pieces(summed.numpy()).tolist() == values
    # written in place into a numpy view of a tensor (the carrying bucket's slot)
    slot = torch.full((2, 3, len(values)), 7.0)
    float32_pieces(values, out=slot[1].numpy())
    assert float64_from_pieces(slot.numpy())[1].tolist() == values


def test_float32_pieces_are_a_float64_to_float32_cast_at_the_edges_and_never_raise():
    """Beyond float32's range a value comes back infinite, near and below its subnormals as the
    cast rounds (as torch's ``.float()``), whatever numpy's error settings are."""
    import numpy as np

    from taiji.comm.transfer import float32_pieces, float64_from_pieces

    f32 = torch.finfo(torch.float32)
    edges = [
        1e300,
        -1e300,
        float(f32.max) * (1 + 2**-25),
        float(f32.max),
        1e-40,
        -1e-46,
        1.0000001e-39,
        float(f32.tiny),
        5e-324,
        -0.0,
        2.0**70,
    ]
    with np.errstate(all="raise"):
        pieces = float32_pieces(edges)
    back = float64_from_pieces(pieces)
    first = torch.tensor(edges, dtype=torch.float64).float()
    assert torch.equal(torch.from_numpy(pieces[0]), first), "the first piece is not the float32 cast"
    assert back[0] == math.inf and back[1] == -math.inf and back[3] == float(f32.max)
    assert back[-1] == 2.0**70 and back[-2] == 0.0 and math.copysign(1.0, float(pieces[0][-2])) == -1.0


@pytest.mark.parametrize("side_by_side", [True, False])
def test_connect_builds_a_versions_groups_side_by_side_so_it_pays_one_rendezvous(side_by_side):
    """A new version's ctrl and grad groups are built before its first step; given a second
    connection to the store, at the same time: a recovery waits for one rendezvous, not two."""
    delay, inner, kept, took = 1.0, torch.distributed.HashStore(), [], {}

    def body(rank):
        store = LatentStore(inner, delay)
        side = store.clone()
        kept.extend([store, side])  # a store written in Python must outlive the C++ stores wrapping it
        comm = Communicator(
            store, rank, 2, 1, CommOptions(timeout=30), side_store=side if side_by_side else None
        )
        started = time.perf_counter()
        comm.connect()
        took[rank] = time.perf_counter() - started
        grads = torch.ones(3)
        comm.allreduce(grads)  # both groups work (and were not built again: no write, no delay)
        rows = comm.allgather(torch.tensor([rank]))
        took[f"after{rank}"] = time.perf_counter() - started - took[rank]
        comm.close()
        return grads.tolist(), [int(r) for r in rows]

    threads = [threading.Thread(target=lambda r=r: took.setdefault(f"out{r}", body(r))) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for rank in range(2):
        assert took[f"out{rank}"] == ([2.0] * 3, [0, 1])
        assert took[f"after{rank}"] < delay, took
        if side_by_side:
            assert took[rank] < 1.6 * delay, took
        else:
            assert took[rank] >= 2 * delay, took
