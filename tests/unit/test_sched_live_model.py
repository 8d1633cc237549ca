"""Live jobs for the simulator's policies: a step-time model fitted to a job's measurements and
the Application built from it (taiji/sched/live.py; pure)."""

import math

import pytest

from taiji.errors import ConfigError
from taiji.sched.cluster import Cluster
from taiji.sched.costs import SYSTEMS
from taiji.sched.live import Measured, StepModel, fit_step_model, live_application, live_view
from taiji.sched.model import progress_rate, step_time, time_to_finish
from taiji.sched.policies import make_policy

TRUTH = StepModel(
    compute_fixed=0.004, compute_per_sample=0.0005, sync_fixed=0.010, sync_per_worker=0.003, cross_host=0.020
)
BATCH = 128


def measure(model, sizes):
    return [Measured(n, h, model.step_time(h, n, BATCH / n)) for n, h in sizes]


def test_the_fit_recovers_a_model_from_enough_sizes():
    fitted = fit_step_model(BATCH, measure(TRUTH, [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (6, 2)]))
    for field in TRUTH.__dataclass_fields__:
        assert getattr(fitted, field) == pytest.approx(getattr(TRUTH, field), rel=0.02, abs=2e-5), field


def test_one_measured_size_predicts_linear_scaling_until_more_are_seen():
    fitted = fit_step_model(BATCH, measure(TRUTH, [(2, 1)]))
    at_2 = TRUTH.step_time(1, 2, BATCH / 2)
    assert fitted.step_time(1, 2, BATCH / 2) == pytest.approx(at_2, rel=1e-3)
    assert fitted.step_time(1, 4, BATCH / 4) == pytest.approx(at_2 / 2, rel=0.01), "optimistic, like Pollux's"
    # a second size shows the synchronisation cost, and the prediction at 4 comes down to earth
    refit = fit_step_model(BATCH, measure(TRUTH, [(1, 1), (2, 1)]))
    assert refit.step_time(1, 2, BATCH / 2) == pytest.approx(at_2, rel=1e-3)
    truth_4 = TRUTH.step_time(1, 4, BATCH / 4)
    assert abs(refit.step_time(1, 4, BATCH / 4) - truth_4) < 0.5 * abs(
        fitted.step_time(1, 4, BATCH / 4) - truth_4
    )


def test_each_size_counts_once_however_long_it_ran():
    many = measure(TRUTH, [(1, 1)]) * 50 + measure(TRUTH, [(2, 1), (4, 1)])
    fitted = fit_step_model(BATCH, many)
    assert fitted.step_time(1, 4, BATCH / 4) == pytest.approx(TRUTH.step_time(1, 4, BATCH / 4), rel=0.02)


def test_the_application_answers_like_its_model():
    app = live_application(
        "job-a", TRUTH, BATCH, samples_per_epoch=1000, epochs=3, max_replicas=8, max_hosts=2
    )
    assert app.epoch_progress == (8.0, 16.0, 24.0)  # ceil(1000 / 128) steps an epoch
    for placement in [(1,), (2,), (4,), (2, 2), (3, 3)]:
        n, hosts = sum(placement), len(placement)
        expected = TRUTH.step_time(hosts, n, BATCH / n)
        assert step_time(app, placement, BATCH / n)[0] == pytest.approx(expected)
        per_step = TRUTH.step_time(hosts, n, math.ceil(BATCH / n))  # the simulator splits in whole samples
        assert progress_rate(app, placement, BATCH, 0) == pytest.approx(1 / per_step)
        assert time_to_finish(app, 4.0, placement, BATCH) == pytest.approx(20 * per_step)


def test_the_simulators_policies_allocate_live_jobs():
    cluster = Cluster(num_hosts=1, gpus_per_host=4, cpus_per_host=4)
    fast = live_application("fast", TRUTH, BATCH, 6000, 1, max_replicas=4)
    slow = live_application("slow", StepModel(0.0, 0.002, 0.01, 0.0, 0.0), BATCH, 6000, 2, max_replicas=4)
    views = [live_view(fast, 0.0, 2, steps_done=10, placement=(4,)), live_view(slow, 5.0, 2, 0, None)]
    for name in ("fifo", "tiresias", "pollux", "pcrr"):
        allocations = make_policy(name, SYSTEMS["taiji"]).allocate(10.0, cluster, views)
        assert sum(a.replicas for a in allocations.values()) <= 4, name
        assert all(a.batch_size == BATCH for a in allocations.values()), name
        assert allocations, f"{name} gave nobody a slot"


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigError):
        fit_step_model(BATCH, [])
    with pytest.raises(ConfigError):
        Measured(2, 3, 0.1)
    with pytest.raises(ConfigError):
        live_application("x", TRUTH, 0, 10, 1, 1)


def test_the_simulator_replays_live_jobs_with_their_fitted_applications():
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import LIVE, JobSpec

    apps = {
        name: live_application(name, TRUTH, BATCH, samples_per_epoch=BATCH * steps, epochs=1, max_replicas=2)
        for name, steps in (("a", 100), ("b", 50))
    }
    specs = [JobSpec("a", 0.0, LIVE, 2, BATCH), JobSpec("b", 0.0, LIVE, 2, BATCH)]
    config = SimConfig(
        cluster=Cluster(1, 2, 2), interval_s=1.0, resize=SYSTEMS["taiji"], live=tuple(apps.items())
    )
    result = simulate(specs, make_policy("fifo"), config)
    jct = {r.name: r.jct for r in result.records}
    at_2 = TRUTH.step_time(1, 2, BATCH / 2)
    # FIFO runs a at both slots first (100 steps), then b (its 50 after a's end and the next round)
    assert jct["a"] == pytest.approx(100 * at_2, rel=0.01)
    assert jct["b"] == pytest.approx(math.ceil(100 * at_2) + 50 * at_2, rel=0.05)
    with pytest.raises(ConfigError, match="no Application"):
        simulate(
            [JobSpec("c", 0.0, LIVE, 1, BATCH)], make_policy("fifo"), SimConfig(cluster=Cluster(1, 2, 2))
        )


def test_a_jobs_mean_step_time_per_size_comes_from_its_whole_run_log():
    from taiji.sched.live import logged_step_times

    def row(size, step_s, batch=BATCH):
        return {"size": size, "batch_size": batch, "samples_per_s": batch / step_s}

    rows = [row(1, 0.5)] * 4 + [row(2, 0.2)] * 10 + [row(2, 0.4)] * 10  # beside another job, then alone...
    rows += [row(2, 1.0, batch=2 * BATCH), {"size": 2, "batch_size": BATCH, "samples_per_s": None}]
    got = {m.replicas: m.step_seconds for m in logged_step_times(rows, BATCH)}
    assert got == {1: pytest.approx(0.5), 2: pytest.approx(0.3)}, (
        "the mean over both stretches at 2, not the last"
    )
    assert logged_step_times([], BATCH) == []
