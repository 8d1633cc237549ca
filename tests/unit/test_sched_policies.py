"""Each baseline's defining behaviour (FIFO head-of-line blocking, LAS demotion, DRF equal shares,
Optimus marginal gain, SRTF order, Pollux-like goodput and restart factor), placement helpers, and
the fidelity check on Pollux's workload 6 (published average JCT: Pollux 2446 s, Tiresias 3470 s,
Optimus 5302 s; docs/reference/scheduler-model.md#pollux)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation, Cluster, most_free_first, pack, packed_shape, place_all
from taiji.sched.fidelity import fidelity, main
from taiji.sched.model import load_application, progress_rate, time_to_finish
from taiji.sched.policies import (
    ElasticDrf,
    Fifo,
    OptimusOracle,
    PolluxLike,
    SrtfOracle,
    Tiresias,
    make_policy,
)
from taiji.sched.policies.drf import fair_counts
from taiji.sched.policies.tiresias import predicted_service, workload_threshold
from taiji.sched.policy import JobView
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import JobSpec


def view(
    name: str,
    app: str,
    submit: float,
    replicas: int,
    batch: int,
    *,
    placement=None,
    attained: float = 0.0,
    progress: float = 0.0,
) -> JobView:
    allocation = None if placement is None else Allocation(placement, batch)
    return JobView(
        JobSpec(name, submit, app, replicas, batch), load_application(app), progress, attained, allocation, 0
    )


def counts(answer) -> dict[str, int]:
    return {name: allocation.replicas for name, allocation in answer.items()}


def test_fifo_blocks_behind_the_head_while_las_backfills():
    one_host = Cluster(1, 4)
    jobs = [
        view("a", "cifar10", 0, 3, 2048, placement=(3,)),
        view("b", "cifar10", 1, 2, 2048),
        view("c", "ncf", 2, 1, 32768),
    ]
    assert counts(Fifo().allocate(0, one_host, jobs)) == {"a": 3}  # c would fit
    assert counts(Tiresias().allocate(0, one_host, jobs)) == {"a": 3, "c": 1}


def test_fifo_never_preempts_and_keeps_hosts():
    cluster = Cluster(2, 4)
    jobs = [view("a", "cifar10", 0, 2, 2048, placement=(0, 2)), view("b", "cifar10", 1, 6, 2048)]
    answer = Fifo().allocate(0, cluster, jobs)
    assert answer["a"].placement == (0, 2) and answer["b"].placement == (4, 2)


def test_las_demotes_a_job_past_sixteen_gpu_hours():
    one_host = Cluster(1, 4)
    sixteen_gpu_hours = 16 * 3600.0
    for attained, winner in ((sixteen_gpu_hours - 1, "old"), (sixteen_gpu_hours, "new")):
        jobs = [
            view("old", "cifar10", 0, 4, 2048, placement=(4,), attained=attained),
            view("new", "cifar10", 50, 4, 2048),
        ]
        assert set(Tiresias().allocate(0, one_host, jobs)) == {winner}


def test_las_threshold_from_the_workload_is_the_median_predicted_size():
    one_host = Cluster(1, 4)
    cifar10 = load_application("cifar10")
    size = predicted_service(view("x", "cifar10", 0, 4, 2048))
    assert size == pytest.approx(
        cifar10.target_progress / progress_rate(cifar10, (1,), cifar10.init_batch_size, 0)
    )
    assert workload_threshold([3.0, 1.0, 2.0]) == 2.0 and workload_threshold([4.0, 1.0]) == 1.0, (
        "the lower median"
    )
    # a long job holds the host when a shorter one arrives: with the lower median of the two sizes (the
    # short one's) as the threshold, the long job is demoted once it had that much service
    auto = make_policy("tiresias", las_threshold="auto")
    assert auto.threshold_gpu_s is None
    short = predicted_service(view("s", "ncf", 0, 4, 32768))
    assert short < size
    for attained, winner in ((0.9 * short, "long"), (1.1 * short, "short")):
        jobs = [
            view("long", "cifar10", 0, 4, 2048, placement=(4,), attained=attained),
            view("short", "ncf", 50, 4, 32768),
        ]
        assert set(auto.allocate(0, one_host, jobs)) == {winner}
        assert auto.threshold_now == pytest.approx(short)
    # the sizes of jobs that ended still count (the last SIZE_WINDOW jobs seen)
    alone = [view("long", "cifar10", 0, 4, 2048, placement=(4,), attained=1.1 * short)]
    assert set(auto.allocate(0, one_host, alone)) == {"long"} and "short" in auto.sizes


def test_las_preempts_in_simulation_once_the_running_job_is_demoted():
    threshold = 4 * 600.0  # 4 GPUs for 600 s
    cifar10 = load_application("cifar10")
    assert time_to_finish(cifar10, 0.0, (4,), 2048) > 1200  # still running when demoted
    jobs = [JobSpec("old", 0.0, "cifar10", 4, 2048), JobSpec("new", 100.0, "cifar10", 4, 2048)]
    result = simulate(jobs, Tiresias(threshold_gpu_s=threshold), SimConfig(Cluster(1, 4)))
    old, new = result.records
    assert old.start_time == 0.0 and new.start_time == 600.0  # the round where 4·600 >= 2400
    # at 1200 s "new" is demoted too; FIFO inside the low queue gives "old" back its GPUs
    assert old.restarts == new.restarts == 2 and old.end_time < new.end_time


def test_drf_gives_equal_shares_within_each_jobs_cap():
    cluster = Cluster(2, 4)
    two = [view("a", "cifar10", 0, 6, 2048), view("b", "cifar10", 1, 6, 2048)]
    assert counts(ElasticDrf().allocate(0, cluster, two)) == {"a": 4, "b": 4}
    three = two + [view("c", "cifar10", 2, 6, 2048)]
    assert counts(ElasticDrf().allocate(0, cluster, three)) == {"a": 3, "b": 3, "c": 2}
    capped = [view("n", "ncf", 0, 1, 32768), view("a", "cifar10", 1, 6, 2048)]  # ncf: at most 1
    assert counts(ElasticDrf().allocate(0, cluster, capped)) == {"n": 1, "a": 7}
    assert fair_counts(5, [1, 10, 10]) == [1, 2, 2]


def test_optimus_starts_everyone_at_one_gpu_then_follows_marginal_gain():
    cluster = Cluster(2, 4)
    cifar10 = load_application("cifar10")
    jobs = [
        view("nearly-done", "cifar10", 0, 6, 2048, progress=0.99 * cifar10.target_progress),
        view("fresh", "cifar10", 1, 6, 2048),
        view("ncf", "ncf", 2, 1, 32768),
    ]
    answer = counts(OptimusOracle().allocate(0, cluster, jobs))
    assert answer["ncf"] == 1 and answer["nearly-done"] >= 1
    assert answer["fresh"] > answer["nearly-done"] and sum(answer.values()) <= 8
    crowded = [view(f"j{i}", "cifar10", i, 6, 2048) for i in range(3)]
    assert counts(OptimusOracle().allocate(0, Cluster(1, 2), crowded)) == {"j0": 1, "j1": 1}


def test_srtf_runs_the_shortest_remaining_job_first():
    cifar10 = load_application("cifar10")
    jobs = [
        view("long", "cifar10", 0, 4, 2048, placement=(4,)),
        view("short", "cifar10", 10, 4, 2048, progress=0.9 * cifar10.target_progress),
    ]
    assert set(SrtfOracle().allocate(0, Cluster(1, 4), jobs)) == {"short"}


def test_packing_uses_few_hosts_and_keeps_running_jobs_in_place():
    assert pack([4, 4, 2], 2) == (0, 0, 2)  # best fit
    assert pack([4, 4, 2], 6) == (4, 0, 2)  # emptiest first, rest on the tightest host
    assert pack([1, 1], 3) is None
    assert packed_shape(10, 4) == (4, 4, 2)
    cluster = Cluster(2, 4)
    current = {"a": Allocation((0, 3), 64)}
    placed = place_all(cluster, [("b", 4, 64), ("a", 3, 64)], current)
    assert placed["a"].placement == (0, 3) and placed["b"].placement == (4, 0)
    with pytest.raises(ConfigError):
        make_policy("lottery")
    # the live daemon's --las-threshold and a replay of its run build the same Tiresias
    assert make_policy("tiresias", las_threshold=60.0) == Tiresias(threshold_gpu_s=60.0)
    assert make_policy("tiresias").threshold_gpu_s == Tiresias().threshold_gpu_s != 60.0
    for name, threshold in (("pcrr", 60.0), ("tiresias", 0.0), ("tiresias", "never"), ("pcrr", "auto")):
        with pytest.raises(ConfigError):
            make_policy(name, las_threshold=threshold)
    assert Cluster.parse("16x4") == Cluster(16, 4)
    with pytest.raises(ConfigError):
        Cluster.parse("sixteen")


def test_fidelity_on_pollux_workload_6():
    """Job by job against the artifact's published JCTs (16 x 4 GPUs, 60 s rounds, 30 s restarts):
    Tiresias and Optimus in the pollux fidelity mode agree per job, not only on average."""
    report = fidelity(["tiresias", "optimus"], [6])
    assert {name: row["published"] for name, row in report.items()} == {"tiresias": 3469.7, "optimus": 5301.9}
    for row in report.values():
        assert row["jobs"] == 160 and row["mode"] == "pollux"
        assert row["mean_abs_log_ratio"] <= 0.05 and row["within_25pct"] >= 0.9
        for key in ("deviation", "p99_deviation", "makespan_deviation"):
            assert abs(row[key]) <= 0.03, (key, row[key])
        assert row["per_workload"][6]["avg_jct_s"] == row["ours"]


def test_pollux_mode_places_on_the_emptiest_hosts_first():
    assert most_free_first([4, 4, 2], 2) == (2, 0, 0)  # pack: (0, 0, 2), best fit
    assert most_free_first([1, 3, 2], 4) == (0, 3, 1)
    assert most_free_first([1, 1], 3) is None
    cluster = Cluster(2, 4)
    jobs = [view("running", "cifar10", 0, 2, 2048, placement=(0, 2)), view("new", "cifar10", 1, 2, 2048)]
    assert Tiresias().allocate(0, cluster, jobs)["new"].placement == (0, 2)
    assert Tiresias(fidelity="pollux").allocate(0, cluster, jobs)["new"].placement == (2, 0)
    with pytest.raises(ConfigError):
        make_policy("tiresias", fidelity="exact")


def test_pollux_mode_orders_the_demoted_queue_by_demotion():
    """ "late" is demoted a round before "early": Pollux's queue runs it first, taiji's runs the
    earlier submission."""
    threshold = 16 * 3600.0
    first = [
        view("early", "cifar10", 0, 4, 2048, attained=threshold - 60),
        view("late", "cifar10", 10, 4, 2048, placement=(4,), attained=threshold),
    ]
    second = [replace(first[0], attained_gpu_s=threshold), replace(first[1], allocation=None)]
    for mode, winner in (("pollux", "late"), ("taiji", "early")):
        policy = Tiresias(fidelity=mode)
        policy.allocate(0, Cluster(1, 4), first)
        assert set(policy.allocate(60, Cluster(1, 4), second)) == {winner}


def test_pollux_mode_ranks_optimus_gpus_by_trace_iterations():
    """Pollux's gain counts the iterations left after the current epoch (1 in the last epoch), so
    the job in its last epoch stays at one GPU; taiji's exact remaining time gives it a second."""
    cifar10 = load_application("cifar10")
    ends = cifar10.epoch_progress
    jobs = [
        view("last", "cifar10", 0, 6, 2048, progress=ends[98] + 1e-6),
        view("two", "cifar10", 1, 6, 2048, progress=0.5 * (ends[97] + ends[98])),
    ]
    assert counts(OptimusOracle().allocate(0, Cluster(1, 4), jobs)) == {"last": 2, "two": 2}
    assert counts(OptimusOracle(fidelity="pollux").allocate(0, Cluster(1, 4), jobs)) == {"last": 1, "two": 3}
    # fewest GPUs placed first, each on the emptiest hosts
    placed = OptimusOracle(fidelity="pollux").allocate(0, Cluster(2, 4), jobs)
    assert (placed["last"].placement, placed["two"].placement) == ((2, 0), (2, 4))


def test_pollux_like_picks_the_goodput_best_batch_and_grows_gradually():
    cifar10 = load_application("cifar10")
    big = Cluster(4, 4)
    fresh = [view("a", "cifar10", 0, 6, 2048)]
    answer = PolluxLike().allocate(0, big, fresh)["a"]
    assert answer.replicas <= 2  # at most twice what was profiled (nothing: 1)
    assert cifar10.init_batch_size <= answer.batch_size <= cifar10.max_batch_size
    shape = packed_shape(answer.replicas, 4)
    assert progress_rate(cifar10, shape, answer.batch_size, 0) >= progress_rate(
        cifar10, shape, cifar10.init_batch_size, 0
    )
    ncf = PolluxLike().allocate(0, big, [view("n", "ncf", 0, 1, 32768)])["n"]
    assert (ncf.replicas, ncf.batch_size) == (1, 32768)  # ncf: fixed batch, one replica


def test_pollux_like_gives_every_job_a_gpu_before_growing_any():
    jobs = [view(f"j{i}", "cifar10", i, 6, 2048) for i in range(3)]
    assert counts(PolluxLike().allocate(0, Cluster(1, 2), jobs)) == {"j0": 1, "j1": 1}
    assert all(count >= 1 for count in counts(PolluxLike().allocate(0, Cluster(1, 4), jobs)).values())


def test_pollux_like_restart_factor_holds_back_young_jobs():
    running = replace(view("a", "cifar10", 0, 6, 2048, placement=(2, 0, 0, 0)), restarts=1, peak_replicas=2)
    young = PolluxLike().allocate(10.0, Cluster(4, 4), [running])["a"]  # factor max(10-30,0)/40 = 0
    old = PolluxLike().allocate(10000.0, Cluster(4, 4), [running])["a"]  # factor ~0.994
    assert young.placement == (2, 0, 0, 0) and old.replicas == 4


def test_fidelity_command_line_prints_the_table(capsys):
    assert main(["--workloads", "6", "--policies", "tiresias"]) == 0
    out = capsys.readouterr().out
    assert "tiresias  w6: per job mean |ln ratio|" in out and '"published": 3469.7' in out
    with pytest.raises(ConfigError):
        fidelity(["tiresias"], [9])
    with pytest.raises(ConfigError):
        fidelity(["fifo"], [6])
