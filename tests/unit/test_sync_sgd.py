"""SyncSGD: bucketing, exact averaging with unequal slices, and equivalence with 1 worker (ranks as
threads). The same equivalence across launched processes: tests/integration/test_sync_sgd_procs.py."""

import copy

import pytest
import torch
import torch.nn.functional as F

import taiji
from taiji.errors import ConfigError, TaijiError
from taiji.runtime.peer import Peer
from taiji.strategies.sync_sgd import plan_buckets
from taiji_harness.testing import assert_close_to_reference, load_script, run_threads
from taiji_harness.testing import train_equiv_reference as reference

train_equiv = load_script("train_equiv")

pytestmark = pytest.mark.timeout(180)


def test_plan_buckets_respects_caps_and_order():
    assert plan_buckets([4, 4, 4, 4], cap_bytes=8, first_cap_bytes=4) == [[0], [1, 2], [3]]
    assert plan_buckets([100, 1, 1], cap_bytes=8, first_cap_bytes=8) == [[0], [1, 2]]
    # a large item joins the small first bucket rather than starting a huge second one
    assert plan_buckets([1, 50, 50, 1], cap_bytes=60, first_cap_bytes=10) == [[0, 1], [2, 3]]
    assert plan_buckets([], 8, 8) == []
    flat = [i for b in plan_buckets(list(range(1, 30)), 20, 5) for i in b]
    assert flat == list(range(29))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_threads_match_one_worker_with_indivisible_global_batch(n):
    steps, batch = 20, 10  # 10 is not divisible by 3 or 4; 97 samples: an epoch ends mid-run
    ref = reference(steps, batch)
    results = run_threads(n, lambda peer: train_equiv.train(peer, steps, batch), timeout=20)
    assert_close_to_reference(results, ref, rtol=1e-9, atol=1e-11)
    # exactly-once: each step's slices tile the reference step's global batch
    for step in range(steps):
        union = sorted(i for r in range(n) for i in results[r][2][step])
        assert union == sorted(ref[2][step])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_lower_precision_dtypes_train_consistently(dtype, tol):
    ref = reference(8, 12, dtype)
    results = run_threads(2, lambda peer: train_equiv.train(peer, 8, 12, dtype), timeout=20)
    assert_close_to_reference(results, ref, rtol=tol, atol=tol)


def test_adam_state_matches_one_worker():
    ref = train_equiv.train(Peer.solo(), 10, 9, optimizer="adam")
    results = run_threads(3, lambda peer: train_equiv.train(peer, 10, 9, optimizer="adam"), timeout=20)
    assert len(ref[1]) == 2 * len(ref[0])  # exp_avg and exp_avg_sq per parameter
    assert_close_to_reference(results, ref, rtol=1e-7, atol=1e-9)


def test_global_batch_smaller_than_cluster_gives_empty_slices():
    ref = reference(6, 2)
    results = run_threads(3, lambda peer: train_equiv.train(peer, 6, 2), timeout=20)
    assert_close_to_reference(results, ref, rtol=1e-9, atol=1e-11)


def test_unused_parameter_on_some_ranks_is_averaged_not_hung():
    def body(peer):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
        model = torch.nn.ModuleList([a, b])
        sync = taiji.SyncSGD(bucket_mb=1e-5, first_bucket_mb=1e-5).attach(model, peer.comm)
        sync.begin_step(0.5)
        x = torch.ones(2, 3)
        out = a(x) if peer.rank == 0 else b(a(x))  # rank 0 never uses b
        out.sum().backward()
        sync.synchronize()
        return [p.grad.clone() for p in model.parameters()]

    g0, g1 = run_threads(2, body)
    for x, y in zip(g0, g1):
        assert torch.equal(x, y)
    assert g0[2].abs().sum() > 0  # b's gradient: rank 1's half


def test_piecewise_use_with_no_sync_accumulation():
    def body(peer):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        sync = taiji.SyncSGD().attach(model, peer.comm)
        x = torch.full((2, 4), float(peer.rank + 1))
        with sync.no_sync():
            model(x).sum().backward()
        model(x).sum().backward()  # a plain backward starts an equal-share step
        sync.synchronize()
        return model.weight.grad.clone()

    g0, g1 = run_threads(2, body)
    assert torch.equal(g0, g1)
    # mean over ranks of 2 micro-batches x 2 rows x value (1 or 2) = 2*2*1.5
    torch.testing.assert_close(g0, torch.full((2, 4), 6.0))


def test_second_gradient_in_one_step_is_a_clear_error():
    model = torch.nn.Linear(2, 1)
    sync = taiji.SyncSGD().attach(model, Peer.solo().comm)
    sync.begin_step(1.0)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(TaijiError, match="no_sync"):
        model(torch.ones(1, 2)).sum().backward()


def test_bad_configuration():
    with pytest.raises(ConfigError):
        taiji.SyncSGD(bucket_mb=0)
    with pytest.raises(ConfigError, match="no parameters"):
        taiji.SyncSGD().attach(torch.nn.ReLU(), Peer.solo().comm)
    model = torch.nn.Linear(1, 1)
    sync = taiji.SyncSGD().attach(model, Peer.solo().comm)
    with pytest.raises(TaijiError, match="already attached"):
        sync.attach(torch.nn.Linear(1, 1), Peer.solo().comm)
    with pytest.raises(TaijiError, match="already has a taiji strategy"):
        taiji.SyncSGD().attach(model, Peer.solo().comm)
    sync.detach()
    taiji.SyncSGD().attach(model, Peer.solo().comm)  # fine once the first is detached


def test_the_last_bucket_carries_every_workers_control_row_exactly():
    clock = 1795538915.2211607

    def row_of(rank, width):  # a clock, a 52-bit fingerprint, nan, inf and fractions
        values = [
            clock + rank / 3,
            float(2**52 - 1 - rank),
            float("nan") if rank else 1e-20,
            -2.5e7 / 7,
            float("inf"),
            0.1,
        ]
        return (values * 2)[:width]

    def body(peer):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        plain.load_state_dict(model.state_dict())
        sync = taiji.SyncSGD(bucket_mb=1e-4, first_bucket_mb=1e-4).attach(model, peer.comm)
        reference = taiji.SyncSGD(bucket_mb=1e-4, first_bucket_mb=1e-4).attach(plain, peer.comm)
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(peer.rank))
        out, shares = [], []
        for width in (6, 11, 6):  # a different width re-sizes the carrying tail, keeping the grads
            for strategy, net in ((sync, model), (reference, plain)):
                net.zero_grad(set_to_none=True)
                strategy.begin_step(0.5, measure_norms=True)
                carrying = strategy is sync and strategy.carry(
                    width, lambda width=width: row_of(peer.rank, width)
                )
                net(x * width).square().sum().backward()  # other gradients each time
                strategy.synchronize()
                if strategy is sync:
                    assert carrying and sync.num_buckets > 1
                    out.append(sync.carried())
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters()))
            # the norms follow the last bucket to its new buffer (not the one it had before)
            assert sync.local_sqnorm() == reference.local_sqnorm()
            assert sync.global_sqnorm_share() == reference.global_sqnorm_share()
            exact = float(sum(p.grad.double().square().sum() for p in model.parameters()))
            shares.append((sync.global_sqnorm_share(), exact))
        return out, shares

    results = run_threads(2, body)
    for (share0, exact), (share1, _) in zip(results[0][1], results[1][1]):  # the workers' shares sum to |ḡ|²
        assert 0 < share0 < exact and share0 + share1 == pytest.approx(exact, rel=1e-5)
    for rows_by_step, _ in results:
        for rows, width in zip(rows_by_step, (6, 11, 6)):
            expected = [row_of(rank, width) for rank in range(2)]
            for got, want in zip(rows, expected):  # every bit, through three float32 pieces
                assert [x for x in got if x == x] == [x for x in want if x == x]
                assert [i for i, x in enumerate(got) if x != x] == [i for i, x in enumerate(want) if x != x]


def test_no_carry_where_the_bucket_cannot_hold_a_row_exactly():
    def body(peer):
        model = torch.nn.Linear(4, 2).to(torch.bfloat16)
        sync = taiji.SyncSGD().attach(model, peer.comm)
        sync.begin_step(0.5)
        return sync.carry(13, lambda: [0.0] * 13)

    assert run_threads(2, body) == [False, False]
    solo = taiji.SyncSGD().attach(torch.nn.Linear(4, 2), Peer.solo().comm)
    solo.begin_step(1.0)
    assert solo.carry(13, lambda: [0.0] * 13) is False  # one worker: nothing to gather
    with pytest.raises(TaijiError, match="carried"):
        solo.carried()


def test_one_worker_does_no_communication_work_and_trains_as_a_plain_loop():
    """A Job of one worker: SyncSGD's hooks are off, gradients stay autograd's (no bucket copy, no
    collective), and the model follows a plain PyTorch loop exactly."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    plain = copy.deepcopy(model)
    opt, plain_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, plain))
    job = taiji.Job(model, opt, data, 8, peer=Peer.solo(), data=taiji.DataOptions(shuffle=False))
    for step in job:
        assert not job.strategy.hooked, "a one-worker Job runs no gradient hook"
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        plain_opt.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        plain_opt.step()
    assert job.progress.step == 4 and job.gns is not None
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
