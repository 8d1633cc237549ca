"""taiji.sched.model against rows read by hand from the shipped Pollux traces, and the analytic
forms (goodput, Pollux throughput model, allreduce and parameter-server models) on hand values."""

from __future__ import annotations

import math

import pytest

from taiji.errors import ConfigError
from taiji.monitor.gns import goodput
from taiji.monitor.gns import statistical_efficiency as efficiency
from taiji.sched import model
from taiji.sched.model import (
    AllreduceModel,
    ThroughputParams,
    advance,
    canonical_placement,
    grad_stats,
    load_application,
    pollux_step_time,
    progress_rate,
    step_time,
    time_to_finish,
    trace_efficiency,
)


@pytest.fixture(scope="module")
def cifar10():
    return load_application("cifar10")


def test_every_application_loads_with_the_documented_settings():
    expected = {  # traces README, "Per-application simulator settings"
        "bert": (2, 12, 384, 4, 12),
        "cifar10": (100, 128, 4096, 32, 1024),
        "deepspeech2": (80, 20, 640, 10, 80),
        "imagenet": (90, 200, 12800, 20, 200),
        "ncf": (10, 256, 32768, 32, 32768),
        "yolov3": (50, 8, 512, 4, 8),
    }
    for name, settings in expected.items():
        app = load_application(name)
        assert (
            app.max_epochs,
            app.init_batch_size,
            app.max_batch_size,
            app.min_local_bsz,
            app.max_local_bsz,
        ) == settings
        assert len(app.placements) == 108  # 4 + 10 + 24 + 70 necklaces
        assert len(app.epoch_progress) == app.max_epochs
    assert load_application("ncf").max_replicas == 1


def test_step_times_are_the_measured_rows(cifar10):
    # cifar10/placements.csv: "1,32,0.0427886962890625,0.0004995360016822816"
    assert step_time(cifar10, (1,), 32) == (0.0427886962890625, 0.0004995360016822816)
    # "44,129,0.23087265491485595,0.12566536407470702", on any two hosts
    assert step_time(cifar10, (0, 4, 0, 4), 129) == (0.23087265491485595, 0.12566536407470702)
    # "112,32,0.14785358905792237,0.10531877822875976": node order is cyclic
    for placement in ((1, 1, 2), (1, 2, 1), (2, 1, 1), (0, 2, 0, 1, 1)):
        assert step_time(cifar10, placement, 32) == (0.14785358905792237, 0.10531877822875976)
    # cifar10/scalability.csv: "6,6,32,0.14090566635131835,0.09941204528808593"
    assert step_time(cifar10, (1,) * 6, 32) == (0.14090566635131835, 0.09941204528808593)


def test_step_time_interpolates_in_batch_and_clamps(cifar10):
    # "1,45,0.05048525333404541,..." is the next row after local_bsz 32
    middle = step_time(cifar10, (1,), 38.5)[0]
    assert middle == pytest.approx((0.0427886962890625 + 0.05048525333404541) / 2)
    assert step_time(cifar10, (1,), 1) == step_time(cifar10, (1,), 32)


def test_unmeasured_spreads_interpolate_between_measured_node_counts(cifar10):
    # 7 nodes x 16 replicas is unmeasured; 6 and 8 nodes both measured 16 replicas (scalability.csv)
    six, eight = step_time(cifar10, (4, 4, 2, 2, 2, 2), 256), step_time(cifar10, (2,) * 8, 256)
    seven = step_time(cifar10, (4, 4, 2, 2, 2, 1, 1), 256)
    assert seven == pytest.approx(tuple((a + b) / 2 for a, b in zip(six, eight)))
    # 5 nodes x 20 replicas: no measured spread of <= 5 nodes has 20 replicas, so 6 nodes' value
    assert step_time(cifar10, (4,) * 5, 256) == step_time(cifar10, (4, 4, 4, 4, 2, 2), 256)
    # 20 nodes are read as 16 (the widest measured)
    assert step_time(cifar10, (1,) * 20 + (0,), 256) == pytest.approx(
        model.spread_step_time(cifar10, 16, 20, 256)
    )


def test_canonical_placement_rotates_and_drops_empty_hosts():
    assert canonical_placement((0, 2, 1, 0, 1)) == (1, 1, 2)
    assert canonical_placement((3, 4, 3, 4)) == (3, 4, 3, 4)
    assert canonical_placement((3, 3, 4, 4)) == (3, 3, 4, 4)  # cyclic, not sorted
    with pytest.raises(ConfigError):
        canonical_placement((0, 0))


def test_statistical_efficiency_from_the_validation_rows(cifar10):
    # validation-128.csv row 1: grad_sqr 8.947307535897329, grad_var 5.066593295150894
    assert grad_stats(cifar10, 128, 0) == (8.947307535897329, 5.066593295150894)
    assert trace_efficiency(cifar10, 128, 0) == pytest.approx(1.0)
    # validation-4096.csv row 1: grad_sqr 14.297054109491588, grad_var 11.815138409160218
    phi = 128 * 11.815138409160218 / 14.297054109491588
    assert trace_efficiency(cifar10, 4096, 0) == pytest.approx((phi + 128) / (phi + 4096))
    # halfway between the 2048 and 4096 runs, the statistics are averaged
    sqr, var = grad_stats(cifar10, 3072, 0)
    assert sqr == pytest.approx((10.73321269096998 + 14.297054109491588) / 2)
    assert var == pytest.approx((5.4859538034431825 + 11.815138409160218) / 2)
    # epoch 1 ends at the smallest progress over the runs (validation-256.csv: 390.714...)
    assert cifar10.epoch_progress[0] == 390.71438596642224


def test_goodput_formula():
    assert efficiency(noise_scale=1000.0, init_batch=100.0, batch=100.0) == 1.0
    assert efficiency(1000.0, 100.0, 1100.0) == pytest.approx(1100 / 2100)
    assert goodput(400.0, 1000.0, 100.0, 1100.0) == pytest.approx(400 * 1100 / 2100)


def test_progress_rate_counts_accumulation_and_batch_gain():
    yolo = load_application("yolov3")
    config = yolo.batch_config(4, 64)  # 16 per GPU > 8: one accumulation step of 8
    assert (config.atomic_bsz, config.accum_steps, config.total) == (8, 1, 64)
    step, sync = step_time(yolo, (4,), 8)
    gain = (64 / 8) * trace_efficiency(yolo, 64, 0)
    assert progress_rate(yolo, (4,), 64, 0) == pytest.approx(gain / (step + (step - sync)))


def test_one_gpu_accumulates_above_the_initial_batch():
    """Pollux's rule: ncf's 32768 on one GPU runs as two micro-steps of 16384, not one of 32768."""
    ncf = load_application("ncf")
    config = ncf.batch_config(1, 32768)
    assert (config.atomic_bsz, config.accum_steps, config.total) == (16384, 1, 32768)
    step, sync = step_time(ncf, (1,), 16384)
    gain = (32768 / 256) * trace_efficiency(ncf, 32768, 0)
    assert progress_rate(ncf, (1,), 32768, 0) == pytest.approx(gain / (step + (step - sync)))
    assert ncf.batch_config(1, ncf.init_batch_size).accum_steps == 0  # the initial batch: no accumulation
    assert ncf.batch_config(2, 32768).accum_steps == 0  # the rule is for one GPU only


def test_per_gpu_batch_is_capped_by_the_largest_batch():
    """bert at 384 on 6 GPUs: 64 per GPU > 12 → 6 micro-steps; 11 per micro-step would make 396 > 384,
    so the per-GPU batch is capped at 384 // 36 = 10 and the job trains 360."""
    bert = load_application("bert")
    config = bert.batch_config(6, 384)
    assert (config.atomic_bsz, config.accum_steps, config.total) == (10, 5, 360)
    assert bert.batch_config(8, 384).total == 384  # 48 per GPU = 4 × 12: no cap needed


def test_advance_and_time_to_finish_agree(cifar10):
    placement, batch = (4, 2), 2048
    total = time_to_finish(cifar10, 0.0, placement, batch)
    assert advance(cifar10, 0.0, total, placement, batch) == pytest.approx(cifar10.target_progress)
    assert advance(cifar10, 0.0, 10 * total, placement, batch) == cifar10.target_progress
    half = advance(cifar10, 0.0, total / 2, placement, batch)
    assert advance(cifar10, half, total / 4, placement, batch) == pytest.approx(
        advance(cifar10, 0.0, 3 * total / 4, placement, batch)
    )
    assert time_to_finish(cifar10, half, placement, batch) == pytest.approx(total / 2)
    assert time_to_finish(cifar10, cifar10.target_progress, placement, batch) == 0.0


def test_pollux_throughput_model_by_hand():
    params = ThroughputParams(
        alpha_c=0.1, beta_c=0.01, alpha_n=0.2, beta_n=0.05, alpha_r=0.05, beta_r=0.01, gamma=1.0
    )
    assert pollux_step_time(params, 1, 1, 10) == pytest.approx(0.2)  # compute only
    assert pollux_step_time(params, 1, 4, 10) == pytest.approx(0.2 + 0.05 + 0.02)
    assert pollux_step_time(params, 2, 4, 10) == pytest.approx(0.2 + 0.2 + 0.1)
    assert pollux_step_time(params, 2, 4, 10, accum_steps=2) == pytest.approx(0.4 + 0.5)
    overlapped = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.05, 0.01, gamma=2.0)
    assert pollux_step_time(overlapped, 2, 4, 10) == pytest.approx(math.hypot(0.2, 0.3))
    with pytest.raises(ConfigError):
        ThroughputParams(0, 0, 0, 0, 0, 0, gamma=0.5)


def test_allreduce_and_parameter_server_models_by_hand():
    compute = ThroughputParams(0.1, 0.0, 0.0, 0.0, 0.0, 0.0, gamma=1.0)
    job = AllreduceModel(compute, grad_bytes=1e8, bw_intra=1e10, bw_inter=1e9)
    assert job.step_time(1, 1, 32) == pytest.approx(0.1)
    assert job.step_time(1, 4, 32) == pytest.approx(0.1 + 1.5 * 1e8 / 1e10)
    assert job.step_time(2, 4, 32) == pytest.approx(0.1 + 1.5 * 1e8 / 1e9)
    assert job.step_time(2, 4, 32, contention=2) == pytest.approx(0.1 + 2 * 1.5 * 1e8 / 1e9)
    assert model.ps_sample_time(0.5, 100e6, 1e9) == pytest.approx(0.7)


def test_unknown_application_is_named():
    with pytest.raises(ConfigError, match="unknown application 'gpt5'"):
        load_application("gpt5")
