"""A replay's policy sees each job as the live daemon did (pure; taiji/sched/replay.py and
SimConfig.daemon_view in taiji/sched/sim.py): no workers while a job's launcher boots, and until
its first step the daemon's guess of its model — built by the daemon's own code — while the
simulated job advances at its true speed."""

import dataclasses

import pytest

from taiji.sched.cluster import Allocation, Cluster
from taiji.sched.costs import ResizeCost
from taiji.sched.live import Measured, StepModel, live_application
from taiji.sched.livejob import Observed
from taiji.sched.policies import Tiresias
from taiji.sched.replay import DaemonGuess
from taiji.sched.scheduler import Scheduler
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import LIVE, JobSpec

BATCH = 128


def app(name: str, per_sample: float, steps: int = 100):
    """A job of ``steps`` steps of batch 128 whose compute scales linearly at ``per_sample`` s a sample."""
    return live_application(name, StepModel(0.0, per_sample, 0.0, 0.0, 0.0), BATCH, BATCH * steps, 1, 2)


def same(one, other) -> bool:
    """Two Applications alike field by field (an Application compares by identity)."""
    return all(getattr(one, f.name) == getattr(other, f.name) for f in dataclasses.fields(one))


class Watching:
    """Gives every job one worker (on host 0, in submission order) and notes what it was shown."""

    name = "watching"

    def __init__(self):
        self.seen = []  # (now, {job: its JobView})

    def allocate(self, now, cluster, jobs):
        self.seen.append((now, {job.name: job for job in jobs}))
        return {job.name: Allocation((1,), BATCH) for job in jobs[: cluster.total_gpus]}


def test_the_daemons_guess_is_what_its_own_view_shows_a_job_never_measured():
    """Scheduler.view_of of a queued job, with another job measured, and DaemonGuess of the same
    job given that job's step times: the same Application (the same code builds both)."""
    sched = Scheduler(slots=2, policy=Tiresias(threshold_gpu_s=None))
    first = sched.submit(0.0, ["job"], min_np=1, max_np=2, np=1, work=BATCH * 50)
    sched.round(0.0)
    sched.launched(0.0, first.id)
    for step in (1, 2):  # (the first read only learns its size: a step time counts once it is steady)
        sched.observe(
            float(step),
            first.id,
            Observed(size=1, version=1, step=step, batch_size=BATCH, samples_per_s=BATCH / 0.2),
        )
    later = sched.submit(3.0, ["job"], min_np=1, max_np=2, np=1, work=BATCH * 30)
    daemon = sched.view_of(later, 3.0).app
    guess = DaemonGuess(
        {first.id: [Measured(1, 1, 0.2)], later.id: [Measured(2, 1, 0.05)]},
        {first.id: BATCH * 50, later.id: BATCH * 30},
        BATCH,
        2,
    )
    assert same(guess.guess(later.id, [first.id]), daemon)
    # before any job is measured: the daemon's default guess, whatever the job's true speed
    none_measured = Scheduler(slots=2, policy=Tiresias(threshold_gpu_s=None))
    alone = none_measured.submit(0.0, ["job"], min_np=1, max_np=2, np=1, work=BATCH * 50)
    assert alone.id == first.id and same(guess.guess(alone.id, []), none_measured.view_of(alone, 0.0).app)


def test_a_replays_policy_sees_a_booting_job_without_workers_and_the_daemons_guess_until_its_first_step():
    """Live, a launched job has no workers to show until it reports, and no step time until its
    first step: the replay's policy sees it so (allocation None, the guessed model), then its
    allocation and its own model; the job itself trains at its true speed all along."""
    truth = (("a", app("a", 0.01)), ("b", app("b", 0.005)))
    guess = DaemonGuess(
        {"a": [Measured(1, 1, 1.28)], "b": [Measured(1, 1, 0.64)]},
        {"a": BATCH * 100, "b": BATCH * 100},
        BATCH,
        2,
    )
    cost = ResizeCost(start=2.5, grow=0.0, shrink=0.0, move=0.0)
    specs = [JobSpec("a", 0.0, LIVE, 1, BATCH), JobSpec("b", 0.0, LIVE, 1, BATCH)]
    jct = {}
    for view in (None, guess):
        policy = Watching()
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2),
            resize=cost,
            interval_s=1.0,
            live=truth,
            daemon_view=view,
        )
        jct[view is None] = {r.name: r.jct for r in simulate(specs, policy, config).records}
        by_time = dict(policy.seen)
        if view is None:  # the default: the truth, and the workers it was given
            assert by_time[1.0]["a"].allocation is not None and by_time[1.0]["b"].app is dict(truth)["b"]
            continue
        for now in (1.0, 2.0):  # booting (0-2.5 s): no workers; never measured: the typical guess
            seen_now = by_time[now]
            assert seen_now["a"].allocation is None and seen_now["b"].allocation is None
            assert same(seen_now["a"].app, guess.guess("a", [])) and same(
                seen_now["b"].app, guess.guess("b", [])
            )
            assert seen_now["a"].app.spreads == seen_now["b"].app.spreads  # two unmeasured jobs look alike
        after = by_time[3.0]
        assert after["a"].allocation == Allocation((1,), BATCH) and after["a"].app is dict(truth)["a"]
        assert after["b"].app is dict(truth)["b"]
    # the same answers either way here, so the same JCTs: boot 2.5 s, then 100 steps at 1.28 s / 0.64 s
    assert jct[False] == jct[True] == {"a": pytest.approx(2.5 + 128.0), "b": pytest.approx(2.5 + 64.0)}


def test_a_job_measured_by_then_sets_the_guess_for_those_that_are_not():
    """The daemon's guess is a typical measured job's speed: the median worker-seconds per sample
    of the jobs that made a step by then, at each one's fastest size."""
    guess = DaemonGuess(
        {"a": [Measured(1, 1, 1.28), Measured(2, 1, 0.6)], "b": [Measured(1, 1, 0.64)], "c": []},
        {"a": 1, "b": 1, "c": BATCH * 10},
        BATCH,
        2,
    )
    one = guess.guess("c", ["a"]).spreads[(1, 1)]
    # a: 2 workers x 0.6 s / 128 samples (its fastest) = 0.009375 s a sample; one worker, a batch of 128
    assert one.step_time[1] == pytest.approx(0.009375 * BATCH)
    both = guess.guess("c", ["a", "b"]).spreads[(1, 1)]
    assert both.step_time[1] == pytest.approx((0.009375 + 0.005) / 2 * BATCH)
