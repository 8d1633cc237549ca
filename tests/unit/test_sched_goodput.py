"""Goodput-aware live targets (pure): a job's batch and gradient noise scale read from its run log
(taiji/sched/goodput.py, metrics/runlog.read_jsonl_ends), the goodput model the live scheduler builds
from them (sched/live.py) and what the policies then decide."""

import json

import pytest

from taiji.errors import ConfigError
from taiji.metrics.runlog import read_jsonl_ends
from taiji.sched.cluster import Cluster
from taiji.sched.costs import SYSTEMS
from taiji.sched.goodput import BatchStats, batch_range, batch_stats
from taiji.sched.live import StepModel, live_application, live_view
from taiji.sched.livejob import Observed
from taiji.sched.model import progress_rate, trace_efficiency
from taiji.sched.policies import make_policy
from taiji.sched.scheduler import Scheduler

COMPUTE = StepModel(
    compute_fixed=0.0, compute_per_sample=0.001, sync_fixed=0.0, sync_per_worker=0.0, cross_host=0.0
)


def row(step, batch, gns=None, **more):
    return {"step": step, "batch_size": batch, "samples": batch, "gns": gns, **more}


# -- reading the run log ------------------------------------------------------------------------


def test_a_run_log_without_a_noise_scale_yet_means_efficiency_one():
    stats = batch_stats([row(1, 64)], [row(1, 64), row(2, 64, grad_sqnorm=None, trace_sigma=None)])
    assert stats == BatchStats(64, 64, 64, None)
    app = live_application(
        "j", COMPUTE, 64, 6400, 1, max_replicas=4, init_batch=64, max_batch=512, noise_scale=stats.noise_scale
    )
    for batch in (64, 128, 512):
        assert trace_efficiency(app, batch, 0) == pytest.approx(1.0)


def test_the_latest_noise_scale_is_read_and_a_row_without_gns_falls_back_to_its_moving_averages():
    assert batch_stats([], [row(5, 64, gns=100.0), row(6, 64, gns=300.0)]).noise_scale == 300.0
    fallback = [row(5, 64, gns=100.0), row(6, 64, gns=None, trace_sigma=50.0, grad_sqnorm=0.25)]
    assert batch_stats([], fallback).noise_scale == 200.0
    # nonsense values are no estimate: the last good one stands
    assert (
        batch_stats(
            [], [row(5, 64, gns=100.0), row(6, 64, gns=-3.0), row(7, 64, gns=float("nan"))]
        ).noise_scale
        == 100.0
    )
    assert batch_stats([], [{"step": 1, "kind": "foreign"}]) is None


def test_a_torn_line_is_skipped_and_the_ends_of_a_long_log_are_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(row(i, 64 if i < 500 else 128, gns=float(i))) for i in range(1, 1000)]
    lines.insert(600, '{"step": 600, "batch_si')  # a crash mid-write, then the next writer's lines
    path.write_text("\n".join(lines) + '\n{"step": 1000, "batc')  # and a torn last line
    first, latest = read_jsonl_ends(path, head_bytes=300, tail_bytes=2000)
    assert first and first[0]["step"] == 1 and all(r["step"] < 10 for r in first)
    assert latest[-1]["step"] == 999 and len(latest) < 40
    stats = batch_stats(first, latest)
    assert stats == BatchStats(init_batch=64, batch=128, largest=128, noise_scale=999.0)
    whole_first, whole_latest = read_jsonl_ends(path)  # head and tail overlap on a short read: harmless
    assert batch_stats(whole_first, whole_latest).init_batch == 64
    assert read_jsonl_ends(tmp_path / "missing.jsonl") == ([], [])


def test_which_jobs_adapt_their_batch():
    changed = BatchStats(init_batch=64, batch=256, largest=256, noise_scale=50.0)
    assert batch_range(changed, 256) == (64, 256)  # its log shows it changed: it adapts
    assert batch_range(changed, 256, max_batch=1024) == (64, 1024)
    fixed = BatchStats(init_batch=64, batch=64, largest=64, noise_scale=50.0)
    assert batch_range(fixed, 64) == (64, 64)  # neither said nor seen: it keeps its batch
    assert batch_range(fixed, 64, max_batch=512) == (64, 512)  # submit --max-batch: before it moves
    assert batch_range(None, 128, max_batch=512) == (128, 512)  # nothing read yet
    assert batch_range(None, 128) == (128, 128)


# -- the goodput model ----------------------------------------------------------------------------


def test_the_live_model_sees_the_statistical_efficiency_of_its_noise_scale():
    phi, b0 = 200.0, 64
    app = live_application(
        "j", COMPUTE, 64, 6400, 2, max_replicas=8, init_batch=b0, max_batch=512, noise_scale=phi
    )
    assert (app.init_batch_size, app.max_batch_size, app.fixed_batch_size) == (64, 512, None)
    assert app.target_progress == 2 * 100  # steps at B0
    for batch in (64, 128, 512):
        assert trace_efficiency(app, batch, 1) == pytest.approx((phi + b0) / (phi + batch))
    # goodput = throughput x efficiency, in steps at B0 per second: on 4 workers at B = 256,
    # one step takes 0.001 * 64 s and makes (256/64) * E(256) steps' worth
    assert progress_rate(app, (4,), 256, 0) == pytest.approx(4 * (phi + b0) / (phi + 256) / 0.064)
    # a job that keeps its batch: efficiency 1 whatever its noise scale, one unit = one of its steps
    fixed = live_application("k", COMPUTE, 128, 6400, 1, max_replicas=8, noise_scale=1.0)
    assert fixed.fixed_batch_size == 128 and trace_efficiency(fixed, 128, 0) == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        live_application("bad", COMPUTE, 64, 6400, 1, max_replicas=4, noise_scale=0.0)


def grow_test_views(noise_a: float, noise_b: float):
    # Each worker holds at least 64 samples, so n workers train a batch >= 64n: the extra workers of a
    # job whose noise scale is small gain it almost nothing (efficiency ~1/n), a noisy job's scale.
    views = []
    for name, noise in (("a", noise_a), ("b", noise_b)):
        app = live_application(
            name,
            COMPUTE,
            64,
            640_000,
            1,
            max_replicas=8,
            min_local_bsz=64,
            init_batch=64,
            max_batch=512,
            noise_scale=noise,
        )
        # (profiled up to 4 workers: Pollux-like trusts its model up to twice that)
        views.append(live_view(app, 0.0, 1, steps_done=0, placement=None, peak_replicas=4))
    return views


@pytest.mark.parametrize("policy", ["pollux", "pcrr"])
def test_goodput_policies_give_the_workers_to_the_job_whose_noise_lets_it_use_them(policy):
    cluster = Cluster(num_hosts=1, gpus_per_host=8, cpus_per_host=8)
    for quiet, noisy in (("a", "b"), ("b", "a")):
        noises = {quiet: 1.0, noisy: 1e6}
        given = make_policy(policy, SYSTEMS["taiji"]).allocate(
            0.0, cluster, grow_test_views(noises["a"], noises["b"])
        )
        assert given[noisy].replicas > given[quiet].replicas, (policy, given)
        assert given[noisy].batch_size > 64  # and it trains a larger batch there


# -- the live scheduler -----------------------------------------------------------------------


def test_the_scheduler_builds_each_jobs_goodput_view_from_its_run_log():
    sched = Scheduler(slots=4, policy=make_policy("pcrr", SYSTEMS["taiji"]))
    adapts = sched.submit(0.0, ["train"], max_np=4, max_batch=512)
    keeps = sched.submit(0.0, ["train"], max_np=4)
    for job in (adapts, keeps):
        sched.launched(1.0, job.id)
        sched.observe(
            2.0,
            job.id,
            Observed(
                size=2, version=1, step=10, batch_size=64, position=640, end=64_000, samples_per_s=1000.0
            ),
        )
        sched.read_run_log(job.id, BatchStats(64, 64, 64, 300.0))
    sched.read_run_log(adapts.id, None)  # an unreadable log changes nothing
    view = sched.view_of(adapts, 3.0)
    assert (view.app.init_batch_size, view.app.max_batch_size, view.app.fixed_batch_size) == (64, 512, None)
    assert view.progress == pytest.approx(10.0) and view.suspend_cost_s == pytest.approx(
        1.0
    )  # its boot (launched at 1 s, first step at 2 s)
    assert trace_efficiency(view.app, 256, 0) == pytest.approx((300 + 64) / (300 + 256))
    assert sched.view_of(keeps, 3.0).app.fixed_batch_size == 64
    # its batch moved (the job's own goodput policy): B0 stays, the new batch's step times are a new model
    sched.observe(
        4.0,
        adapts.id,
        Observed(size=2, version=1, step=20, batch_size=256, position=3200, end=64_000, samples_per_s=2000.0),
    )
    sched.read_run_log(adapts.id, BatchStats(64, 256, 256, 400.0))
    assert adapts.measurements()[0].step_seconds == pytest.approx(256 / 2000.0)
    view = sched.view_of(adapts, 5.0)
    assert view.progress == pytest.approx(3200 / 64) and view.allocation.batch_size == 256
    assert trace_efficiency(view.app, 256, 0) == pytest.approx((400 + 64) / (400 + 256))
    # the state survives a restarted daemon
    again = Scheduler(slots=4, policy=make_policy("pcrr", SYSTEMS["taiji"]))
    again.load_json(json.loads(json.dumps(sched.to_json())))
    assert again.jobs[adapts.id].stats() == adapts.stats() == BatchStats(64, 256, 256, 400.0)
    assert again.view_of(again.jobs[adapts.id], 5.0).app.max_batch_size == 512


def test_submit_takes_the_batch_bound_of_a_job_that_adapts_its_batch():
    from taiji.launch.sched.cli import build_parser

    args = build_parser().parse_args(["submit", "--max-batch", "1024", "--", "python", "train.py"])
    assert args.max_batch == 1024
    assert build_parser().parse_args(["submit", "--", "python", "train.py"]).max_batch == 0
    with pytest.raises(ConfigError, match="max_batch"):
        Scheduler(slots=4, policy=make_policy("fifo")).submit(0.0, ["train"], max_batch=-1)
