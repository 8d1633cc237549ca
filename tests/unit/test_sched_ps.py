"""Parameter-server jobs in the scheduler simulator: speed model with locality, mixed workloads,
server CPU capacity, and the estimation-error option (issue 11)."""

from __future__ import annotations

import dataclasses

import pytest

from taiji.sched import ps
from taiji.sched.cluster import Allocation, Cluster, PolicyError, place_servers
from taiji.sched.model import time_to_finish
from taiji.sched.policies import make_policy
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import JobSpec, mixed_workload

TOY = ps.PsModelSpec(
    "toy",
    batch_time_s=0.5,
    size_mb=100.0,
    batches_per_epoch=10,
    inter_mb_s=1.0,
    intra_mb_s=1.0,
    worker_cpus=1,
    worker_gpus=1,
    server_cpus=2,
)


def test_paper_model_by_hand_internal_beats_external_and_ties_at_ratio_one():
    settings = ps.PsSettings(bw_intra_mb_s=1000.0, bw_inter_mb_s=250.0)
    # 2 workers + 1 server on host 0: θ = 0.5 + 2·100 MB / 1000 MB/s = 0.7 s → 2/0.7 batches/s
    internal = ps.paper_rate(TOY, settings, (2, 0), (1, 0))
    assert internal == pytest.approx(2 / 0.7)
    # workers split over two hosts: θ = 0.5 + 200/250 = 1.3 s
    external = ps.paper_rate(TOY, settings, (1, 1), (1, 0))
    assert external == pytest.approx(2 / 1.3)
    # workers together but the server elsewhere is external too
    assert ps.paper_rate(TOY, settings, (2, 0), (0, 1)) == pytest.approx(external)
    assert internal > external
    equal = settings.with_ratio(1.0)
    assert ps.paper_rate(TOY, equal, (2, 0), (1, 0)) == pytest.approx(
        ps.paper_rate(TOY, equal, (1, 1), (1, 0))
    )


def test_dl2_model_by_hand():
    settings = ps.PsSettings(model="dl2", bw_intra_mb_s=1000.0, bw_inter_mb_s=500.0)
    # all on host 0: intra = 1000/max(1, 2) = 500, inter = 500 → 0.5 + 2·100/500 = 0.9 s per iteration
    assert ps.dl2_rate(TOY, settings, (2, 0), (1, 0)) == pytest.approx(2 / 0.9)
    # one worker per host, server on host 0: host 1's worker has inter = min(500/1, 500/(2−1)) = 500,
    # intra = 1000/1 → both workers 0.5 + 200/500 = 0.9 s; the same here, so equal
    assert ps.dl2_rate(TOY, settings, (1, 1), (1, 0)) == pytest.approx(2 / 0.9)
    # three hosts, server on host 0: hosts 1 and 2 share the NIC, inter = min(500/1, 500/(3−1)) = 250
    # → 0.5 + 200/250 = 1.3 s for them (host 0: 0.9 s); the slowest paces the job
    assert ps.dl2_rate(TOY, settings, (1, 1, 1), (1, 0, 0)) == pytest.approx(3 / 1.3)


def test_ps_application_integrates_exactly_and_dispatches_from_model():
    app = ps.ps_application("resnet-50", epochs=3, batch_size=32, settings=ps.PsSettings())
    assert app.target_progress == 3 * 115
    seconds = time_to_finish(app, 0.0, (4, 0), 32, (1, 0))
    assert seconds == pytest.approx(app.target_progress / app.rate((4, 0), (1, 0)))
    assert app.advance(0.0, seconds, (4, 0), (1, 0)) == pytest.approx(app.target_progress)
    assert app.servers_for(4) == 1 and app.servers_for(5) == 2 and app.server_cpus == 3


def test_mixed_workload_is_seeded_and_has_both_kinds():
    first = mixed_workload(7, num_jobs=40, duration_s=3600.0)
    assert first == mixed_workload(7, num_jobs=40, duration_s=3600.0)
    assert first != mixed_workload(8, num_jobs=40, duration_s=3600.0)
    kinds = {job.is_ps for job in first}
    assert kinds == {True, False}
    assert all(job.application in ps.PS_MODELS and job.epochs > 0 for job in first if job.is_ps)
    assert [job.submit_time for job in first] == sorted(job.submit_time for job in first)
    assert all(job.is_ps for job in mixed_workload(1, num_jobs=10, ps_fraction=1.0))


def test_place_servers_prefers_the_workers_host_and_respects_cpus():
    assert place_servers([4, 4], (2, 0), 1, 3) == (1, 0)
    assert place_servers([2, 4], (2, 0), 1, 3) == (0, 1)  # no room beside the workers: external
    assert place_servers([6, 6, 6], (2, 2, 0), 2, 3) == (1, 1, 0)
    assert place_servers([2, 2], (2, 0), 1, 3) is None


def test_cluster_check_counts_server_cpus():
    cluster = Cluster(2, 4, cpus_per_host=4)
    fits = {"a": Allocation((2, 0), 1, (1, 0), 3)}
    cluster.check(fits, ["a", "b"])
    over = dict(fits, b=Allocation((2, 0), 1, (1, 0), 3))
    with pytest.raises(PolicyError, match="server CPUs"):
        cluster.check(over, ["a", "b"])


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "optimus", "drf", "srtf", "pollux", "pcrr"])
def test_capacity_never_exceeded_with_ps_jobs(policy):
    """Hosts with CPUs for one 3-CPU server each: every policy's answer passes the simulator's check
    (GPUs and server CPUs) and every PS allocation carries its servers."""
    cluster = Cluster(4, 4, cpus_per_host=4)
    specs = tuple(JobSpec(f"j{i}", 60.0 * i, "resnet-50", 4, 32, epochs=2) for i in range(6))
    seen: list[dict[str, Allocation]] = []
    inner = make_policy(policy)

    class Recording:
        name = policy

        def allocate(self, now, cluster_, jobs):
            answer = dict(inner.allocate(now, cluster_, jobs))
            seen.append(answer)
            return answer

    result = simulate(specs, Recording(), SimConfig(cluster=cluster))
    assert all(record.status == "done" for record in result.records)
    for answer in seen:
        assert all(left >= 0 for left in cluster.free_cpus(answer.values()))
        assert all(left >= 0 for left in cluster.free(a.placement for a in answer.values()))
        assert all(a.servers == ps.servers_for(a.replicas, ps.PsSettings()) for a in answer.values())


def test_estimation_error_changes_decisions_not_true_progress():
    specs = mixed_workload(3, num_jobs=12, duration_s=600.0, ps_fraction=1.0)
    cluster = Cluster(2, 4)
    exact = simulate(specs, make_policy("optimus"), SimConfig(cluster=cluster))
    noisy = simulate(
        specs, make_policy("optimus"), SimConfig(cluster=cluster, estimation_error=0.3, error_seed=1)
    )
    assert [r.jct for r in exact.records] != [r.jct for r in noisy.records]  # decisions differ

    # one job alone at its requested size (FIFO ignores speeds): it finishes when the true speed says
    job = JobSpec("solo", 0.0, "vgg-16", 4, 32, epochs=2)
    config = SimConfig(cluster=cluster, estimation_error=0.5, error_seed=4)
    record = simulate((job,), make_policy("fifo"), config).records[0]
    app = ps.ps_application("vgg-16", 2, 32, config.ps)
    truth = time_to_finish(app, 0.0, (4, 0), 32, (1, 0))
    assert record.jct == pytest.approx(config.resize.start + truth)


def test_policies_see_the_perturbed_model():
    seen = []

    class Peek:
        name = "peek"

        def allocate(self, now, cluster, jobs):
            seen.extend(job.app.speed_scale for job in jobs)
            return make_policy("fifo").allocate(now, cluster, jobs)

    job = JobSpec("solo", 0.0, "cifar10", 1, 128)
    simulate((job,), Peek(), SimConfig(cluster=Cluster(1, 4), estimation_error=0.1, error_seed=2))
    assert seen and all(0.9 <= scale <= 1.1 and scale != 1.0 for scale in seen)
    assert dataclasses.replace(ps.PsSettings(), model="dl2").model == "dl2"


def test_cli_runs_a_mixed_workload_with_estimation_error(tmp_path, capsys):
    from taiji.sched.cli import main

    code = main(
        [
            "simulate",
            "--workload",
            "synthetic",
            "--jobs",
            "8",
            "--duration-h",
            "0.2",
            "--ps-fraction",
            "0.5",
            "--cluster",
            "4x4",
            "--policy",
            "optimus,tiresias",
            "--estimation-error",
            "0.1",
            "--quiet",
            "--no-plots",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    summary = (tmp_path / "summary.json").read_text()
    assert '"estimation_error": 0.1' in summary and '"ps_fraction": 0.5' in summary
