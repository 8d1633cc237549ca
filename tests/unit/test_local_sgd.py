"""LocalSGD's arithmetic (steps-weighted average, DiLoCo-style outer step) and its decoupled
phases in a Job (ranks as threads). Real processes: tests/integration/test_strategies_procs.py,
tests/faults/test_strategies_faults.py."""

import pytest
import torch
import torch.nn.functional as F

import taiji
from taiji.comm.transfer import digest
from taiji.strategies.local_sgd import LocalSGD
from taiji_harness.testing import classification_data, run_threads

pytestmark = pytest.mark.timeout(120)


def local_steps(model, strategy, rank, count):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(count):
        strategy.begin_step(1.0, step)
        model(torch.full((4, 3), float(rank + step + 1))).square().mean().backward()
        strategy.synchronize()
        opt.step()
        strategy.after_update()
        opt.zero_grad()


def test_sync_point_averages_the_models_weighted_by_local_steps():
    steps = {0: 3, 1: 1}

    def body(peer):
        torch.manual_seed(peer.rank)  # replicas start different on purpose
        model = torch.nn.Linear(3, 2)
        strategy = LocalSGD(every=4).attach(model, peer.comm)
        local_steps(model, strategy, peer.rank, steps[peer.rank])
        before = [p.detach().clone() for p in model.parameters()]
        strategy.sync_point()
        unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
        strategy.commit_sync_point()
        assert unchanged, "nothing is applied before the sync point's agreement"
        return before, [p.detach().clone() for p in model.parameters()], strategy.local_steps

    (b0, a0, n0), (b1, a1, n1) = run_threads(2, body)
    assert n0 == n1 == 0, "the weights start again after a sync point"
    for w0, w1, r0, r1 in zip(b0, b1, a0, a1):
        assert torch.equal(r0, r1)
        assert torch.allclose(r0, (3 * w0 + 1 * w1) / 4, atol=1e-6)
        assert not torch.allclose(r0, (w0 + w1) / 2, atol=1e-4), "weights are steps, not one vote each"


def test_outer_step_applies_nesterov_momentum_to_the_outer_gradient_on_every_replica_alike():
    lr, mu = 0.7, 0.9

    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(3, 2)
        strategy = LocalSGD(every=2, outer_lr=lr, outer_momentum=mu).attach(model, peer.comm)
        history = []
        for _ in range(3):
            local_steps(model, strategy, peer.rank, 2)
            history.append([p.detach().clone() for p in model.parameters()])
            strategy.sync_point()
            strategy.commit_sync_point()
            history.append([p.detach().clone() for p in model.parameters()])
        return history

    h0, h1 = run_threads(2, body)
    for a, b in zip(h0[1::2], h1[1::2]):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "every replica takes the same outer step"
    # by hand, on the first tensor: the first sync point averages (and anchors), later ones step
    anchor = (h0[0][0] + h1[0][0]) / 2
    assert torch.allclose(h0[1][0], anchor, atol=1e-6)
    momentum = None
    for k in (2, 4):
        mean = (h0[k][0] + h1[k][0]) / 2
        grad = anchor - mean
        momentum = grad.clone() if momentum is None else mu * momentum + grad
        anchor = anchor - lr * (grad + mu * momentum)
        assert torch.allclose(h0[k + 1][0], anchor, atol=1e-5)


def test_a_sync_point_retried_after_a_failure_averages_once():
    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(3, 2)
        strategy = LocalSGD(every=4).attach(model, peer.comm)
        local_steps(model, strategy, peer.rank, 2)
        before = [p.detach().clone() for p in model.parameters()]
        strategy.sync_point()  # its agreement failed: the Job recovers and takes it again
        strategy.sync_point()
        strategy.commit_sync_point()
        return before, [p.detach().clone() for p in model.parameters()]

    (b0, a0), (b1, a1) = run_threads(2, body)
    for w0, w1, r0 in zip(b0, b1, a0):
        assert torch.allclose(r0, (w0 + w1) / 2, atol=1e-6)


def test_local_sgd_validates_its_arguments():
    for kwargs in ({"every": 0}, {"outer_lr": 0}, {"outer_momentum": 1.0}, {"outer_momentum": -0.1}):
        with pytest.raises(taiji.errors.ConfigError):
            LocalSGD(**kwargs)
    with pytest.raises(taiji.errors.TaijiError):
        LocalSGD().begin_step(1.0)


def test_job_under_local_sgd_meets_every_h_global_batches_exactly_once_and_ends_with_one_model():
    every, batch, n = 2, 8, 120

    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        strategy = LocalSGD(every=every)
        job = taiji.Job(
            model, opt, classification_data(n), batch, epochs=1, peer=peer, log_every=0, strategy=strategy
        )
        segments, at_sync_points = [], {}
        for step in job:
            if strategy.local_steps == 0:  # the first step after a sync point: the replicas are one
                at_sync_points[strategy.averaged] = digest(list(model.parameters()))
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
            segments += step.segments
        return segments, strategy.averaged, job.progress, at_sync_points

    (s0, m0, p0, d0), (s1, m1, p1, d1) = run_threads(2, body)
    positions = sorted(i for epoch, lo, hi in s0 + s1 for i in range(epoch * n + lo, epoch * n + hi))
    assert positions == list(range(n)), "every sample exactly once"
    # a phase ends once H global batches are claimed; claims already on their way may add one per worker
    assert m0 == m1 and n // (every * batch + batch) <= m0 <= -(-n // (every * batch)), m0
    assert p0 == p1 and p0.epoch == 1 and p0.sampler.cursor == 0
    # a rank may take no step in a phase (the other claimed it all): compare the phases both began
    both = sorted(set(d0) & set(d1))
    assert len(both) >= 2 and all(d0[k] == d1[k] for k in both), "identical after every sync point"
    assert len({d0[k] for k in both}) == len(both), "and training moved them on between sync points"
