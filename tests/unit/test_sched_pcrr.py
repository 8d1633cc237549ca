"""PCRR as a simulator policy (taiji.sched.policies.pcrr): never oversubscribes (property test through
the simulator), same seed → same run, the resize cost it is told about makes it keep allocations,
a lone job gets what fits, and the decision time at 100 active jobs."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.costs import SYSTEMS
from taiji.sched.lp import Config, Horizon, Host, Job, Problem, solve_lp
from taiji.sched.model import load_application
from taiji.sched.policies import PolluxLike, make_policy
from taiji.sched.policies.pcrr import Pcrr, batch_grid, candidate_counts, epoch_plan
from taiji.sched.policy import JobView
from taiji.sched.rounding import decide, first_come_among_equals, slot_loss
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import JobSpec, synthetic_workload

APPS = {"bert": (96, 384), "cifar10": (2048,), "ncf": (32768,)}  # short jobs: the property test stays fast


class CapacityChecked:
    """Wraps a policy and checks every answer against the hosts itself (not through Cluster.check)."""

    def __init__(self, inner: Pcrr):
        self.inner, self.name, self.answers = inner, inner.name, 0

    def allocate(self, now, cluster, jobs):
        answer = self.inner.allocate(now, cluster, jobs)
        for host in range(cluster.num_hosts):
            assert sum(a.placement[host] for a in answer.values()) <= cluster.gpus_per_host
        assert set(answer) <= {job.name for job in jobs}
        self.answers += 1
        return answer


JOBS = st.lists(
    st.tuples(st.sampled_from(sorted(APPS)), st.integers(0, 600), st.integers(1, 4), st.integers(0, 1)),
    min_size=1,
    max_size=5,
)


@st.composite
def small_runs(draw):
    specs = [
        JobSpec(f"{app}-{index}", float(at), app, replicas, APPS[app][min(pick, len(APPS[app]) - 1)])
        for index, (app, at, replicas, pick) in enumerate(draw(JOBS))
    ]
    cluster = Cluster(draw(st.integers(1, 3)), draw(st.integers(1, 4)))
    return cluster, specs, draw(st.sampled_from(sorted(SYSTEMS))), draw(st.booleans())


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_runs())
def test_pcrr_never_oversubscribes_and_finishes_every_job(run):
    cluster, jobs, system, adaptive = run
    policy = CapacityChecked(Pcrr(resize=SYSTEMS[system], adaptive_batch=adaptive))
    result = simulate(jobs, policy, SimConfig(cluster, resize=SYSTEMS[system]))
    assert policy.answers > 0
    for record in result.records:
        assert record.status == ("rejected" if record.reason else "done"), record


def test_same_seed_same_result():
    jobs = synthetic_workload(seed=3, num_jobs=20, duration_s=3600)
    config = SimConfig(Cluster(4, 4), resize=SYSTEMS["taiji"])
    first = simulate(jobs, Pcrr(resize=SYSTEMS["taiji"], seed=7), config)
    again = simulate(jobs, Pcrr(resize=SYSTEMS["taiji"], seed=7), config)
    assert first == again
    assert (
        make_policy("pcrr").name == "pcrr"
        and make_policy("pcrr", SYSTEMS["taiji"]).resize == SYSTEMS["taiji"]
    )
    assert make_policy("pollux", SYSTEMS["taiji"]) == PolluxLike(restart_penalty_s=SYSTEMS["taiji"].move)
    # a replay of a live run rounds as the daemon did: its rounds' seeds come from the daemon's clock
    assert (
        Pcrr(seed_clock=1.8e9)._round_seed(12.345)
        == Pcrr()._round_seed(1.8e9 + 12.345)
        != Pcrr()._round_seed(12.345)
    )


def test_a_dear_resize_keeps_allocations_that_a_cheap_one_changes():
    # Same workload and simulated system; only the cost PCRR is told about differs. Told 30 s,
    # its LP charges every change of a running job 30 s and keeps allocations far more often.
    jobs = synthetic_workload(seed=5, num_jobs=16, duration_s=3600)
    config = SimConfig(Cluster(4, 4), resize=SYSTEMS["taiji"])
    dear = simulate(jobs, Pcrr(resize=SYSTEMS["restart"]), config).summary()
    cheap = simulate(jobs, Pcrr(resize=SYSTEMS["taiji"]), config).summary()
    assert dear["completed"] == cheap["completed"] == 16
    assert dear["restarts"] < 0.6 * cheap["restarts"], (dear["restarts"], cheap["restarts"])  # 45 vs 107


def test_a_short_arrival_runs_now_and_the_running_job_makes_room():
    # One 4-GPU host. A runs on all of it (and could run on 2 or 3 anywhere); B needs 30 s on one GPU.
    # The LP finishes B inside the first slot using half of it, so B's α-point comes first. With
    # decide's defaults (Bernoulli draw, kept jobs placed first) B never fits behind A; PCRR's
    # settings (α-point list scheduling, conditional draw) start B and shrink A to 3 GPUs.
    a = Job(
        "A",
        1e5,
        (Config.internal(0, 4, 40.0, "current"), Config.external(2, 22.0), Config.external(3, 31.0)),
        current=0,
        resize_cost_s=0.04,
    )
    problem = Problem(
        (Host("h", 4),), (a, Job("B", 30.0, (Config.external(1, 1.0),))), Horizon.geometric(8, 60.0)
    )
    solution = solve_lp(problem)
    assert solution.x[1, 0, 0] < 1
    for seed in range(5):
        default = decide(problem, solution, seed=seed).by_job()
        assert default["B"].config is None and default["A"].how == "kept"
        chosen = decide(
            problem, solution, seed=seed, hysteresis=None, keep_first=False, conditional=True, keep_share=0.5
        ).by_job()
        assert chosen["B"].config == 0 and (chosen["A"].config, chosen["A"].how) == (2, "repaired")


def lone(app: str, batch: int, cluster: Cluster, **settings) -> Allocation:
    view = JobView(JobSpec("lone", 0.0, app, 1, batch), load_application(app), 0.0, 0.0, None, 0)
    answer = Pcrr(**settings).allocate(0.0, cluster, [view])
    assert set(answer) == {"lone"}
    return answer["lone"]


def test_a_lone_job_gets_the_whole_host_that_fits_it():
    assert lone("bert", 384, Cluster(1, 4)).placement == (4,)
    # 16 samples at 4 per GPU at least: 4 GPUs are all this job can use, and they fit on one host,
    # so it runs internal on one whole host rather than spread over two.
    internal = lone("bert", 16, Cluster(3, 4), adaptive_batch=False)
    assert sorted(internal.placement) == [0, 0, 4] and internal.batch_size == 16
    assert lone("ncf", 32768, Cluster(2, 4)).replicas == 1  # ncf runs on one GPU
    cifar10 = lone("cifar10", 2048, Cluster(2, 4))  # scales: takes both hosts
    assert cifar10.placement == (4, 4)
    best = epoch_plan(
        load_application("cifar10"), (4, 4), batch_grid(load_application("cifar10"), 8, True, 2048)
    )
    assert cifar10.batch_size == best.batches[0]  # goodput-best for epoch 0


def test_candidate_counts():
    assert candidate_counts(64, 4) == [1, 2, 3, 4, 8, 16, 32, 64]
    assert candidate_counts(6, 4) == [1, 2, 3, 4, 6]
    assert candidate_counts(1, 4) == [1]
    assert candidate_counts(3, 8) == [1, 2, 3]
    assert candidate_counts(64, 8) == [1, 2, 4, 6, 7, 8, 16, 32, 64]


def test_a_three_gpu_candidate_fills_the_host_beside_a_one_gpu_job():
    """1 host x 4 GPUs: ncf runs on one GPU at most, cifar10 scales. With candidates 1, 2, 4 cifar10
    got 2 and a GPU idled; with 3 among them the host is full, whether the jobs wait or run."""

    def job(name, app, batch, placement=None):
        allocation = None if placement is None else Allocation(placement, batch)
        return JobView(JobSpec(name, 0.0, app, 1, batch), load_application(app), 0.0, 0.0, allocation, 0)

    for cost in ("taiji", "restart"):
        for held in (None, (2,)):
            jobs = [
                job("ncf", "ncf", 32768, None if held is None else (1,)),
                job("cifar10", "cifar10", 2048, held),
            ]
            answer = Pcrr(resize=SYSTEMS[cost]).allocate(0.0, Cluster(1, 4), jobs)
            assert {name: a.replicas for name, a in answer.items()} == {"ncf": 1, "cifar10": 3}, (cost, held)


def test_a_displaced_running_job_is_charged_its_whole_resize():
    """1 host x 4 GPUs. A runs on all 4 (rate 4; 3 GPUs give 3, 2 give 2); B needs 30 s on one GPU.
    The LP time-shares: A keeps its GPUs for 7/8 of the first slot (charged 1/8 of its resize) and B
    uses the rest, so B's α-point comes first and the repair would shrink A to 3 GPUs — a whole resize.
    Charged in full, over the 60 s slot: keeping A costs B the slot (60 s); shrinking costs A its
    resize δ plus 60·(1 − 3/4) = 15 s of progress. At δ = 100 s (115 > 60) A is kept and B waits; at
    δ = 0.04 s (15.04 < 60) A shrinks and B runs."""

    def problem(resize_s):
        a = Job(
            "A",
            1e5,
            (Config.internal(0, 4, 4.0, "current"), Config.external(2, 2.0), Config.external(3, 3.0)),
            current=0,
            resize_cost_s=resize_s,
        )
        return Problem(
            (Host("h", 4),), (a, Job("B", 30.0, (Config.external(1, 1.0),))), Horizon.geometric(8, 60.0)
        )

    dear, cheap = problem(100.0), problem(0.04)
    assert slot_loss(dear, [0, None]) == 60.0 and slot_loss(dear, [2, 0]) == 115.0
    for chosen_problem, expected in ((dear, ((0, "kept"), None)), (cheap, ((2, "repaired"), 0))):
        solution = solve_lp(chosen_problem)
        assert solution.x[0, 0, 0] == pytest.approx(0.875) and solution.x[1, 0, 0] > 0  # the time share
        for seed in range(3):
            schedule = decide(
                chosen_problem,
                solution,
                seed=seed,
                hysteresis=None,
                keep_first=False,
                conditional=True,
                keep_share=0.5,
            ).by_job()
            assert ((schedule["A"].config, schedule["A"].how), schedule["B"].config) == expected


def busy_cluster_views(n_jobs: int, cluster: Cluster) -> list[JobView]:
    """``n_jobs`` active jobs, every other one running on one GPU of a random host while room lasts."""
    rng = np.random.default_rng(0)
    free = [cluster.gpus_per_host] * cluster.num_hosts
    views = []
    for index, spec in enumerate(synthetic_workload(seed=7, num_jobs=n_jobs, duration_s=3600)):
        app, host = load_application(spec.application), int(rng.integers(cluster.num_hosts))
        allocation = None
        if index % 2 == 0 and free[host] > 0:
            free[host] -= 1
            placement = [0] * cluster.num_hosts
            placement[host] = 1
            allocation = Allocation(tuple(placement), spec.batch_size)
        progress = float(rng.uniform(0.0, 0.5)) * app.target_progress
        views.append(JobView(spec, app, progress, 0.0, allocation, 0, int(allocation is not None)))
    return views


def test_decision_time_for_100_active_jobs_is_under_a_second():
    cluster = Cluster(16, 4)
    views = busy_cluster_views(100, cluster)
    Pcrr().allocate(0.0, cluster, views)  # warm imports, HiGHS and the per-shape rate cache
    times = []
    for seed in range(3):
        policy = Pcrr(seed=seed)
        started = time.perf_counter()
        answer = policy.allocate(60.0, cluster, views)
        times.append(time.perf_counter() - started)
    stats = policy.rounds[-1]
    print(
        f"\nPCRR policy round, 100 jobs on 16x4 ({stats.variables} LP variables, {stats.rows} rows): "
        f"best {min(times):.3f} s, LP {stats.lp_s:.3f} s"
    )
    assert stats.lp_optimal and stats.jobs == 100
    assert sum(a.replicas for a in answer.values()) == cluster.total_gpus  # work-conserving
    assert min(times) < 1.0


def _waiting(name, work, arrival, weight=1.0, gpus=(1, 2), speed=1.0):
    """A job that waits, with candidates of ``gpus`` workers and ``work / speed`` seconds to finish at its
    best."""
    return Job(
        name, work, tuple(Config.external(g, speed * g / max(gpus)) for g in gpus), weight, arrival=arrival
    )


def test_equal_waiting_jobs_are_served_first_come_and_take_the_earlier_places_roles():
    jobs = (
        _waiting("late", 10.0, arrival=30.0),
        _waiting("early", 10.4, arrival=15.0, speed=0.7),
        _waiting("long", 40.0, 26.0),
    )
    # the LP put the later arrival first (2 workers: configuration 1) and the earlier one last, with nothing
    order, rounded = first_come_among_equals(jobs, [0, 2, 1], [1, None, 0])
    assert order == [1, 2, 0], "the earlier arrival takes the first place"
    assert rounded == [None, 1, 0], (
        "with the configuration rounded for that place; the longer job is untouched"
    )
    # listed in the other order (as a replay may list them): the same schedule
    swapped = (jobs[1], jobs[0], jobs[2])
    order2, rounded2 = first_come_among_equals(swapped, [1, 2, 0], [None, 1, 0])
    assert [swapped[j].name for j in order2] == [jobs[j].name for j in order]
    assert {swapped[j].name: rounded2[j] for j in range(3)} == {jobs[j].name: rounded[j] for j in range(3)}


def test_jobs_that_differ_keep_the_lps_order():
    far = (_waiting("late", 10.0, arrival=30.0), _waiting("early", 13.0, arrival=15.0))  # 30% more work
    assert first_come_among_equals(far, [0, 1], [1, None]) == ([0, 1], [1, None])
    slower = (
        _waiting("late", 10.0, arrival=30.0),
        _waiting("early", 10.0, arrival=15.0, speed=0.4),
    )  # 2.5x slower
    assert first_come_among_equals(slower, [0, 1], [1, None]) == ([0, 1], [1, None])
    heavier = (_waiting("late", 10.0, 30.0, weight=2.0), _waiting("early", 10.0, 15.0))
    assert first_come_among_equals(heavier, [0, 1], [1, None]) == ([0, 1], [1, None])
    other_shapes = (_waiting("late", 10.0, 30.0, gpus=(1,)), _waiting("early", 10.0, 15.0))
    assert first_come_among_equals(other_shapes, [0, 1], [0, None]) == ([0, 1], [0, None])
    running = (_waiting("late", 10.0, 30.0), dataclasses.replace(_waiting("early", 10.0, 15.0), current=0))
    assert first_come_among_equals(running, [0, 1], [1, 0]) == ([0, 1], [1, 0]), (
        "a running job is no waiting equal"
    )
    # a tie that the α-points leave exact is broken by arrival, not by the order the jobs were listed in
    tied = (_waiting("b", 10.0, 20.0, gpus=(2,)), _waiting("a", 10.0, 20.0, gpus=(2,)))
    assert first_come_among_equals(tied, [0, 1], [0, None]) == ([1, 0], [None, 0])
