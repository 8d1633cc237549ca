"""taiji.sched.sim: exact completion times, capacity never exceeded (property test), determinism,
rejection of jobs larger than the cluster, and the ways a run can stop without crashing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation, Cluster, PolicyError
from taiji.sched.costs import SYSTEMS, resize_cost
from taiji.sched.model import advance, load_application, time_to_finish
from taiji.sched.policies import POLICIES, make_policy
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import JobSpec, synthetic_workload


@dataclass
class Recorder:
    """Wraps a policy; keeps every answer and checks capacity independently of Cluster.check."""

    inner: object
    name: str = "recorder"
    rounds: list = field(default_factory=list)
    last_progress: dict = field(default_factory=dict)

    def allocate(self, now, cluster, jobs):
        for job in jobs:
            assert self.last_progress.get(job.name, 0.0) <= job.progress <= job.app.target_progress
            self.last_progress[job.name] = job.progress
        answer = self.inner.allocate(now, cluster, jobs)
        for host in range(cluster.num_hosts):
            assert sum(a.placement[host] for a in answer.values()) <= cluster.gpus_per_host
        self.rounds.append((now, dict(answer)))
        return answer


def test_a_job_completes_exactly_when_its_work_is_done():
    bert = load_application("bert")
    job = JobSpec("bert-0", 10.0, "bert", 4, 384)
    for system, events, start in (("restart", False, 60.0), ("taiji", True, 10.0)):
        config = SimConfig(Cluster(1, 4), resize=SYSTEMS[system], reschedule_on_events=events)
        record = simulate([job], make_policy("fifo"), config).records[0]
        work = time_to_finish(bert, 0.0, (4,), 384)
        assert record.status == "done" and record.start_time == start
        assert record.end_time == pytest.approx(start + SYSTEMS[system].start + work, rel=1e-12)
        assert record.jct == pytest.approx(record.end_time - 10.0, rel=1e-12)
        assert record.gpu_seconds == pytest.approx(4 * (record.end_time - start), rel=1e-9)


APPS = {"bert": (384,), "cifar10": (2048, 4096), "yolov3": (64,), "ncf": (32768,)}


@st.composite
def small_runs(draw):
    cluster = Cluster(draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    jobs = []
    for index in range(draw(st.integers(1, 6))):
        app = draw(st.sampled_from(sorted(APPS)))
        jobs.append(
            JobSpec(
                f"{app}-{index}",
                float(draw(st.integers(0, 900))),
                app,
                draw(st.integers(1, 8)),
                draw(st.sampled_from(APPS[app])),
            )
        )
    return (
        cluster,
        jobs,
        draw(st.sampled_from(sorted(POLICIES))),
        draw(st.sampled_from(sorted(SYSTEMS))),
        draw(st.sampled_from((0.0, 0.25))),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_runs())
def test_capacity_is_never_exceeded_and_every_job_ends(run):
    cluster, jobs, policy, system, interference = run
    recorder = Recorder(make_policy(policy))
    result = simulate(jobs, recorder, SimConfig(cluster, resize=SYSTEMS[system], interference=interference))
    assert all(used <= cluster.total_gpus for _, used in result.utilization)
    for spec, record in zip(sorted(jobs, key=lambda j: j.submit_time), result.records):
        if spec.num_replicas > cluster.total_gpus:
            assert record.status == "rejected" and "asks for" in record.reason
            continue
        assert record.status == "done"
        assert spec.submit_time <= record.start_time < record.end_time
    if policy == "fifo" and not interference:  # never resized: ends at start + restart + work
        for record in result.records:
            if record.status != "done":
                continue
            first = next(answer[record.name] for _, answer in recorder.rounds if record.name in answer)
            app = load_application(record.application)
            expected = (
                record.start_time
                + SYSTEMS[system].start
                + time_to_finish(app, 0.0, first.placement, first.batch_size)
            )
            assert record.end_time == pytest.approx(expected, rel=1e-9)


def test_same_seed_same_result():
    jobs = synthetic_workload(seed=3, num_jobs=30, duration_s=3600)
    for policy in ("tiresias", "optimus"):
        first = simulate(jobs, make_policy(policy), SimConfig(Cluster(4, 4)))
        again = simulate(jobs, make_policy(policy), SimConfig(Cluster(4, 4)))
        assert first == again


def test_a_job_larger_than_the_cluster_is_rejected_and_reported():
    jobs = [JobSpec("imagenet-0", 0.0, "imagenet", 48, 6400), JobSpec("bert-1", 5.0, "bert", 4, 384)]
    result = simulate(jobs, make_policy("fifo"), SimConfig(Cluster(2, 4)))
    rejected, done = result.records
    assert rejected.status == "rejected" and "48 GPUs, the cluster has 8" in rejected.reason
    assert done.status == "done"
    summary = result.summary()
    assert summary["rejected"] == ["imagenet-0"] and summary["completed"] == 1


@dataclass(frozen=True)
class Idle:
    name: str = "idle"

    def allocate(self, now, cluster, jobs):
        return {}


@dataclass(frozen=True)
class Greedy:
    name: str = "greedy"

    def allocate(self, now, cluster, jobs):
        return {
            job.name: Allocation((cluster.gpus_per_host,) * cluster.num_hosts, job.spec.batch_size)
            for job in jobs
        }


def test_runs_that_cannot_progress_stop_and_report():
    jobs = [JobSpec("bert-0", 0.0, "bert", 1, 384)]
    result = simulate(jobs, Idle(), SimConfig(Cluster(1, 4)))
    assert result.records[0].status == "unfinished"
    short = simulate(
        [JobSpec("cifar10-0", 0.0, "cifar10", 1, 2048)],
        make_policy("fifo"),
        SimConfig(Cluster(1, 1), max_time_s=600.0),
    )
    assert short.records[0].status == "unfinished" and short.summary()["unfinished"] == ["cifar10-0"]
    late = simulate(
        [JobSpec("bert-0", 0.0, "bert", 1, 384), JobSpec("bert-1", 5000.0, "bert", 1, 384)],
        make_policy("fifo"),
        SimConfig(Cluster(1, 1), max_time_s=1000.0),
    )
    assert [r.status for r in late.records] == ["unfinished", "unfinished"]
    assert late.records[1].reason == "submitted after the time limit"


def test_an_oversubscribing_policy_is_an_error_not_a_silent_overload():
    jobs = [JobSpec("bert-0", 0.0, "bert", 1, 384), JobSpec("bert-1", 0.0, "bert", 1, 384)]
    with pytest.raises(PolicyError, match="oversubscribed"):
        simulate(jobs, Greedy(), SimConfig(Cluster(1, 4)))


def test_resize_cost_by_kind_of_change():
    cost = SYSTEMS["taiji"]
    one, two, moved = Allocation((1, 0), 8), Allocation((1, 1), 8), Allocation((0, 1), 8)
    assert resize_cost(cost, None, one) == cost.start
    assert resize_cost(cost, one, two) == cost.grow
    assert resize_cost(cost, two, one) == cost.shrink
    assert resize_cost(cost, one, moved) == cost.move
    assert resize_cost(cost, one, Allocation((1, 0), 16)) is None  # batch only
    assert resize_cost(cost, one, None) is None  # preemption


def test_summary_and_jsonl(tmp_path):
    jobs = synthetic_workload(seed=5, num_jobs=12, duration_s=1800)
    result = simulate(jobs, make_policy("tiresias"), SimConfig(Cluster(4, 4)))
    summary = result.summary()
    jcts = sorted(r.jct for r in result.records)
    assert summary["completed"] == 12
    assert summary["avg_jct_s"] == pytest.approx(sum(jcts) / 12)
    assert jcts[-2] <= summary["p99_jct_s"] <= jcts[-1]
    assert summary["makespan_s"] == pytest.approx(
        max(r.end_time for r in result.records) - jobs[0].submit_time
    )
    path = tmp_path / "jobs.jsonl"
    result.write_jsonl(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["name"] for line in lines] == [r.name for r in result.records]
    assert lines[0]["status"] == "done"


@dataclass(frozen=True)
class SpreadEveryone:
    """Puts every job on 2 GPUs of host 0 and 2 of host 1, so distributed jobs share hosts."""

    name: str = "spread"

    def allocate(self, now, cluster, jobs):
        return {job.name: Allocation((2, 2), job.spec.batch_size) for job in jobs[:2]}


def test_interference_slows_shared_distributed_jobs_exactly():
    cifar10, bert = load_application("cifar10"), load_application("bert")  # cifar10 is shorter
    jobs = [JobSpec("cifar10-0", 0.0, "cifar10", 4, 2048), JobSpec("bert-1", 0.0, "bert", 4, 384)]
    config = SimConfig(Cluster(2, 4), interference=0.5)
    short, long = simulate(jobs, SpreadEveryone(), config).records
    slow_until = 30.0 + time_to_finish(cifar10, 0.0, (2, 2), 2048) / 0.5
    assert short.end_time == pytest.approx(slow_until, rel=1e-9)
    progress = advance(bert, 0.0, (slow_until - 30.0) * 0.5, (2, 2), 384)
    alone = time_to_finish(bert, progress, (2, 2), 384)  # full speed once cifar10 is gone
    assert long.end_time == pytest.approx(slow_until + alone, rel=1e-9)
    baseline = simulate(jobs, SpreadEveryone(), SimConfig(Cluster(2, 4))).records
    assert baseline[0].end_time < short.end_time
    with pytest.raises(ConfigError, match="interference"):
        SimConfig(interference=1.0)
