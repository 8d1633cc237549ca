"""PCRR's decision core (taiji.sched.lp, taiji.sched.rounding): LP optima checked by hand, rounding
never exceeding capacity, determinism, hysteresis, and the decision time at 100 active jobs."""

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taiji.errors import ConfigError
from taiji.sched.lp import Config, Horizon, Host, Job, Problem, predicted_completion_s, solve_lp
from taiji.sched.rounding import alpha_point_times, change_gain, decide


def one_gpu_job(name: str, work: float, host: int = 0, **kw) -> Job:
    return Job(name, work, (Config.internal(host, 1, 1.0),), **kw)


# -- LP: toy instances with optima derived by hand ------------------------------------------------


def test_lp_runs_the_heavier_job_first_on_one_gpu():
    # One GPU, slots of 1 s, two unit jobs at rate 1, weights 2 (A) and 1 (B). Finishing in slot 0
    # needs the slot's work, so u_A0 + u_B0 ≤ v_A0 + v_B0 ≤ 1, and all other mass ends at ≥ 2 s:
    # cost ≥ Σ ω_j (2 − u_j0) = 6 − 2u_A0 − u_B0 ≥ 6 − 2 = 4, met by A in slot 0, B in slot 1.
    problem = Problem(
        (Host("h", 1),), (one_gpu_job("A", 1.0, weight=2.0), one_gpu_job("B", 1.0)), Horizon.uniform(2, 1.0)
    )
    solution = solve_lp(problem)
    assert solution.optimal
    assert solution.objective == pytest.approx(4.0)
    assert solution.x[:, 0, :] == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-7)
    assert solution.completion_s == pytest.approx([1.0, 2.0])


def test_lp_host_capacity_binds_even_when_the_cluster_has_room():
    # Both unit jobs can only run on host 0 (1 GPU); host 1 idles. The same bound as above with
    # weights 1: cost ≥ 4 − (u_A0 + u_B0) ≥ 3. Aggregate capacity alone (2 GPUs) would allow 2.
    problem = Problem(
        (Host("a", 1), Host("b", 1)), (one_gpu_job("A", 1.0), one_gpu_job("B", 1.0)), Horizon.uniform(3, 1.0)
    )
    solution = solve_lp(problem)
    assert solution.objective == pytest.approx(3.0)
    assert solution.host_price[0, 0] > 0 and solution.host_price[1].sum() == pytest.approx(0.0)


def test_lp_prefers_the_external_configuration_that_finishes_in_the_first_slot():
    # 3 units of work: internal on host 0 (2 GPUs) at 2/s, or external on 4 GPUs at 3/s. Completing
    # in slot 0 needs 3·u_0 ≤ 2·v_int + 3·v_ext with v_int + v_ext ≤ 1, so u_0 = 1 forces v_ext = 1;
    # the cost is then end_0 = 1 s, which nothing can beat.
    job = Job("A", 3.0, (Config.internal(0, 2, 2.0), Config.external(4, 3.0)))
    solution = solve_lp(Problem((Host("a", 2), Host("b", 2)), (job,), Horizon.uniform(3, 1.0)))
    assert solution.objective == pytest.approx(1.0)
    assert solution.x[0, :, 0] == pytest.approx([0.0, 1.0], abs=1e-7)


def test_lp_estimates_a_job_that_outlasts_the_horizon():
    # 5 units at 1/s, two 1 s slots. With a = u_0 and v_1 ≤ 1 − a (it runs only until it completes),
    # cost = a + 2u_1 + 2u_T + (5 − W) = 6 − a − v_1 ≥ 5: the true completion, 5 s.
    problem = Problem((Host("h", 1),), (one_gpu_job("A", 5.0),), Horizon.uniform(2, 1.0))
    solution = solve_lp(problem)
    assert solution.objective == pytest.approx(5.0)
    assert solution.completion_s == pytest.approx([5.0])
    assert predicted_completion_s(problem.jobs[0], 1.0, problem.horizon) == pytest.approx(5.0)


def test_lp_does_not_charge_a_resize_to_a_job_that_completes_in_the_first_slot():
    # 1 host x 4 GPUs, two 60 s slots. A runs on all 4 GPUs (current, rate 1) with 30 units left, so
    # it finishes half-way through slot 0 and cannot run longer (its work is capped at what is left);
    # B needs the 4 GPUs for 30 s too. Every job's cost is at least the end of slot 0 (60 s), and
    # time-sharing slot 0 attains 120 whatever A's resize costs: finishing is not a change. (A charge
    # on the half slot A does not run would add δ/2 to A.)
    for resize_s in (30.0, 200.0):
        a = Job("A", 30.0, (Config.spread({0: 4}, 1.0, "current"),), current=0, resize_cost_s=resize_s)
        b = Job("B", 30.0, (Config.external(4, 1.0),))
        solution = solve_lp(Problem((Host("h", 4),), (a, b), Horizon.uniform(2, 60.0)))
        assert solution.objective == pytest.approx(120.0)
        assert solution.completion_s == pytest.approx([60.0, 60.0])
        assert solution.x[:, 0, 0] == pytest.approx([0.5, 0.5], abs=1e-7)


def test_lp_without_jobs_and_alpha_points_interpolate_inside_a_slot():
    empty = solve_lp(Problem((Host("h", 4),), (), Horizon.uniform(2, 1.0)))
    assert empty.optimal and empty.x.shape == (0, 0, 2)
    problem = Problem((Host("h", 1),), (one_gpu_job("A", 8.0),), Horizon.uniform(2, 1.0))
    solution = dataclasses.replace(solve_lp(problem), done=np.array([[0.25, 0.75]]))
    # Half the work is done a half-way through slot 1 (from 0.25 to 0.75): 1.5 s. Past the horizon,
    # the remaining 0.25·8 units at rate 1 take 2 s more: α = 1 → 4 s.
    assert alpha_point_times(problem, solution, np.array([0.5])) == pytest.approx([1.5])
    assert alpha_point_times(problem, solution, np.array([1.0])) == pytest.approx([4.0])


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(configs=(Config.external(2, 1.0),), current=0), "fixed placement"),
        (dict(configs=(Config.internal(3, 1, 1.0),)), "config 0"),
        (dict(configs=(Config.internal(0, 1, 0.0),)), "positive rate"),
        (dict(remaining=0.0), "remaining"),
    ],
)
def test_bad_jobs_are_rejected_by_name(bad, words):
    job = dataclasses.replace(one_gpu_job("broken", 1.0), **bad)
    with pytest.raises(ConfigError, match=f"broken.*{words}|{words}.*broken"):
        Problem((Host("h", 2),), (job,), Horizon.uniform(2, 1.0))


# -- rounding: capacity, determinism, hysteresis --------------------------------------------------


@st.composite
def problems(draw) -> Problem:
    """Random clusters and jobs; current allocations are feasible on the capacities they were made
    on, which then may shrink (a host lost GPUs) so the repair must cope with that too."""
    n_hosts = draw(st.integers(1, 4))
    made_on = [draw(st.integers(1, 8)) for _ in range(n_hosts)]
    free = list(made_on)
    jobs = []
    for j in range(draw(st.integers(1, 8))):
        configs = []
        for _ in range(draw(st.integers(1, 4))):
            gpus = draw(st.integers(1, 8))
            rate = draw(st.floats(0.1, 10.0))
            kind = draw(st.sampled_from(["internal", "external", "spread"]))
            if kind == "internal":
                configs.append(Config.internal(draw(st.integers(0, n_hosts - 1)), gpus, rate))
            elif kind == "external":
                configs.append(Config.external(gpus, rate))
            else:
                configs.append(
                    Config.spread({h: draw(st.integers(0, 2)) for h in range(n_hosts)} | {0: 1}, rate)
                )
        fixed = [k for k, c in enumerate(configs) if not c.flexible]
        current = None
        if fixed and draw(st.booleans()):
            k = draw(st.sampled_from(fixed))
            if all(free[h] >= g for h, g in configs[k].placement):
                current = k
                for h, g in configs[k].placement:
                    free[h] -= g
        jobs.append(
            Job(
                f"j{j}",
                draw(st.floats(1.0, 1e4)),
                tuple(configs),
                weight=draw(st.floats(0.5, 4.0)),
                current=current,
                resize_cost_s=draw(st.sampled_from([0.0, 0.03, 30.0, 250.0])),
            )
        )
    shrink = [draw(st.integers(0, 2)) for _ in range(n_hosts)]
    hosts = tuple(Host(f"h{h}", max(0, made_on[h] - shrink[h])) for h in range(n_hosts))
    horizon = Horizon.geometric(draw(st.integers(1, 6)), 60.0)
    return Problem(hosts, tuple(jobs), horizon, capacity_slack=draw(st.sampled_from([0.0, 0.1])))


@settings(max_examples=60, deadline=None)
@given(problem=problems(), seed=st.integers(0, 2**32 - 1), alpha=st.sampled_from([0.5, None]))
def test_rounding_and_repair_never_exceed_capacity(problem, seed, alpha):
    schedule = decide(problem, seed=seed, alpha=alpha)
    used = np.zeros(len(problem.hosts), dtype=int)
    for job, decision in zip(problem.jobs, schedule.assignments):
        assert decision.job == job.name
        if decision.config is None:
            assert decision.placement == ()
            continue
        config = job.configs[decision.config]
        assert sum(g for _, g in decision.placement) == config.gpus
        if not config.flexible:
            assert decision.placement == config.placement
        for h, g in decision.placement:
            used[h] += g
    capacity = np.array([h.gpus for h in problem.hosts])
    assert (used <= capacity).all()
    assert schedule.free_gpus == tuple(capacity - used)
    assert sorted(schedule.order) == sorted(job.name for job in problem.jobs)


def test_same_seed_same_schedule():
    problem = many_jobs(40)
    for alpha in (0.5, None):
        first, again = decide(problem, seed=7, alpha=alpha), decide(problem, seed=7, alpha=alpha)
        assert first.assignments == again.assignments and first.order == again.order


def scaling_job(resize_cost_s: float) -> Job:
    # Runs on 2 GPUs at 1/s; 4 GPUs give 1.1/s. With 1000 units and 8 slots of 60 s (480 s), holding
    # 2 GPUs completes at 480 + 520/1.1 ≈ 952.7 s, 4 GPUs at 1000/1.1 ≈ 909.1 s: a 43.6 s gain.
    return Job(
        "a",
        1000.0,
        (Config.internal(0, 2, 1.0), Config.internal(0, 4, 1.1)),
        current=0,
        resize_cost_s=resize_cost_s,
    )


def test_hysteresis_keeps_an_allocation_when_the_resize_costs_more_than_it_gains():
    horizon = Horizon.uniform(8, 60.0)
    cheap = Problem((Host("h", 4),), (scaling_job(0.03),), horizon)
    # No other job wants host 0's GPUs (price 0), so the gain is the job's own: 480 − 480/1.1.
    assert change_gain(cheap, solve_lp(cheap), cheap.jobs[0], 1) == pytest.approx(480 - 480 / 1.1)
    assert decide(cheap, seed=0).assignments[0].config == 1  # 0.03 s < 43.6 s: grow
    dear = Problem((Host("h", 4),), (scaling_job(50.0),), horizon)
    kept = decide(dear, seed=0).assignments[0]
    assert (kept.config, kept.changed, kept.how) == (0, False, "kept")
    # The rounding's own check: even an LP that moved the job (solved as if resizes were free) is
    # overruled when the resize costs more than the gain.
    overruled = decide(dear, solve_lp(cheap), seed=0)
    assert overruled.assignments[0].config == 0 and overruled.kept_by_hysteresis == 1


def test_a_cheap_shrink_makes_room_for_a_waiting_job():
    # A holds all 4 GPUs but gains little from the last 2; B waits and needs 2. The LP's price of
    # those GPUs counts for the shrink, so A shrinks and B starts; at a dear resize A keeps its GPUs.
    def problem(resize_cost_s):
        a = Job(
            "a",
            5000.0,
            (Config.internal(0, 2, 1.0), Config.internal(0, 4, 1.05)),
            current=1,
            resize_cost_s=resize_cost_s,
        )
        b = Job("b", 300.0, (Config.internal(0, 2, 1.0),))
        return Problem((Host("h", 4),), (a, b), Horizon.uniform(8, 60.0))

    cheap = decide(problem(0.03), seed=3).by_job()
    assert (cheap["a"].config, cheap["b"].config) == (0, 0)
    dear = decide(problem(1e5), seed=3).by_job()
    assert (dear["a"].config, dear["b"].config) == (1, None)


def test_without_an_lp_solution_the_fill_still_uses_every_gpu():
    problem = Problem(
        (Host("a", 4), Host("b", 4)),
        tuple(
            Job(f"j{i}", 100.0 * (i + 1), (Config.internal(i % 2, 1, 1.0), Config.internal(i % 2, 2, 1.9)))
            for i in range(5)
        ),
        Horizon.uniform(4, 60.0),
    )
    failed = dataclasses.replace(solve_lp(problem), optimal=False)
    schedule = decide(problem, failed, seed=0)
    assert schedule.free_gpus == (0, 0)
    assert all(d.how in ("filled", "none") for d in schedule.assignments)


def many_jobs(n_jobs: int, n_hosts: int = 16, seed: int = 0) -> Problem:
    """A busy 16×4 cluster: each job can run 1/2/4 GPUs on one host or 8 GPUs external; the first
    jobs run on 1 GPU now, as long as their host has room."""
    rng = np.random.default_rng(seed)
    jobs, free = [], [4] * n_hosts
    for j in range(n_jobs):
        speed, host = rng.uniform(0.5, 2.0), int(rng.integers(n_hosts))
        configs = (
            Config.internal(host, 1, speed),
            Config.internal(host, 2, 1.8 * speed),
            Config.internal(host, 4, 3.2 * speed),
            Config.external(8, 5.0 * speed),
        )
        running = j < 40 and free[host] > 0
        free[host] -= running
        jobs.append(
            Job(
                f"j{j}",
                float(rng.uniform(100, 20000)),
                configs,
                weight=float(rng.choice([1.0, 2.0])),
                current=0 if running else None,
                resize_cost_s=0.03,
            )
        )
    return Problem(tuple(Host(f"h{h}", 4) for h in range(n_hosts)), tuple(jobs), Horizon.uniform(8, 60.0))


def test_decision_time_for_100_active_jobs_is_under_a_second():
    problem = many_jobs(100)
    decide(problem, seed=0)  # warm the imports and HiGHS
    times = []
    for seed in range(3):
        started = time.perf_counter()
        schedule = decide(problem, seed=seed)
        times.append(time.perf_counter() - started)
    size = schedule.lp.size
    print(
        "\nPCRR decision, 100 jobs × 4 configs × 8 slots "
        f"({size['variables']} variables, {size['rows']} rows, "
        f"{size['nonzeros']} nonzeros): best {min(times):.3f} s, LP {schedule.lp.solve_s:.3f} s"
    )
    assert schedule.lp.optimal
    assert min(times) < 1.0


def suspension_problem(suspend_cost_s: float) -> Problem:
    # A runs on both GPUs with 600 s of work left; B waits with 60 s of work on the same 2 GPUs.
    # Keeping A: A ends at 600, B at 660 (1260 in all). Suspending A for B: B ends at 60, A at
    # 600 + 60 + σ (720 + σ). So suspending gains 540 − σ: worth it for a resume of 5 s, not of 2000 s.
    # An in-place change is cheap (0.03 s): without σ the LP would suspend A in either case.
    a = Job(
        "a",
        600.0,
        (Config.internal(0, 2, 1.0, "current"),),
        current=0,
        resize_cost_s=0.03,
        suspend_cost_s=suspend_cost_s,
    )
    b = Job("b", 60.0, (Config.internal(0, 2, 1.0),))
    return Problem((Host("h", 2),), (a, b), Horizon.uniform(8, 60.0))


PCRR_ROUNDING = dict(alpha=0.5, hysteresis=None, keep_first=False, conditional=True, keep_share=0.5)


def test_the_lp_keeps_a_job_running_when_its_resume_costs_more_than_suspending_gains():
    problem = suspension_problem(2000.0)
    solution = solve_lp(problem)
    assert solution.x[0, 0, 0] > 0.5 > solution.x[1, 0, 0]  # A keeps most of the first slot
    decided = decide(problem, solution, seed=0, **PCRR_ROUNDING).by_job()
    assert (decided["a"].config, decided["b"].config) == (0, None)
    assert problem.jobs[0].change_cost_s(None) == 2000.0 and problem.jobs[0].change_cost_s(0) == 0.0


def test_the_lp_suspends_a_job_when_the_gain_outweighs_its_resume():
    problem = suspension_problem(5.0)
    solution = solve_lp(problem)
    assert solution.x[1, 0, 0] == pytest.approx(1.0, abs=1e-6)  # B runs first, A waits
    assert solution.completion_s[0] == pytest.approx(600 + 60 + 5.0, abs=1e-3)  # A's resume counted
    decided = decide(problem, solution, seed=0, **PCRR_ROUNDING).by_job()
    assert (decided["a"].config, decided["b"].config) == (None, 0)
    # the suspend cost is what keeps A in the other test: without it (only the 0.03 s change) A is suspended
    free = Problem(
        suspension_problem(0.0).hosts,
        (dataclasses.replace(problem.jobs[0], suspend_cost_s=0.0), problem.jobs[1]),
        problem.horizon,
    )
    assert solve_lp(free).x[0, 0, 0] == pytest.approx(0.0, abs=1e-6)


def test_a_suspend_cost_below_the_resize_cost_changes_nothing():
    job = Job("a", 1.0, (Config.internal(0, 1, 1.0),), current=0, resize_cost_s=30.0, suspend_cost_s=5.0)
    assert job.change_cost_s(None) == 30.0 and job.suspend_surcharge_s == 0.0
    with pytest.raises(ConfigError, match="suspend"):
        Problem((Host("h", 1),), (dataclasses.replace(job, suspend_cost_s=-1.0),), Horizon.uniform(1, 1.0))
