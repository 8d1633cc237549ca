"""Gradient noise scale: the pure estimator, the agreed statistics, and validation against
exact per-sample gradients (torch.func) for 1, 2 and 4 workers."""

import math

import pytest
import torch
from torch.func import functional_call, grad, vmap
from torch.utils.data import TensorDataset

import taiji
from taiji.errors import ConfigError
from taiji.monitor import ControlRow, GNSEstimator, StepStats, two_batch_estimates
from taiji.policies import Policy, SetBatchSize
from taiji.runtime.peer import Peer
from taiji_harness.testing import run_threads


def test_two_batch_estimates_recover_known_values():
    g2, trace = 3.0, 120.0
    small, big = g2 + trace / 8, g2 + trace / 32  # E|g_b|² = |G|² + tr Σ / b
    est = two_batch_estimates(small, big, 8, 32)
    assert est == pytest.approx((g2, trace))
    with pytest.raises(ValueError):
        two_batch_estimates(small, big, 8, 8)


def test_estimator_bias_correction_skips_and_state():
    est = GNSEstimator(decay=0.9)
    assert est.b_noise is None
    est.update(3.0 + 120 / 8, 3.0 + 120 / 32, 8, 32)
    assert est.grad_sqnorm == pytest.approx(3.0) and est.b_noise == pytest.approx(40.0)  # no warm-up bias
    assert not est.update(math.nan, 1.0, 8, 32) and not est.update(1.0, math.inf, 8, 32)
    assert not est.update(1.0, 1.0, 8, 8) and est.skipped == 3 and est.updates == 1
    copy = GNSEstimator()
    copy.load_state_dict(est.state_dict())
    assert copy.b_noise == est.b_noise and copy.skipped == 3


def test_step_stats_reduce_is_a_pure_function_of_the_rows():
    rows = [
        ControlRow(
            version_seen=3, local_sqnorm=5.0, sqnorm_batch=4, local_batch=4, loss_sum=8.0, compute_seconds=1.0
        ),
        ControlRow(
            version_seen=0,
            stop=1,
            local_sqnorm=7.0,
            sqnorm_batch=4,
            local_batch=4,
            loss_sum=4.0,
            compute_seconds=3.0,
        ),
        ControlRow(local_batch=0, compute_seconds=1.0),
    ]  # an empty share measures nothing
    stats = StepStats.reduce([ControlRow.from_row(r.to_row()) for r in rows], big_sqnorm=2.0)
    assert stats.version_seen == 3 and stats.stop and stats.loss == pytest.approx(1.5)
    assert stats.small_sqnorm == 6.0 and stats.small_batch == 4 and stats.global_batch == 8
    assert stats.grad_variance == 4.0 and stats.straggler == 3.0
    assert stats.previous_allreduce_wait is None  # nobody reported one (a first step)
    waits = [ControlRow(local_batch=1, previous_allreduce_wait=w) for w in (0.1, 0.3)]
    assert StepStats.reduce(waits, None).previous_allreduce_wait == pytest.approx(0.2)
    joined = waits + [ControlRow(local_batch=1)]  # a joiner has no previous step: no figure this step
    assert StepStats.reduce(joined, None).previous_allreduce_wait is None
    shares = [ControlRow(local_batch=1, previous_global_sqnorm=v) for v in (1.5, 2.25)]
    assert StepStats.reduce(shares, None).previous_global_sqnorm == 3.75  # the workers' shares of |ḡ|²
    assert StepStats.reduce(shares + [ControlRow(local_batch=1)], None).previous_global_sqnorm is None


def test_a_strategy_overriding_the_renamed_global_norm_is_told_at_once():
    with pytest.raises(TypeError, match="global_sqnorm_share"):

        class Old(taiji.SyncSGD):  # noqa: F841 - defining it is the test
            def global_sqnorm(self):
                return 1.0


def test_a_share_of_the_averaged_norm_is_sent_only_to_the_cluster_it_was_measured_in():
    from taiji.monitor.monitors import Monitors

    monitors = Monitors()
    stats = StepStats.reduce([ControlRow(local_batch=4, local_sqnorm=5.0, sqnorm_batch=4)] * 2, None)
    monitors.update(stats, 1.25, version=3)
    assert monitors.own_share(3) == 1.25
    assert math.isnan(monitors.own_share(4))  # another cluster split |ḡ|² otherwise: no pair
    other = Monitors()
    other.load_state_dict(monitors.state_dict())  # a share is this worker's: a synced peer has none
    assert math.isnan(other.own_share(3))
    monitors.update(StepStats.reduce([ControlRow(local_batch=4)] * 2, None), None, version=3)
    assert math.isnan(monitors.own_share(3))  # an unmeasured step sends none


# -- validation against exact per-sample gradients --------------------------------------

N, DIM, BATCH = 4096, 12, 64


def regression_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, DIM, generator=g, dtype=torch.float64)
    w_true = torch.randn(DIM, 1, generator=g, dtype=torch.float64)
    y = x @ w_true + 0.5 * torch.randn(N, 1, generator=g, dtype=torch.float64)
    return TensorDataset(x, y)


def make_model():
    model = torch.nn.Linear(DIM, 1).double()
    with torch.no_grad():
        model.weight.fill_(0.3)
        model.bias.fill_(1.0)
    return model


def exact_noise(model, data):
    """|G|² and tr Σ of per-sample gradients over the whole data set (population values)."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = data.tensors

    def sample_loss(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return ((out - yi.unsqueeze(0)) ** 2).mean()

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(N, -1) for g in per_sample.values()], dim=1)
    mean = flat.mean(0)
    return float(mean.square().sum()), float((flat - mean).square().sum(1).mean())


def measure(peer, steps=192):
    data = regression_problem()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # parameters stay put: the truth is constant
    raw = []
    job = taiji.Job(
        model,
        opt,
        data,
        BATCH,
        max_steps=steps,
        epochs=100,
        peer=peer,
        log_every=0,
        on_commit=lambda step: raw.append(job.last_raw_estimates),
    )
    for step in job:
        x, y = step.batch
        step.backward(((model(x) - y) ** 2).mean(1))  # per-sample losses
    raw = [r for r in raw if r is not None]  # the first step's pair completes one step later
    assert len(raw) >= steps - 2
    g2 = sum(r[0] for r in raw) / len(raw)
    trace = sum(r[1] for r in raw) / len(raw)
    return g2, trace, job.gns.b_noise


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_estimates_match_exact_per_sample_gradients_within_10_percent(n):
    exact_g2, exact_trace = exact_noise(make_model(), regression_problem())
    results = run_threads(n, measure, timeout=30) if n > 1 else [measure(Peer.solo())]
    for g2, trace, b_noise in results:
        assert g2 == pytest.approx(exact_g2, rel=0.10)
        assert trace == pytest.approx(exact_trace, rel=0.10)
        assert trace / g2 == pytest.approx(exact_trace / exact_g2, rel=0.15)
        assert b_noise is not None and b_noise == pytest.approx(exact_trace / exact_g2, rel=0.5)
    assert len({r for r in results}) == 1, "every worker must hold the same estimates"


def test_sampled_squared_norm_of_large_buckets_is_close_and_small_ones_exact():
    from taiji.monitor.norms import SAMPLE_ABOVE, sqnorm

    g = torch.Generator().manual_seed(1)
    small = torch.randn(1000, generator=g)
    assert float(sqnorm(small)) == pytest.approx(float(small.double().square().sum()), rel=1e-6)
    # layers of very different scales laid out one after another, as in a real bucket
    parts = [
        torch.randn(n, generator=g) * scale
        for n, scale in [(2_400_000, 0.01), (1_000_000, 1.0), (300_000, 5.0), (777_777, 0.2)]
    ]
    big = torch.cat(parts)
    assert big.numel() > SAMPLE_ABOVE
    exact = float(big.double().square().sum())
    assert float(sqnorm(big)) == pytest.approx(exact, rel=0.05)
    assert float(sqnorm(big.to(torch.bfloat16))) == pytest.approx(exact, rel=0.06)


def test_a_bucket_norm_is_made_once_and_measures_the_buffer_as_it_is_now():
    """The strategy keeps one BucketNorm per buffer: its scratch and views must follow what the
    buffer holds at each measurement (the gradients change every step), sampled or exact."""
    from taiji.monitor.norms import (
        SAMPLE_ABOVE,
        SAMPLE_CHUNK,
        SAMPLE_PERIOD,
        BucketNorm,
        sqnorm,
        sum_of_parts,
    )

    g = torch.Generator().manual_seed(2)
    for n in (1000, SAMPLE_ABOVE + 12_345):
        flat = torch.randn(n, generator=g)
        norm = BucketNorm(flat)
        for scale in (1.0, 3.0, 0.5):
            flat.copy_(torch.randn(n, generator=g) * scale)
            measured = sum_of_parts(norm.parts())
            assert measured == pytest.approx(sqnorm(flat.clone()), rel=1e-6)
            if n <= SAMPLE_ABOVE:
                assert measured == pytest.approx(float(flat.double().square().sum()), rel=1e-6)
            else:  # the chunks, scaled up, and the tail exactly
                rows = n // SAMPLE_PERIOD
                chunks = flat[: rows * SAMPLE_PERIOD].view(rows, SAMPLE_PERIOD)[:, :SAMPLE_CHUNK].double()
                expected = float(chunks.square().sum()) * SAMPLE_PERIOD / SAMPLE_CHUNK + float(
                    flat[rows * SAMPLE_PERIOD :].double().square().sum()
                )
                assert measured == pytest.approx(expected, rel=1e-5)
    assert sum_of_parts(BucketNorm(torch.zeros(0)).parts()) == 0.0


def test_a_sampled_norm_sees_every_column_of_a_weight_matrix():
    """A large bucket's norm is sampled in chunks; the chunks must not all fall on the same input
    features of a power-of-two-wide weight (here those features carry no gradient at all)."""
    from taiji.monitor.norms import sqnorm

    weight = torch.zeros(2048, 2048)
    weight[:, 256:] = torch.randn(2048, 2048 - 256, generator=torch.Generator().manual_seed(4))
    exact = float(weight.double().square().sum())
    assert sqnorm(weight.reshape(-1)) == pytest.approx(exact, rel=0.05)


def test_a_sampled_norm_reads_every_chunk_alike_over_the_measured_steps():
    """The chunks move on each step: over many measured steps the sampled measurements average to
    the exact norm (a fixed subset would settle on its own share), whatever the measuring interval
    and the workers' shares, and every worker reads the same chunks at a step."""
    from taiji.monitor.norms import (
        SAMPLE_ABOVE,
        SAMPLE_CHUNK,
        SAMPLE_PERIOD,
        BucketNorm,
        chunk_index,
        sum_of_parts,
    )

    flat = torch.randn(SAMPLE_ABOVE + 54_321, generator=torch.Generator().manual_seed(5)).double()
    flat[: flat.numel() // SAMPLE_PERIOD * SAMPLE_PERIOD].view(-1, SAMPLE_PERIOD)[:, :SAMPLE_CHUNK] *= 3
    exact = float(flat.square().sum())  # (the first chunk of every period holds a third of it)
    chunks = SAMPLE_PERIOD // SAMPLE_CHUNK
    for every in (1, 2, 16, chunks, 2 * chunks):  # monitor_every: "auto" picks 1..16
        steps = [every * m for m in range(20 * chunks)]
        counts = [sum(chunk_index(s, chunks) == c for s in steps) for c in range(chunks)]
        assert min(counts) >= 14 and max(counts) <= 26, (every, counts)  # 20 each, give or take
    for size in (1, 3):
        norms = [BucketNorm(flat, rank, size) for rank in range(size)]
        measured = [sum(sum_of_parts(norm.parts(step)) for norm in norms) for step in range(20 * chunks)]
        assert sum(measured) / len(measured) == pytest.approx(exact, rel=0.02), size
        assert sum_of_parts(norms[0].parts(0)) != sum_of_parts(norms[0].parts(1))  # they do move


def test_the_workers_shares_of_a_bucket_norm_sum_to_the_whole():
    """After the allreduce each worker measures only its share of the (identical) averaged bucket."""
    from taiji.monitor.norms import SAMPLE_ABOVE, BucketNorm, sum_of_parts

    g = torch.Generator().manual_seed(3)
    for n in (5, 1000, SAMPLE_ABOVE + 12_345):
        flat = torch.randn(n, generator=g)
        whole = sum_of_parts(BucketNorm(flat).parts(step=7))
        for size in (1, 2, 3, 8):
            shares = [sum_of_parts(BucketNorm(flat, rank, size).parts(step=7)) for rank in range(size)]
            assert sum(shares) == pytest.approx(whole, rel=1e-5), (n, size)
            if n > 8:  # nobody measures it all, nobody measures nothing
                assert all(0 < share < whole for share in shares) or size == 1
    assert BucketNorm(torch.ones(5), 0, 8).parts() == []  # 5 coordinates among 8: an empty share
    with pytest.raises(ValueError, match="multiple"):
        BucketNorm(torch.ones(5), period=1000)


class _SensitiveBatch(Policy):
    """Decides from the exact bits of the noise scale: any difference between workers shows."""

    def after_step(self, ctx):
        if ctx.metrics.gns is not None and ctx.step % 3 == 0:
            return SetBatchSize(8 + int(ctx.metrics.gns * 1e9) % 5)


class _OtherHardware(taiji.SyncSGD):
    """This worker's norm of the averaged gradient differs in the last bits (another CPU, say)."""

    def global_sqnorm_share(self):
        value = super().global_sqnorm_share()
        return None if value is None else value * (1 + 1e-12)


@pytest.mark.timeout(120)
def test_decisions_from_the_noise_scale_agree_even_if_workers_compute_norms_differently():
    def body(peer):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        strategy = _OtherHardware() if peer.rank == 1 else taiji.SyncSGD()
        job = taiji.Job(
            model,
            opt,
            regression_problem(),
            8,
            max_steps=24,
            epochs=100,
            peer=peer,
            log_every=0,
            strategy=strategy,
            policies=[_SensitiveBatch()],
        )
        for step in job:
            x, y = step.batch
            step.backward(((model(x) - y) ** 2).mean())
        return job.progress.sampler.batch_size, job.gns.b_noise

    (batch0, gns0), (batch1, gns1) = run_threads(2, body, timeout=30)
    assert gns0 is not None and gns0 == gns1 and batch0 == batch1


def test_auto_interval_keeps_the_norms_within_their_budget():
    from taiji.monitor.monitors import AUTO_MAX_EVERY, auto_interval

    assert auto_interval(0.0004, 0.1, 1) == 1  # 0.4% of a step: every step
    assert auto_interval(0.004, 0.1, 1) == 4  # 4%: every 4th step keeps it at 1%
    assert auto_interval(1.0, 0.1, 1) == AUTO_MAX_EVERY  # never rarer than the cap
    assert auto_interval(None, 0.1, 3) == 3 and auto_interval(0.004, None, 3) == 3  # no figure: unchanged


@pytest.mark.timeout(120)
def test_auto_monitoring_spaces_the_measured_steps_alike_on_every_worker(monkeypatch):
    from taiji.monitor import monitors

    monkeypatch.setattr(
        monitors, "AUTO_BUDGET", 1e-12
    )  # any norm is too costly: the interval goes to its cap

    def body(peer):
        model, data = make_model(), regression_problem()
        seen = []
        job = taiji.Job(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            data,
            BATCH,
            max_steps=50,
            epochs=100,
            peer=peer,
            log_every=0,
            monitor_every="auto",
            on_commit=lambda s: seen.append((s.index, job.monitors.every, job.stats.small_sqnorm)),
        )
        for step in job:
            x, y = step.batch
            step.backward(((model(x) - y) ** 2).mean())
        return seen

    results = run_threads(2, body, timeout=30)
    assert results[0] == results[1]  # the same interval and the same measured steps, from agreed figures
    measured = [index for index, _, small in results[0] if small is not None]
    # every step until the first measured step's norm time arrives (with step 1's control message)
    assert measured == [0, 1, 16, 32, 48], measured
    assert results[0][-1][1] == monitors.AUTO_MAX_EVERY
    with pytest.raises(ConfigError, match="monitor_every"):
        taiji.Job(
            make_model(),
            torch.optim.SGD(make_model().parameters(), lr=0.1),
            regression_problem(),
            BATCH,
            monitor_every="sometimes",
        )
