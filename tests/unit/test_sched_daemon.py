"""The live scheduler's decisions against scripted job statuses (taiji/sched/daemon.py; pure, no
processes): shrink before grow, a shrink that never lands, clamping, measurements, restart."""

import json

import pytest

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation
from taiji.sched.costs import SYSTEMS
from taiji.sched.livejob import Observed
from taiji.sched.policies import make_policy
from taiji.sched.rounds import Change
from taiji.sched.scheduler import Scheduler


class Scripted:
    """A policy that gives each job the workers it is told to."""

    name = "scripted"

    def __init__(self):
        self.plan = {}
        self.seen = []

    def allocate(self, now, cluster, jobs):
        self.seen.append([job.name for job in jobs])
        return {
            job.name: Allocation((self.plan[job.name],), job.spec.batch_size)
            for job in jobs
            if self.plan.get(job.name)
        }


def running(sched, now, job_id, size, version, sps=1000.0, step=None):
    step = int(now * 10) if step is None else step
    sched.observe(
        now,
        job_id,
        Observed(
            size=size, version=version, step=step, batch_size=128, position=1280, end=60000, samples_per_s=sps
        ),
    )


def test_a_second_job_shrinks_the_first_before_it_starts_and_its_end_grows_the_first_back():
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy, shrink_timeout=30.0)
    a = sched.submit(0.0, ["python", "a.py"], min_np=1, max_np=4)
    policy.plan = {a.id: 4}
    assert sched.round(0.0) == [Change(a.id, (0,), (4,))]
    running(sched, 1.0, a.id, 4, 1)
    b = sched.submit(5.0, ["python", "b.py"], min_np=2, max_np=2)
    policy.plan = {a.id: 2, b.id: 2}
    assert sched.round(10.0) == [Change(a.id, (4,), (2,))], "the shrink alone: b waits"
    assert sched.tick(11.0) == []
    running(sched, 12.0, a.id, 2, 2)
    assert sched.tick(12.0) == [Change(b.id, (0,), (2,))]
    sched.launched(12.0, b.id)
    running(sched, 13.0, b.id, 2, 1)
    sched.ended(50.0, b.id, "finished")
    policy.plan = {a.id: 4}
    assert sched.round(60.0) == [Change(a.id, (2,), (4,))]
    assert [n for _, n in sched.jobs[a.id].allocations] == [4, 2]


def a_on_all_slots_then_b_arrives(shrink_timeout, at):
    """Job a runs on all 4 slots; b (2 workers) arrives and the round at ``at`` asks a to shrink to 2."""
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy, shrink_timeout=shrink_timeout)
    a = sched.submit(0.0, ["a"], max_np=4)
    policy.plan = {a.id: 4}
    sched.round(0.0)
    running(sched, 1.0, a.id, 4, 1)
    b = sched.submit(2.0, ["b"], min_np=2, max_np=2)
    policy.plan = {a.id: 2, b.id: 2}
    sched.round(at)
    return policy, sched, a, b


def test_a_shrink_that_never_lands_keeps_the_slots_and_the_new_job_waits():
    policy, sched, a, b = a_on_all_slots_then_b_arrives(shrink_timeout=5.0, at=2.0)
    assert sched.tick(8.0) == [] and sched.rounds.deferred == [b.id]
    assert sched.jobs[b.id].state == "queued"


def test_targets_are_clamped_to_each_jobs_bounds_and_queued_jobs_below_their_minimum_wait():
    policy = Scripted()
    sched = Scheduler(slots=8, policy=policy)
    a = sched.submit(0.0, ["a"], min_np=2, max_np=3)
    b = sched.submit(0.0, ["b"], min_np=4, max_np=8)
    policy.plan = {a.id: 6, b.id: 2}
    assert sched.round(0.0) == [Change(a.id, (0,), (3,))], "a capped at 3; b given 2 < its minimum 4 waits"
    running(sched, 1.0, a.id, 3, 1)
    policy.plan = {b.id: 5}  # the policy forgets a: a running job keeps its minimum
    assert sched.round(2.0) == [Change(a.id, (3,), (2,))]
    running(sched, 3.0, a.id, 2, 2)
    assert sched.tick(3.0) == [Change(b.id, (0,), (5,))]


def test_step_times_are_measured_only_while_a_job_holds_still():
    sched = Scheduler(slots=4, policy=Scripted())
    a = sched.submit(0.0, ["a"])
    running(sched, 1.0, a.id, 2, 1, sps=1000.0)  # the first read: the size just changed
    running(sched, 2.0, a.id, 2, 1, sps=1280.0)
    running(sched, 3.0, a.id, 4, 2, sps=2000.0)  # resized: not steady
    running(sched, 4.0, a.id, 4, 2, sps=2560.0)
    running(sched, 4.5, a.id, 4, 2, sps=2560.0, step=40)  # the same status read again: not a new measurement
    assert sched.jobs[a.id].measured == {"2@128": [0.1], "4@128": [0.05]}  # workers@batch


def test_submissions_that_can_never_run_are_refused_with_the_reason():
    sched = Scheduler(slots=4, policy=Scripted())
    with pytest.raises(ConfigError, match="at least 6 workers but this scheduler has 4"):
        sched.submit(0.0, ["a"], min_np=6, max_np=8)
    for kwargs in ({"min_np": 0}, {"min_np": 3, "max_np": 2}, {"weight": 0}, {"np": 5}):
        with pytest.raises(ConfigError):
            sched.submit(0.0, ["a"], **kwargs)
    with pytest.raises(ConfigError):
        sched.submit(0.0, [])


def test_a_restarted_daemon_resumes_from_the_saved_state():
    policy, sched, a, b = a_on_all_slots_then_b_arrives(shrink_timeout=30.0, at=3.0)
    # a's shrink is in flight when the daemon dies
    saved = json.loads(json.dumps(sched.to_json()))
    again = Scheduler(slots=4, policy=policy, shrink_timeout=30.0)
    again.load_json(saved)
    assert again.jobs[a.id].size == 4 and again.rounds.asked[a.id].target == (2,)
    assert again.submit(4.0, ["c"]).id not in (a.id, b.id), "ids are not reused"
    running(again, 5.0, a.id, 2, 2)
    policy.plan = {a.id: 2, b.id: 2}
    assert Change(b.id, (0,), (2,)) in again.round(6.0)
    with pytest.raises(ConfigError, match="same --slots"):
        Scheduler(slots=8, policy=policy).load_json(saved)


def test_the_simulators_policies_schedule_live_jobs_without_oversubscribing():
    for name in ("fifo", "pcrr", "tiresias"):
        sched = Scheduler(slots=4, policy=make_policy(name, SYSTEMS["taiji"]))
        jobs = [sched.submit(float(i), [f"job{i}"], min_np=1, max_np=4, np=2) for i in range(3)]
        changes = sched.round(3.0)
        started = {c.job: c.after[0] for c in changes}
        assert 0 < sum(started.values()) <= 4, (name, changes)
        for job in jobs:
            if job.id in started:
                running(sched, 4.0, job.id, started[job.id], 1)
        later = sched.round(10.0) + sched.tick(11.0)
        assert sum(j.size for j in sched.jobs.values()) <= 4, (name, later)


def test_a_work_hint_stands_in_for_a_queued_jobs_length_until_it_reports_its_own():
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy)
    short = sched.submit(0.0, ["a"], work=1000)
    unknown = sched.submit(0.0, ["b"])
    views = {view.name: view for view in (sched.view_of(job) for job in sched.jobs.values())}
    assert views[short.id].app.target_progress == 8.0  # ceil(1000 / 128) steps
    assert views[unknown.id].app.target_progress == 8.0  # a typical job: the one with a hint
    running(sched, 1.0, short.id, 2, 1)  # reports end = 60000
    assert sched.view_of(sched.jobs[short.id]).app.target_progress == 469.0
    with pytest.raises(ConfigError):
        sched.submit(0.0, ["c"], work=-1)


def test_attained_service_counts_the_allocation_held_now():
    sched = Scheduler(slots=4, policy=Scripted())
    a = sched.submit(0.0, ["a"])
    running(sched, 10.0, a.id, 2, 1)
    assert sched.view_of(sched.jobs[a.id], now=40.0).attained_gpu_s == 60.0


def test_pcrr_serves_the_heavier_of_two_equal_jobs_first():
    for heavy in (0, 1):
        sched = Scheduler(slots=2, policy=make_policy("pcrr", SYSTEMS["taiji"]))
        jobs = [
            sched.submit(0.0, [f"job{i}"], min_np=2, max_np=2, work=60000, weight=10.0 if i == heavy else 1.0)
            for i in range(2)
        ]
        assert sched.view_of(jobs[heavy]).weight == 10.0
        assert sched.round(1.0) == [Change(jobs[heavy].id, (0,), (2,))], heavy


def test_las_threshold_takes_worker_seconds_or_auto():
    import argparse

    from taiji.launch.sched.cli import build_parser, las_threshold

    assert las_threshold("auto") == "auto" and las_threshold("60") == 60.0
    for bad in ("0", "-1", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            las_threshold(bad)
    assert build_parser().parse_args(["serve"]).las_threshold is None  # main: tiresias then takes "auto"


def test_a_shrink_asked_while_a_job_boots_frees_its_slot_only_after_its_first_step():
    """A launcher takes a shrink into its cluster before its workers trained, but the worker taken
    out is a process still booting: it leaves at the first step boundary. Until then the slot is
    held, so a start asked for it waits (else three processes would boot on two slots)."""
    policy = Scripted()
    sched = Scheduler(slots=2, policy=policy)
    a = sched.submit(0.0, ["a"], min_np=1, max_np=2)
    policy.plan = {a.id: 2}
    assert sched.round(0.0) == [Change(a.id, (0,), (2,))]
    sched.launched(0.5, a.id)
    running(sched, 1.0, a.id, 2, 1, sps=0.0, step=0)  # its store: 2 workers, no step yet
    b = sched.submit(2.0, ["b"], min_np=1, max_np=1)
    policy.plan = {a.id: 1, b.id: 1}
    assert sched.round(2.0) == [Change(a.id, (2,), (1,))]
    running(sched, 2.5, a.id, 1, 2, sps=0.0, step=0)  # the shrink is in its cluster; nobody stepped
    assert sched.tick(3.0) == [] and sched.holds()[a.id] == (2,)
    running(sched, 4.0, a.id, 1, 2, step=1)  # its first step: the worker taken out left
    assert sched.tick(4.0) == [Change(b.id, (0,), (1,))]
