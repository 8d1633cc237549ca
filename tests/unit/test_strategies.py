"""ModelAveraging's arithmetic, and switching strategies at a step boundary (ranks as threads).
Real processes: tests/integration/test_strategies_procs.py, tests/faults/test_strategies_faults.py."""

import pytest
import torch
import torch.nn.functional as F

import taiji
from taiji.comm.transfer import digest
from taiji.policies import Context, Metrics, Policy, SetStrategy
from taiji.policies.runner import run_hooks
from taiji.policies.strategy import InterferenceSwitch, StrategyBySize
from taiji.strategies.model_averaging import ModelAveraging
from taiji_harness.testing import classification_data, run_threads

pytestmark = pytest.mark.timeout(120)


def test_model_averaging_applies_alpha_towards_the_live_mean_every_k_steps():
    alpha, lr, every = 0.5, 0.1, 2

    def body(peer):
        torch.manual_seed(peer.rank)  # replicas start different on purpose
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        strategy = ModelAveraging(alpha, every).attach(model, peer.comm)
        history = []
        for step in range(4):
            before = [p.detach().clone() for p in model.parameters()]
            strategy.begin_step(0.5, step)
            x = torch.full((4, 3), float(peer.rank + step))
            model(x).square().mean().backward()
            strategy.synchronize()
            grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
            strategy.after_update()
            opt.zero_grad()
            history.append((before, grads, [p.detach().clone() for p in model.parameters()]))
        return history

    h0, h1 = run_threads(2, body)
    for step in range(4):
        for (b0, g0, a0), (b1, _g1, _a1) in [(h0[step], h1[step]), (h1[step], h0[step])]:
            for w, g, after, w_other in zip(b0, g0, a0, b1):
                expected = w - lr * g
                if step % every == 0:
                    expected = expected + alpha * ((w + w_other) / 2 - w)
                assert torch.allclose(after, expected, atol=1e-6), f"step {step}"


def test_model_averaging_validates_its_arguments():
    with pytest.raises(taiji.errors.ConfigError):
        ModelAveraging(alpha=0)
    with pytest.raises(taiji.errors.ConfigError):
        ModelAveraging(every=0)


def data(n=120):
    return classification_data(n)


class SwitchAt(Policy):
    def __init__(self, plan):
        self._plan = plan

    def before_step(self, ctx):
        if ctx.step in self._plan:
            return SetStrategy(self._plan[ctx.step])


def test_switching_strategies_mid_epoch_keeps_exactly_once_and_resyncs_into_sync_sgd():
    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        job = taiji.Job(
            model,
            opt,
            data(),
            8,
            epochs=1,
            peer=peer,
            log_every=0,
            strategies={"model_averaging": ModelAveraging(alpha=0.5, every=3)},
            policies=[SwitchAt({4: "model_averaging", 9: "sync_sgd", 11: "no_such_thing"})],
        )
        record = []
        for step in job:
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
            state = [p.detach().clone() for p in model.parameters()]
            state += [opt.state[p]["momentum_buffer"] for p in model.parameters() if p in opt.state]
            record.append((step.index, job.strategy_name, step.indices.tolist(), digest(state)))
        return record

    r0, r1 = run_threads(2, body)
    assert [s for _, s, _, _ in r0] == ["sync_sgd"] * 4 + ["model_averaging"] * 5 + ["sync_sgd"] * 6
    assert [s for _, s, _, _ in r0] == [s for _, s, _, _ in r1]
    consumed = sorted(i for rec in (r0, r1) for _, _, idx, _ in rec for i in idx)
    assert consumed == list(range(120)), "an epoch with two switches is still exactly-once"
    same = [a[3] == b[3] for a, b in zip(r0, r1)]
    # the first sync makes replicas identical; averaging lets them drift; switching back re-syncs
    # them (bitwise), and SyncSGD keeps them identical from there on
    assert all(same[:4]) and not all(same[4:9]) and all(same[9:]), same


class SwitchOnceAt(Policy):
    """Switch at the first boundary at or after each step (decoupled phases skip steps)."""

    def __init__(self, plan):
        self._plan = sorted(plan.items())
        self.done = 0

    def before_step(self, ctx):
        if self.done < len(self._plan) and ctx.step >= self._plan[self.done][0]:
            self.done += 1
            return SetStrategy(self._plan[self.done - 1][1])


@pytest.mark.parametrize("decoupled", ["pair_averaging", "local_sgd"])
def test_switching_into_and_out_of_a_decoupled_strategy_keeps_exactly_once(decoupled):
    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        job = taiji.Job(
            model,
            opt,
            data(),
            8,
            epochs=2,
            peer=peer,
            log_every=0,
            sync_every=32,
            policies=[SwitchOnceAt({3: decoupled, 12: "sync_sgd"})],
        )
        record = []
        for step in job:
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
            lockstep = job.strategy.lockstep
            record.append(
                (
                    job.strategy_name,
                    step.segments if not lockstep else None,
                    (step.epoch, *step.span) if lockstep else None,
                    digest(list(model.parameters())),
                )
            )
        return record, job.progress

    (r0, p0), (r1, p1) = run_threads(2, body)
    assert p0 == p1 and p0.epoch == 2
    names = [name for name, *_ in r0]
    assert names[:3] == ["sync_sgd"] * 3 and decoupled in names and names[-1] == "sync_sgd"
    counts = {}
    lockstep_steps = [rec[2] for rec in r0 if rec[2] is not None]  # the same on both ranks
    for epoch, lo, hi in lockstep_steps + [seg for rec in r0 + r1 if rec[1] for seg in rec[1]]:
        for i in range(lo, hi):
            counts[epoch * 120 + i] = counts.get(epoch * 120 + i, 0) + 1
    assert sorted(counts) == list(range(240)) and set(counts.values()) == {1}
    # back in SyncSGD the replicas are identical again
    assert r0[-1][3] == r1[-1][3]


def test_interference_switch_moves_a_slowed_sync_sgd_job_to_pair_averaging():
    import time

    def body(peer):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        job = taiji.Job(
            model,
            opt,
            data(),
            8,
            epochs=12,
            peer=peer,
            log_every=0,
            sync_every=48,
            policies=[InterferenceSwitch("pair_averaging", fraction=0.2, window=8, settle=2)],
        )
        switched_at = None
        for step in job:
            if job.strategy_name == "pair_averaging" and switched_at is None:
                switched_at = step.index
            if peer.rank == 1 and step.index >= 30 and job.strategy.lockstep:
                time.sleep(0.05)  # interference on one worker: under SyncSGD everyone waits
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
        return switched_at

    switched = run_threads(2, body)
    assert switched[0] == switched[1] and switched[0] is not None and 30 < switched[0] <= 30 + 2 * 8 + 2


def ctx(**kw):
    base = dict(
        step=10,
        epoch=0,
        cursor=0,
        num_samples=1000,
        size=2,
        version=1,
        batch_size=64,
        lr=0.1,
        strategy="sync_sgd",
        time=0.0,
        strategies=("model_averaging", "pair_averaging", "sync_sgd"),
    )
    base.update(kw)
    return Context(**base)


def test_set_strategy_is_validated_against_the_jobs_strategies():
    _, plan = run_hooks([SwitchAt({10: "bogus"})], ["before_step"], ctx())
    assert plan.strategy is None and "rejected SetStrategy('bogus')" in plan.notes[0]
    _, plan = run_hooks([SwitchAt({10: "model_averaging"})], ["before_step"], ctx())
    assert plan.strategy == "model_averaging"


def test_strategy_by_size():
    policy = StrategyBySize({1: "sync_sgd", 4: "model_averaging"})
    assert policy.before_step(ctx(size=3)) is None
    assert policy.before_step(ctx(size=4)) == SetStrategy("model_averaging")
    assert policy.before_step(ctx(size=2, strategy="model_averaging")) == SetStrategy("sync_sgd")


def test_interference_switch_needs_a_majority_of_slowed_workers():
    policy = InterferenceSwitch(fraction=0.7, window=3, settle=1)
    decisions = []
    series = [(0.1, 0.1, 0.1)] * 4 + [(0.1, 0.1, 0.3)] * 3 + [(0.2, 0.2, 0.3)] * 3
    for i, times in enumerate(series):
        decisions.append(policy.after_step(ctx(step=i, metrics=Metrics(worker_step_seconds=times))))
    assert decisions[:9] == [None] * 9, "one slow worker alone is not a majority"
    assert decisions[9] == SetStrategy("pair_averaging")
    assert policy.after_step(ctx(metrics=Metrics(worker_step_seconds=(1.0, 1.0, 1.0)))) is None


def test_pair_averaging_gives_a_peer_model_that_lags_more_than_one_global_batch_less_weight():
    from taiji.strategies.pair_averaging import PairAveraging

    aged = PairAveraging(age_scale=1.0)
    aged.claimed(1000, 100)
    aged.claimed(900, 100)  # an adopted run from further back does not turn the clock back
    assert [aged.weight_of(c) for c in (1200, 1000, 900)] == [0.5, 0.5, 0.5], "fresher, or the usual lag"
    assert aged.weight_of(800) == 0.25 and aged.weight_of(600) == 0.125
    plain = PairAveraging(age_scale=None)
    plain.claimed(1000, 100)
    assert plain.weight_of(0) == 0.5
    with pytest.raises(taiji.errors.ConfigError):
        PairAveraging(age_scale=0)


def test_pair_averaging_fetches_only_every_k_local_steps_when_asked():
    from taiji.strategies.pair_averaging import PairAveraging

    def body(peer):
        torch.manual_seed(peer.rank)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy = PairAveraging(fetch_every=3)
        job = taiji.Job(model, opt, data(), 8, epochs=2, peer=peer, log_every=0, strategy=strategy)
        steps = 0
        for step in job:
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
            steps += 1
        return steps, strategy.averaged + strategy.skipped

    for steps, tried in run_threads(2, body):
        assert 0 < tried <= steps // 3, (steps, tried)
    with pytest.raises(taiji.errors.ConfigError):
        PairAveraging(fetch_every=0)
