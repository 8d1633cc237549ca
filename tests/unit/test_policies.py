"""Policy logic as plain functions: the runner's conflict rule and validation, and every built-in."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import taiji
from taiji.data.sampler import SamplerState, advance, global_span
from taiji.errors import ConfigError
from taiji.policies import (
    BatchPerWorker,
    Context,
    EarlyStop,
    GNSBatchSize,
    GoodputBatchSize,
    LRScaling,
    Metrics,
    Policy,
    PolicyError,
    Resize,
    ScaleLR,
    ScheduledResize,
    SetBatchSize,
    Stop,
    ThroughputScaling,
    gns_target_batch,
    goodput_target_batch,
    lr_scale,
)
from taiji.policies.batch import fit_step_time
from taiji.policies.runner import Plan, decision_trail, plan_digest, run_hooks


def ctx(**kw) -> Context:
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
        metrics=Metrics(),
        min_size=1,
        max_size=4,
        elastic=True,
    )
    base.update(kw)
    return Context(**base)


class Emit(Policy):
    def __init__(self, *decisions, hook="after_step"):
        self._decisions, self._hook = list(decisions), hook
        self.seen = []

    def after_step(self, c):
        self.seen.append(c.batch_size)
        return self._decisions if self._hook == "after_step" else None

    def before_step(self, c):
        return self._decisions if self._hook == "before_step" else None


# -- runner -----------------------------------------------------------------------------


def test_later_policies_see_earlier_decisions_and_last_batch_and_resize_win():
    first, second = Emit(SetBatchSize(128), Resize(3)), Emit(SetBatchSize(256), Resize(4))
    final, plan = run_hooks([first, second], ["after_step"], ctx())
    assert second.seen == [128], "the second policy sees the first one's batch size"
    assert plan.batch_size == 256 and plan.resize == 4 and final.batch_size == 256
    assert [a.policy for a in plan.applied] == ["Emit", "Emit", "Emit", "Emit"]


def test_lr_factors_multiply_and_stop_is_final():
    _, plan = run_hooks(
        [Emit(ScaleLR(2.0), Stop("done")), Emit(ScaleLR(1.5)), Emit(Stop("later"))], ["after_step"], ctx()
    )
    assert plan.lr_factor == pytest.approx(3.0)
    assert plan.stop == "done"


@pytest.mark.parametrize(
    "decision, note",
    [
        (SetBatchSize(0), "rejected SetBatchSize(0)"),
        (SetBatchSize(2.5), "rejected"),
        (ScaleLR(0.0), "rejected ScaleLR"),
        (ScaleLR(float("nan")), "rejected"),
        (Resize(0), "rejected Resize(0)"),
    ],
)
def test_invalid_decisions_are_rejected_with_a_note(decision, note):
    _, plan = run_hooks([Emit(decision)], ["after_step"], ctx())
    assert not plan.applied and plan.batch_size is None and plan.resize is None and plan.lr_factor == 1
    assert len(plan.notes) == 1 and note in plan.notes[0] and "Emit.after_step at step 10" in plan.notes[0]


def test_out_of_bounds_decisions_are_clamped_and_no_ops_dropped():
    _, plan = run_hooks([Emit(SetBatchSize(5000), Resize(9))], ["after_step"], ctx())
    assert plan.batch_size == 1000 and plan.resize == 4 and len(plan.notes) == 2
    _, plan = run_hooks([Emit(SetBatchSize(64), Resize(2), ScaleLR(1.0))], ["after_step"], ctx())
    assert plan.empty
    _, plan = run_hooks([Emit(Resize(3))], ["after_step"], ctx(elastic=False))
    assert plan.resize is None and "not running under `taiji run`" in plan.notes[0]


def test_a_raising_policy_is_named_with_hook_and_step():
    class Broken(Policy):
        def after_step(self, c):
            raise ZeroDivisionError("oops")

    with pytest.raises(
        PolicyError, match=r"policy Broken.after_step raised at step 10 .*ZeroDivisionError: oops"
    ):
        run_hooks([Emit(), Broken()], ["after_step"], ctx())


def test_a_policy_returning_garbage_is_an_error():
    class Garbage(Policy):
        def before_step(self, c):
            return "bigger please"

    with pytest.raises(PolicyError, match="Garbage.before_step returned 'bigger please' at step 10"):
        run_hooks([Garbage()], ["before_step"], ctx())


def test_digests_fingerprint_decisions_per_policy():
    _, a = run_hooks([Emit(SetBatchSize(128)), Emit()], ["after_step"], ctx())
    _, b = run_hooks([Emit(SetBatchSize(136)), Emit()], ["after_step"], ctx())
    assert plan_digest(a) != plan_digest(b) and plan_digest(Plan()) == plan_digest(Plan())
    assert 0 <= plan_digest(a) < 2**52 and float(plan_digest(a)) == plan_digest(a)
    ta, tb = decision_trail(a, 4), decision_trail(b, 4)
    assert ta[0] != tb[0] and ta[0][1:] == tb[0][1:] == (0, 3)  # policy #0, hook after_step
    assert ta[1][1:] == (-1, -1) and len(ta) == 4


def test_policy_state_round_trips_through_json_and_skips_private_and_unserialisable():
    policy = ThroughputScaling()
    policy.history.append([2, 100.0])
    policy._cache = object()
    policy.handle = object()
    state = policy.state_dict()
    assert "handle" not in state and "_cache" not in state and state["history"] == [[2, 100.0]]
    other = ThroughputScaling()
    other.load_state_dict(state)
    assert other.state_dict() == state


# -- sampler: batch-size changes mid-epoch ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(num=st.integers(1, 300), batches=st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_changing_the_batch_size_mid_epoch_keeps_every_epoch_exactly_once(num, batches):
    state, seen, i = SamplerState(batch_size=batches[0]), {}, 0
    while state.epoch < 2:
        state = SamplerState(epoch=state.epoch, cursor=state.cursor, batch_size=batches[i % len(batches)])
        lo, hi = global_span(state, num)
        seen.setdefault(state.epoch, []).extend(range(lo, hi))
        state = advance(state, hi - lo, num)
        i += 1
    assert seen[0] == list(range(num)) and seen[1] == list(range(num))


# -- built-ins ------------------------------------------------------------------------------


def test_gns_target_batch_rounds_clamps_limits_growth_and_has_hysteresis():
    assert gns_target_batch(300.0, 64, min_batch=32, max_batch=1024) == 128  # at most 2x per change
    assert gns_target_batch(110.0, 64, min_batch=32, max_batch=1024) == 112  # rounded to 8
    assert gns_target_batch(70.0, 64, min_batch=32, max_batch=1024) is None  # within 25 %
    assert gns_target_batch(5000.0, 700, min_batch=32, max_batch=1024) == 1024  # clamped
    assert gns_target_batch(4.0, 64, min_batch=48, max_batch=1024) == 48  # not below min
    assert gns_target_batch(float("nan"), 64, min_batch=1, max_batch=99) is None


def test_gns_batch_policy_waits_for_warmup_and_interval_then_follows_gns():
    policy = GNSBatchSize(max_batch=512, warmup=20, interval=10)
    policy.before_train(ctx(step=0))
    assert policy.min_batch == 64
    high = Metrics(gns=400.0)
    assert policy.after_step(ctx(step=10, metrics=high)) is None  # warmup
    assert policy.after_step(ctx(step=20, metrics=Metrics())) is None  # no estimate yet
    assert policy.after_step(ctx(step=20, metrics=high)) == [SetBatchSize(128)]
    assert policy.after_step(ctx(step=25, metrics=high, batch_size=128)) is None  # interval
    assert policy.after_step(ctx(step=30, metrics=high, batch_size=128)) == [SetBatchSize(256)]


def test_gns_batch_policy_grows_the_cluster_instead_of_overfilling_a_worker():
    policy = GNSBatchSize(max_batch=4096, warmup=0, interval=1, max_per_worker=100)
    policy.before_train(ctx(step=0, batch_size=128))
    decisions = policy.after_step(ctx(step=5, batch_size=128, size=2, metrics=Metrics(gns=256.0)))
    assert decisions == [SetBatchSize(200), Resize(3)]  # 256 needs 3 workers; 2 hold 200 meanwhile
    decisions = policy.after_step(ctx(step=6, batch_size=200, size=2, metrics=Metrics(gns=400.0)))
    assert decisions == [Resize(4)]  # no room to grow the batch until they join


def _within(seconds, steps=40, spread=0.01):
    """A measured point: ``steps`` step times around ``seconds`` with ``spread`` relative deviation."""
    return (spread * seconds) ** 2 / steps


def test_fit_step_time_recovers_a_line_clips_at_zero_and_says_how_sure_it_is():
    fit = fit_step_time([(64, 0.004 + 64e-4, 1e-6), (128, 0.004 + 128e-4, 2e-6), (256, 0.004 + 256e-4, 1e-5)])
    assert (fit.alpha, fit.beta) == (pytest.approx(0.004), pytest.approx(1e-4))
    assert fit.seconds(512, fit.beta) == pytest.approx(0.004 + 512e-4)
    assert fit_step_time([(64, 0.01, 1e-6)]) is None  # one batch size: no slope
    fit = fit_step_time([(64, 0.02, 1e-6), (128, 0.019, 1e-6)])  # all fixed cost
    assert (fit.alpha, fit.beta) == (pytest.approx(0.0195), 0.0)
    assert fit.beta_se == pytest.approx(math.sqrt(1e-6 / (2 * 32**2)))  # two equal points 64 apart
    assert fit.slopes(2.0) == (0.0, pytest.approx(2 * fit.beta_se))  # never below 0
    fit = fit_step_time([(64, 0.01, 1e-6), (128, 0.04, 1e-6)])  # superlinear: no fixed cost
    assert fit.alpha == 0.0 and fit.beta == pytest.approx((64 * 0.01 + 128 * 0.04) / (64**2 + 128**2))
    assert fit.seconds(96, min(fit.slopes(2.0))) / fit.seconds(96, max(fit.slopes(2.0))) == pytest.approx(
        fit.seconds(48, min(fit.slopes(2.0))) / fit.seconds(48, max(fit.slopes(2.0)))
    )  # any slope: time ∝ batch
    noisy, steady = (fit_step_time([(64, 0.02, v), (128, 0.03, v)]) for v in (1e-4, 1e-8))
    assert noisy.beta == pytest.approx(steady.beta) and noisy.beta_se == pytest.approx(100 * steady.beta_se)
    # three points off the line by far more than their variances: the slope's error grows to match
    on_line, off_line = (
        fit_step_time([(64, 0.02, 1e-8), (96, t, 1e-8), (128, 0.03, 1e-8)]) for t in (0.025, 0.03)
    )
    assert off_line.beta_se > 10 * on_line.beta_se and on_line.beta_se == pytest.approx(
        math.sqrt(1e-8 / 2048)
    )


def test_goodput_target_batch_weighs_throughput_against_efficiency():
    compute_bound = [
        (b, 0.004 + b * 3e-4, _within(0.004 + b * 3e-4)) for b in (64, 128)
    ]  # ~15 % faster/sample
    assert goodput_target_batch(compute_bound, 150.0, 64, min_batch=64, max_batch=512) is None
    assert goodput_target_batch(compute_bound, 150.0, 128, min_batch=64, max_batch=512) == 64  # back down
    assert (
        goodput_target_batch(compute_bound, 5000.0, 64, min_batch=64, max_batch=512) == 128
    )  # noise pays it
    overhead_bound = [(b, 0.05 + b * 1e-5, _within(0.05 + b * 1e-5)) for b in (64, 128)]
    assert (
        goodput_target_batch(overhead_bound, 150.0, 128, min_batch=64, max_batch=512) == 256
    )  # <= 2x a move
    assert goodput_target_batch(overhead_bound, 150.0, 512, min_batch=64, max_batch=512) is None  # at the cap
    assert goodput_target_batch(overhead_bound, float("nan"), 64, min_batch=64, max_batch=512) is None
    slight = [(64, 0.0100, 1e-9), (72, 0.0111, 1e-9)]  # gains < min_gain: stay
    assert goodput_target_batch(slight, 1e6, 64, min_batch=64, max_batch=72, min_gain=0.05) is None
    assert (
        goodput_target_batch(overhead_bound, 150.0, 64, min_batch=64, max_batch=512, max_growth=1.3) == 80
    )  # x8


def test_goodput_target_batch_does_not_extrapolate_a_fit_it_cannot_vouch_for():
    # 64 and 88 measured at about the same step time (a drifting machine): taken at its word the fit
    # says a step costs the same at any batch, and doubling to 176 would pay even at B_noise 82 ...
    equal = [(64, 0.0300, 1e-6), (88, 0.0301, 1e-6)]
    assert goodput_target_batch(equal, 82.0, 88, min_batch=64, max_batch=512, confidence=0.0) == 176
    # ... but each mean is known only to a few percent: within two standard errors the slope may
    # be steep enough that 176 loses, so it stays; the same points measured tightly would move
    drifting = [(b, t, (0.05 * t) ** 2) for b, t, _ in equal]
    assert goodput_target_batch(drifting, 82.0, 88, min_batch=64, max_batch=512) is None
    # a line through the origin from badly measured points (±90 %): no slope within its error makes
    # a step free (it used to divide by a 0 s step); time ∝ batch, so no batch is faster per sample
    origin = [(b, t, (0.9 * t) ** 2) for b, t in ((64, 0.10), (128, 0.40))]
    assert goodput_target_batch(origin, 1e6, 128, min_batch=64, max_batch=512) is None
    tight = [(b, t, 1e-10) for b, t, _ in equal]
    assert goodput_target_batch(tight, 82.0, 88, min_batch=64, max_batch=512) == 176
    # between measured batches the fit is taken at its word: 88 is only ~5 % faster per sample, so
    # back to 64 (+7 % goodput), though the flattest plausible slope would make it a loss
    near = [(b, t, (0.05 * t) ** 2) for b, t in ((64, 0.0300), (88, 0.0396))]
    assert goodput_target_batch(near, 150.0, 88, min_batch=64, max_batch=512) == 64


def _run_goodput(policy, seconds_of_batch, gns, steps=300, size=2, batch=64):
    """Drive ``policy`` for ``steps`` committed steps whose time follows ``seconds_of_batch``."""
    policy.before_train(ctx(step=0, batch_size=batch, size=size))
    trail = [batch]
    for step in range(1, steps + 1):
        seconds = seconds_of_batch(batch)
        metrics = Metrics(samples=batch, gns=gns, worker_step_seconds=(seconds * 0.9, seconds)[:size])
        for decision in policy.after_step(ctx(step=step, batch_size=batch, size=size, metrics=metrics)) or []:
            batch = decision.batch_size
            trail.append(batch)
    return trail


def test_goodput_policy_probes_once_then_keeps_the_batch_that_makes_most_progress_per_second():
    options = dict(max_batch=512, warmup=20, interval=10)
    # a CPU worker: time per sample hardly falls with the batch, so the probe up is undone
    assert _run_goodput(GoodputBatchSize(**options), lambda b: 0.003 + 3e-4 * b, gns=150.0) == [64, 128, 64]
    # per-step costs dominate: it grows as far as its measurements, known to 5 % (drift), vouch for ...
    assert _run_goodput(GoodputBatchSize(**options), lambda b: 0.05 + 1e-5 * b, gns=150.0) == [64, 128, 216]
    # ... and on steadier hardware one 2x move at a time to the cap
    steady = dict(options, drift=0.02)
    assert _run_goodput(GoodputBatchSize(**steady), lambda b: 0.05 + 1e-5 * b, gns=150.0) == [
        64,
        128,
        256,
        512,
    ]
    # GNSBatchSize follows the noise scale (~150, within hysteresis of 128) whatever a step costs
    assert _run_goodput(GNSBatchSize(**options), lambda b: 0.003 + 3e-4 * b, gns=150.0) == [64, 128]


def test_goodput_policy_holds_still_until_the_batch_it_moved_to_is_measured():
    options, cost = dict(max_batch=512, warmup=25, interval=1), (lambda b: 0.05 + 1e-5 * b)
    assert _run_goodput(GNSBatchSize(**options), cost, gns=5000.0, steps=45) == [64, 128, 256, 512]
    # 128 is timed from step 28 (2 settle steps) and counts from its 20th measured step, 47
    assert _run_goodput(GoodputBatchSize(**options), cost, gns=5000.0, steps=46) == [64, 128]
    assert _run_goodput(GoodputBatchSize(**options), cost, gns=5000.0, steps=47) == [64, 128, 256]


def test_goodput_policy_measures_per_setup_skips_settling_steps_and_resumes_from_its_state():
    policy = GoodputBatchSize(max_batch=512, warmup=1000, settle=2)
    policy.before_train(ctx(step=0))
    for step, (workers, seconds) in enumerate(
        [(2, 0.5), (2, 0.02), (2, 0.02), (2, 0.04), (3, 0.9), (3, 0.01), (3, 0.01), (3, 0.03), (2, 0.0)]
    ):
        times = (seconds,) * workers if seconds else (0.0, 0.1)  # a 0: the step after a pause, not timed
        policy.after_step(ctx(step=step + 1, metrics=Metrics(samples=64, worker_step_seconds=times)))
    ring = "sync_sgd:ring"
    assert policy.step_times == [
        [ring, 2, 64, pytest.approx(0.03), 2, pytest.approx(1e-4)],  # no 0.5, 0.9
        [ring, 3, 64, pytest.approx(0.02), 2, pytest.approx(1e-4)],
    ]
    policy.after_step(
        ctx(step=10, metrics=Metrics(samples=40, worker_step_seconds=(0.01, 0.01)))
    )  # epoch's end
    assert [row[:3] for row in policy.step_times] == [[ring, 2, 64], [ring, 3, 64]]
    # another topology costs differently: its own measurements, from its own settling on
    for step in range(11, 15):
        policy.after_step(
            ctx(step=step, topology="tree", metrics=Metrics(samples=64, worker_step_seconds=(0.05,) * 2))
        )
    assert policy.step_times[-1][:5] == ["sync_sgd:tree", 2, 64, pytest.approx(0.05), 2]
    assert policy.current == ["sync_sgd:tree", 2, 64, 4]
    joiner = GoodputBatchSize(max_batch=512)
    joiner.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert joiner.step_times == policy.step_times and joiner.current == policy.current
    older = GoodputBatchSize(max_batch=512)  # saved by a taiji whose rows had no setup
    older.load_state_dict({"step_times": [[2, 64, 0.03, 40]], "current": [2, 64, 40], "min_batch": 64})
    assert older.step_times == [] and older.current == ["", 0, 0, 0] and older.min_batch == 64
    with pytest.raises(ConfigError, match="drift > 0"):
        GoodputBatchSize(drift=0.0)


def test_lr_scale_rules():
    assert lr_scale("linear", 256, 64) == 4 and lr_scale("sqrt", 256, 64) == 2
    assert lr_scale("adascale", 256, 64, None) == 1
    assert lr_scale("adascale", 256, 64, 1e12) == pytest.approx(4, rel=1e-6)  # pure noise: linear
    assert lr_scale("adascale", 256, 64, 1e-9) == pytest.approx(1, rel=1e-6)  # no noise: no gain
    assert 1 < lr_scale("adascale", 256, 64, 128.0) < 4
    with pytest.raises(ConfigError):
        lr_scale("cubic", 2, 1)


def test_lr_scaling_policy_tracks_the_batch_and_composes_factors():
    policy = LRScaling("sqrt")
    policy.before_train(ctx(batch_size=64))
    assert policy.before_step(ctx(batch_size=64)) is None
    up = policy.before_step(ctx(batch_size=256))
    down = policy.before_step(ctx(batch_size=128))
    assert up == ScaleLR(2.0) and down.factor == pytest.approx(math.sqrt(2) / 2)
    assert policy.applied == pytest.approx(math.sqrt(2))


def test_lr_scaling_ramps_a_higher_factor_in_and_lowers_at_once():
    policy = LRScaling("linear", ramp=4)
    policy.before_train(ctx(batch_size=64))
    assert policy.before_step(ctx(step=10, batch_size=64)) is None
    factors = [policy.before_step(ctx(step=s, batch_size=256)).factor for s in range(11, 15)]
    lrs = [math.prod(factors[: i + 1]) for i in range(4)]
    assert lrs == pytest.approx([1.75, 2.5, 3.25, 4.0])  # 1 -> 4 over 4 steps
    assert policy.before_step(ctx(step=15, batch_size=256)) is None and policy.ramp_from is None
    assert policy.before_step(ctx(step=16, batch_size=128)).factor == pytest.approx(0.5)  # at once
    mid = LRScaling("linear", ramp=4)  # a change in mid-ramp
    mid.before_train(ctx(batch_size=64))
    mid.before_step(ctx(step=0, batch_size=64))
    mid.before_step(ctx(step=1, batch_size=256))
    assert mid.applied == pytest.approx(1.75)
    mid.before_step(ctx(step=2, batch_size=128))  # 2 is above 1.75: a new ramp
    assert mid.applied == pytest.approx(1.75 + 0.25 / 4)
    restored = LRScaling("linear", ramp=4)  # a joiner or a resume
    restored.load_state_dict(mid.state_dict())
    assert restored.before_step(ctx(step=3, batch_size=128)).factor == pytest.approx(
        (1.75 + 0.125) / (1.75 + 0.0625)
    )


def test_lr_scaling_of_a_job_that_starts_above_its_base_batch_is_a_gradual_warmup():
    policy = LRScaling("sqrt", base_batch=64, ramp=3)
    policy.before_train(ctx(batch_size=1024))
    applied = []
    for step in range(5):
        decision = policy.before_step(ctx(step=step, batch_size=1024))
        applied.append(policy.applied if decision else None)
    assert applied == pytest.approx([2.0, 3.0, 4.0, None, None])
    with pytest.raises(ConfigError):
        LRScaling(ramp=-1)


def test_batch_per_worker_follows_the_cluster():
    assert BatchPerWorker(32).before_step(ctx(size=3)) == SetBatchSize(96)


def test_scheduled_resize_fires_each_entry_once_even_if_passed_during_recovery():
    policy = ScheduledResize({5: 3, 8: 2, 20: 4})
    assert policy.before_step(ctx(step=4)) is None
    assert policy.before_step(ctx(step=9)) == Resize(2)  # 5 and 8 both passed: the latest wins
    assert policy.before_step(ctx(step=10)) is None
    assert policy.before_step(ctx(step=20)) == Resize(4)
    with pytest.raises(ConfigError):
        ScheduledResize({1: 0})


def _run_throughput(policy, throughput_by_size, steps=400, max_size=8):
    """Drive the policy with a simulated cluster whose resizes land two boundaries later."""
    size, version, pending, log = 1, 1, None, []
    for step in range(1, steps):
        seconds = 64 / throughput_by_size[size]
        decisions = policy.after_step(
            ctx(
                step=step,
                size=size,
                version=version,
                max_size=max_size,
                metrics=Metrics(samples=64, step_seconds=seconds),
            )
        )
        if pending is not None and pending[0] <= step:
            size, version, pending = pending[1], version + 1, None
        if isinstance(decisions, Resize):
            pending = (step + 2, decisions.size)
            log.append(decisions.size)
    return size, log


def test_throughput_scaling_adds_workers_while_they_pay_and_gives_back_the_last():
    policy = ThroughputScaling(threshold=0.1, window=5, settle=1)
    size, log = _run_throughput(policy, {1: 100, 2: 190, 3: 260, 4: 270, 5: 270})
    assert log == [2, 3, 4, 3] and size == 3 and policy.phase == "done"
    assert [s for s, _ in policy.history] == [1, 2, 3, 4]


def test_throughput_scaling_stops_at_the_bound():
    policy = ThroughputScaling(threshold=0.1, window=5, settle=1)
    size, log = _run_throughput(policy, {1: 100, 2: 200, 3: 300}, max_size=3)
    assert log == [2, 3] and size == 3 and policy.phase == "done"


def test_early_stop_on_target_and_on_patience():
    policy = EarlyStop("loss", target=0.5, every=1, smoothing=0.0)
    assert policy.after_step(ctx(metrics=Metrics(loss=0.7))) is None
    assert isinstance(policy.after_step(ctx(metrics=Metrics(loss=0.4))), Stop)
    policy = EarlyStop("loss", patience=2, every=1, smoothing=0.0, min_delta=0.01)
    results = [policy.after_step(ctx(metrics=Metrics(loss=v))) for v in (1.0, 0.9, 0.895, 0.9)]
    assert results[:3] == [None, None, None] and isinstance(results[3], Stop)
    with pytest.raises(ConfigError):
        EarlyStop("accuracy", target=1)


def test_top_level_holds_the_users_api_only():
    assert set(taiji.__all__) == {
        "init",
        "shutdown",
        "Job",
        "Step",
        "Optimizer",
        "SyncSGD",
        "ModelAveraging",
        "PairAveraging",
        "LocalSGD",
        "Strategy",
        "rank",
        "size",
        "version",
        "resize",
        "allreduce",
        "broadcast",
        "allgather",
        "barrier",
        "TaijiError",
        "context",
        "Checkpoint",
        "load_checkpoint",
        "DataOptions",
        "MonitorOptions",
        "FaultOptions",
        "SyncOptions",
    }
    assert all(hasattr(taiji, name) for name in taiji.__all__)
    assert not hasattr(taiji, "Policy") and not hasattr(taiji, "CommError")
    assert taiji.policies.Policy is Policy and taiji.policies.SetBatchSize is SetBatchSize
    assert taiji.policies.Stop is Stop and taiji.errors.CommError.__name__ == "CommError"


def test_context_is_the_running_jobs_last_boundary():
    from taiji.runtime.peer import Peer

    model = torch.nn.Linear(2, 1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8))
    peer = Peer.solo()
    seen = []
    job = taiji.Job(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        4,
        peer=peer,
        log_every=0,
        on_commit=lambda step: seen.append(peer.context().step),
    )
    peer_before = peer.context()
    for step in job:
        step.backward(model(step.batch[0]).sum())
    assert peer_before is None and peer.context() is None  # outside the loop: no Job running
    assert seen == [1, 2]


def test_script_options_for_policies_parse_or_say_what_is_wrong():
    from taiji.errors import ConfigError
    from taiji.policies import parse_policy_names, parse_resize_schedule

    assert parse_policy_names("gns", ("gns", "schedule", "none"), ["10:2"]) == ["gns", "schedule"]
    assert parse_resize_schedule(["600:2", "150:3"]) == {150: 3, 600: 2}
    with pytest.raises(ConfigError, match="unknown --policy bogus; choose from gns, none"):
        parse_policy_names("gns,bogus", ("gns", "none"))
    with pytest.raises(ConfigError, match="STEP:SIZE"):
        parse_resize_schedule(["150"])
