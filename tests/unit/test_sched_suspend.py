"""Suspend and resume in the live scheduler's decisions (pure; taiji/sched/preemption.py and
taiji/sched/scheduler.py): a policy's 0 suspends a job, the hysteresis and the hourly bound, a
suspended job resumes at another size, priority preemption of gangs, the cost model shared with
the simulator, and the signed replies of the request channel. Processes:
tests/integration/test_sched_suspend_procs.py."""

import dataclasses
import json
import socket
import threading

import pytest

from taiji.errors import AuthError, StoreError
from taiji.launch.sched.channel import ask
from taiji.sched.cluster import Allocation
from taiji.sched.costs import SYSTEMS, ResizeCost, resize_cost
from taiji.sched.livejob import Observed
from taiji.sched.policies import Tiresias
from taiji.sched.preemption import Running, SuspendRules, may_suspend, priority_victims, suspension_of
from taiji.sched.rounds import Change
from taiji.sched.scheduler import Scheduler


class Scripted:
    """A policy that gives each job the workers it is told to (on host 0)."""

    name = "scripted"

    def __init__(self):
        self.plan = {}

    def allocate(self, now, cluster, jobs):
        return {
            job.name: Allocation((self.plan[job.name],) + (0,) * (cluster.num_hosts - 1), job.spec.batch_size)
            for job in jobs
            if self.plan.get(job.name)
        }


def seen(sched, now, job_id, size, step, version=1):
    sched.observe(
        now,
        job_id,
        Observed(
            size=size,
            version=version,
            step=step,
            batch_size=64,
            position=64 * step,
            end=64000,
            samples_per_s=640.0,
        ),
    )


def started(sched, now, job_id, size, step=1):
    sched.launched(now, job_id)
    seen(sched, now, job_id, size, step)


def test_a_job_is_not_suspended_before_its_first_step_since_it_started():
    sched = Scheduler(slots=2, policy=Scripted(), rules=SuspendRules(min_run_factor=0.0))
    job = sched.submit(0.0, ["a"], max_np=2, checkpoint_dir="/c/a")
    started(sched, 1.0, job.id, 2, step=0)
    assert not sched.may_suspend(job, 100.0), "booting: no step committed yet"
    seen(sched, 2.0, job.id, 2, step=3)
    assert sched.may_suspend(job, 100.0)
    sched.suspending_job(3.0, job.id)
    sched.suspended(4.0, job.id, step=3)
    started(sched, 5.0, job.id, 2, step=3)  # resumed from step 3: nothing trained since
    assert not sched.may_suspend(job, 100.0)
    seen(sched, 6.0, job.id, 2, step=4)
    assert sched.may_suspend(job, 100.0)


def test_how_a_launchers_exit_leaves_its_job():
    # (resumable exit, stopped unsaved, asked to suspend, home lost, latest checkpoint, home)
    assert suspension_of(True, False, True, False, 40, "h0") == (40, ""), "stopped on the notice, resumable"
    assert suspension_of(False, False, False, True, 40, "h0") == (40, "its home host h0 was lost")
    assert suspension_of(False, False, False, True, None, "h0") is None, (
        "lost with nothing to resume from: failed"
    )
    assert suspension_of(False, True, True, False, None, "h0") == (
        0,
        "stopped before its first checkpoint: it starts over",
    ), "asked while its workers were starting"
    assert suspension_of(False, True, False, False, None, "h0") is None, "a SIGTERM nobody asked for ends it"
    assert suspension_of(False, False, True, False, None, "h0") is None, "asked, but it failed: failed"
    assert suspension_of(False, False, False, False, 40, "h0") is None, (
        "finished or failed with checkpoints: ended"
    )


def test_hysteresis_and_the_hourly_bound():
    rules = SuspendRules(max_per_hour=2, min_run_factor=3.0)
    assert not may_suspend(False, [], 0.0, 1000.0, 10.0, rules), "--no-preempt"
    assert not may_suspend(True, [], 990.0, 1000.0, 10.0, rules), "resumed, ran 10 s < 3 x its 10 s cost"
    assert may_suspend(True, [], 970.0, 1000.0, 10.0, rules)
    assert may_suspend(True, [], 990.0, 1000.0, 10.0, rules, resumed=False), (
        "a first start pays no resume back"
    )
    assert not may_suspend(True, [], 990.0, 1000.0, 10.0, rules, trained=False, resumed=False), (
        "but not booting"
    )
    assert not may_suspend(True, [100.0, 900.0], 990.0, 1000.0, 10.0, rules, resumed=False), (
        "nor past the bound"
    )
    assert not may_suspend(True, [100.0, 900.0], 0.0, 1000.0, 10.0, rules), "two in the last hour"
    assert may_suspend(True, [100.0, 900.0], 0.0, 3800.0, 10.0, rules), "the first is an hour old"
    assert not may_suspend(True, [], 0.0, 1000.0, 10.0, rules, trained=False), "still booting: no step yet"


def test_priority_suspends_the_fewest_lower_jobs_and_only_if_the_gang_then_fits():
    running = [
        Running("low-a", 0, True, (2, 0), 10.0),
        Running("low-b", 0, True, (1, 1), 20.0),
        Running("mid", 1, True, (0, 3), 5.0),
    ]
    assert priority_victims(3, 2, [1, 0], running) == (0, ["low-a"]), "one job frees enough on host 0"
    assert priority_victims(4, 1, [0, 0], running) is None, "host 0 has 3 slots of lower jobs, host 1 only 1"
    assert priority_victims(2, 0, [0, 0], running) is None, "nothing of a lower class"
    assert priority_victims(1, 5, [0, 1], running) == (1, []), "it fits without anyone's suspension"


def test_a_policys_zero_suspends_a_job_which_resumes_later_at_another_size():
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy, rules=SuspendRules(min_run_factor=0.0))
    a = sched.submit(0.0, ["a"], min_np=2, max_np=4, checkpoint_dir="/ckpt/a")
    pinned = sched.submit(0.0, ["p"], min_np=1, max_np=1, preemptible=False, checkpoint_dir="/ckpt/p")
    policy.plan = {a.id: 3, pinned.id: 1}
    assert sched.round(0.0) == [Change(a.id, (0,), (3,)), Change(pinned.id, (0,), (1,))]
    started(sched, 1.0, a.id, 3, step=5)
    started(sched, 1.0, pinned.id, 1)
    b = sched.submit(10.0, ["b"], min_np=4, max_np=4, checkpoint_dir="/ckpt/b")
    policy.plan = {b.id: 4}  # the policy gives a and the pinned job nothing
    changes = sched.round(20.0)
    assert changes == [Change(a.id, (3,), (0,))] and changes[0].kind == "suspend", "the pinned job keeps 1"
    sched.suspending_job(20.0, a.id)
    assert sched.round(21.0) == [], "b waits: a's slots are not free while its launcher runs"
    assert sched.tick(22.0) == []
    sched.suspended(25.0, a.id, step=40)
    job = sched.jobs[a.id]
    assert (job.state, job.stopped_at, job.size, job.suspensions) == ("suspended", 40, 0, [25.0])
    assert sched.tick(25.0) == [], "b needs 4, 3 are free (the pinned job holds one)"
    policy.plan = {a.id: 2, pinned.id: 1}
    assert sched.round(30.0) == [Change(a.id, (0,), (2,))], "resumed at 2 workers"
    sched.launched(30.0, a.id)
    seen(sched, 34.0, a.id, 2, step=41)
    assert job.state == "running" and job.costs == [pytest.approx(5.0 + 4.0)], "stall + boot to first step"
    assert sched.view_of(job).progress == pytest.approx(41) and sched.view_of(job).restarts == 1
    assert [n for _, n in job.allocations] == [3, 0, 2]
    saved = Scheduler(slots=4, policy=policy)
    saved.load_json(json.loads(json.dumps(sched.to_json())))
    assert saved.jobs[a.id].suspensions == [25.0] and saved.jobs[pinned.id].preemptible is False


def test_within_the_hysteresis_after_a_resume_or_without_a_checkpoint_dir_a_job_keeps_its_minimum():
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy, rules=SuspendRules(min_run_factor=3.0, guess_cost_s=10.0))
    a = sched.submit(0.0, ["a"], min_np=2, max_np=4, checkpoint_dir="/ckpt/a")
    c = sched.submit(0.0, ["c"], min_np=1, max_np=1)  # no checkpoint directory: nothing to resume from
    policy.plan = {a.id: 3, c.id: 1}
    sched.round(0.0)
    sched.launched(0.0, a.id)
    seen(sched, 8.0, a.id, 3, 1)  # its boot: 8 s from launch to its first step
    started(sched, 0.0, c.id, 1)
    assert sched.suspend_cost(sched.jobs[a.id]) == pytest.approx(8.0), "no suspension measured: its boot"
    b = sched.submit(10.0, ["b"], min_np=4, max_np=4, checkpoint_dir="/ckpt/b")
    policy.plan = {b.id: 4}
    assert [(ch.job, ch.kind) for ch in sched.round(12.0)] == [(a.id, "suspend")], (
        "a first start is not held back (12 s < 3 x 8 s): no resume cost was paid for it"
    )
    sched.suspending_job(12.0, a.id)
    sched.suspended(14.0, a.id, step=1)
    policy.plan = {a.id: 3}
    sched.round(15.0)
    sched.launched(15.0, a.id)
    seen(sched, 21.0, a.id, 3, 2)  # resumed: 2 s stall + 6 s to its first step
    assert sched.suspend_cost(sched.jobs[a.id]) == pytest.approx(8.0)
    policy.plan = {b.id: 4}
    assert sched.round(30.0) == [Change(a.id, (3,), (2,))], "resumed 15 s ago < 3 x 8 s: kept at its minimum"
    seen(sched, 31.0, a.id, 2, 3, version=2)
    assert [(ch.job, ch.kind) for ch in sched.round(40.0)] == [(a.id, "suspend")]


def test_tiresias_live_suspends_the_job_with_more_attained_service():
    sched = Scheduler(slots=4, policy=Tiresias(threshold_gpu_s=100.0), rules=SuspendRules(min_run_factor=0.0))
    old = sched.submit(0.0, ["old"], min_np=4, max_np=4, checkpoint_dir="/c/old")
    sched.round(0.0)
    started(sched, 0.0, old.id, 4)
    new = sched.submit(50.0, ["new"], min_np=4, max_np=4, checkpoint_dir="/c/new")
    changes = sched.round(60.0)  # old holds 240 worker-seconds > 100: demoted below the new arrival
    assert [(c.job, c.kind) for c in changes] == [(old.id, "suspend")]
    sched.suspending_job(60.0, old.id)
    sched.suspended(62.0, old.id, step=30)
    assert sched.tick(62.0) == [Change(new.id, (0,), (4,))]


def test_a_higher_class_arrival_suspends_lower_ones_only_if_its_gang_fits():
    policy = Scripted()
    sched = Scheduler(slots=4, policy=policy, rules=SuspendRules(min_run_factor=0.0))
    low = sched.submit(0.0, ["low"], min_np=1, max_np=3, checkpoint_dir="/c/low")
    pinned = sched.submit(0.0, ["pinned"], min_np=1, max_np=1, preemptible=False, checkpoint_dir="/c/p")
    policy.plan = {low.id: 3, pinned.id: 1}
    sched.round(0.0)
    started(sched, 0.0, low.id, 3)
    started(sched, 0.0, pinned.id, 1)
    big = sched.submit(10.0, ["big"], min_np=4, max_np=4, priority=1, checkpoint_dir="/c/big")
    assert sched.round(20.0) == [], "4 slots only if the pinned job went too: nobody is suspended"
    sched.ended(21.0, big.id, "cancelled")
    high = sched.submit(22.0, ["high"], min_np=3, max_np=4, priority=1, checkpoint_dir="/c/high")
    assert sched.round(30.0) == [Change(low.id, (3,), (0,))]
    sched.suspending_job(30.0, low.id)
    sched.suspended(31.0, low.id, step=7)
    assert sched.tick(31.0) == [Change(high.id, (0,), (3,))]
    started(sched, 32.0, high.id, 3)
    policy.plan = {low.id: 3, pinned.id: 1}  # the policy would give the high class's slots back to low
    assert sched.round(40.0) == [], "a 0 never suspends a job for a lower class"
    assert sched.jobs[high.id].suspending is None


def test_the_simulator_charges_a_resume_not_a_start_to_a_preempted_job():
    taiji = SYSTEMS["taiji"]
    new = Allocation((2,), 64)
    assert resize_cost(taiji, None, new) == taiji.start
    assert resize_cost(taiji, None, new, resumed=True) == taiji.resume_s > 100 * taiji.grow
    assert resize_cost(SYSTEMS["restart"], None, new, resumed=True) == 30.0


def _ask_a_server_that_replies(reply: bytes, error: type, match: str) -> None:
    """``ask`` a one-connection server that sends its nonce, reads the request, then sends ``reply``
    (b"": it closes the connection instead) and raises ``error``."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.sendall(b'{"nonce": "00"}\n')
            conn.recv(65536)
            conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(error, match=match):
            ask(f"127.0.0.1:{server.getsockname()[1]}", b"k" * 32, {"op": "status"}, timeout=5.0)
    finally:
        thread.join(5.0)
        server.close()


def test_a_reply_not_signed_with_the_daemons_secret_is_refused():
    forged = json.dumps({"reply": {"ok": True, "job": "s0001"}, "mac": "0" * 64}).encode() + b"\n"
    _ask_a_server_that_replies(forged, AuthError, "not signed with this scheduler's secret")


def test_a_daemon_gone_before_its_reply_is_no_daemon_not_a_forged_reply():
    """A daemon killed between its nonce and its reply closes the connection: the agent must take
    that as a daemon to ask again (StoreError), not as another process answering (AuthError)."""
    _ask_a_server_that_replies(b"", StoreError, "no scheduler daemon answered")


def test_status_and_plot_show_a_suspension(tmp_path):
    from taiji.launch.sched.cli import format_status, plot_state

    sched = Scheduler(slots=2, policy=Scripted(), rules=SuspendRules(min_run_factor=0.0))
    job = sched.submit(0.0, ["a"], max_np=2, checkpoint_dir="/c/a", name="long")
    started(sched, 1.0, job.id, 2)
    sched.suspending_job(5.0, job.id)
    assert "running (suspending)" in format_status({**sched.to_json(), "now": 6.0})
    sched.suspended(6.0, job.id, step=12)
    assert "suspended at step 12" in format_status({**sched.to_json(), "now": 7.0})
    (tmp_path / "state.json").write_text(json.dumps(sched.to_json()))
    assert plot_state(tmp_path, str(tmp_path / "a.png")).read_bytes()[:4] == b"\x89PNG"


def _cells(table: str) -> dict[str, str]:
    """The first job's row of a status table, by column (columns start where their headings do)."""
    header, row = table.splitlines()[:2]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, starts[1:] + [len(header) + 99])}


def test_status_shows_each_jobs_batch_and_noise_scale_from_its_run_log():
    from taiji.launch.sched.cli import format_status
    from taiji.sched.goodput import BatchStats

    sched = Scheduler(slots=2, policy=Scripted())
    job = sched.submit(0.0, ["a"], max_np=2, name="gns")
    started(sched, 1.0, job.id, 2)
    assert _cells(format_status({**sched.to_json(), "now": 2.0}))["NOISE"] == "-", (
        "none until the run log has one"
    )
    sched.observe(
        3.0,
        job.id,
        Observed(size=2, version=1, step=9, batch_size=288, position=9, end=100, samples_per_s=50.0),
    )
    sched.read_run_log(job.id, BatchStats(init_batch=64, batch=288, largest=288, noise_scale=1234.5))
    cells = _cells(format_status({**sched.to_json(), "now": 4.0}))
    assert (cells["BATCH"], cells["NOISE"]) == ("288", "1234")
    sched.read_run_log(job.id, BatchStats(init_batch=64, batch=288, largest=288, noise_scale=56_700.0))
    assert "56.7k" in format_status({**sched.to_json(), "now": 5.0})


def test_a_lost_home_host_is_fenced_before_its_job_may_resume_elsewhere(tmp_path):
    import sys
    import time

    from taiji.launch.sched.agent import SchedAgent
    from taiji.launch.sched.hosts import AgentHosts

    hosts = AgentHosts(
        [("10.0.0.1", 1), ("10.0.0.2", 1)], host_timeout=3.0, fence_s=5.0, checkpoint_grace=5.0
    )
    hosts.adopt("s1", 0)
    now = time.monotonic()
    reply = hosts.on_poll(now, {"host": "10.0.0.1", "slots": 1, "processes": {"s1/launcher": None}})
    assert reply["fence_s"] == 5.0, "every reply tells the agents the fence"
    assert (0, False) in hosts.poll_hosts(now + 4.0)
    assert hosts.outcome("s1") is None and hosts.running("s1") and not hosts.home_lost("s1"), (
        "fenced soon: wait"
    )
    hosts.agents["10.0.0.1"].seen = now - 21.0  # silent for longer than fence + checkpoint grace + stop grace
    assert hosts.home_lost("s1") and hosts.outcome("s1") == 137
    # the agent's side: a daemon silent for longer than the fence stops this host's launchers
    agent = SchedAgent("127.0.0.1:1", b"k" * 32, "10.0.0.1", 1, tmp_path)
    agent.sessions.start(
        "s1/launcher", [sys.executable, "-c", "import time; time.sleep(60)"], "", tmp_path / "l.log"
    )
    try:
        agent.fence_s, agent.answered = 5.0, time.monotonic() - 6.0
        agent.fence()
        assert agent.sessions.children["s1/launcher"].wait(10) == -15
    finally:
        agent.sessions.stop(["s1/launcher"], grace=1.0)


def test_the_simulators_floor_keeps_started_jobs_that_a_preemptive_policy_suspends():
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    specs = [
        JobSpec("long", 0.0, "yolov3", 4, 128),
        JobSpec("short", 6000.0, "ncf", 4, 128),
        JobSpec("short2", 12000.0, "ncf", 4, 128),
    ]
    las = lambda: Tiresias(threshold_gpu_s=20000.0)  # noqa: E731  (long is demoted before short arrives)
    cost = ResizeCost(start=20.0, grow=0.03, shrink=0.01, move=0.04, resume=30.0)
    config = SimConfig(cluster=Cluster(num_hosts=1, gpus_per_host=4), resize=cost, interval_s=60.0)
    free = {r.name: r for r in simulate(specs, las(), config).records}
    assert free["long"].restarts >= 3, "without rules Tiresias suspends long when each short job arrives"
    assert free["short2"].start_time < 12100.0
    # long's first start is not held back: short starts on arrival. long resumes when short ends
    # (~10740 s) and must then run 360 x its resume cost (30 s) = 10800 s before another suspension,
    # so short2 waits for long to finish (~20790 s)
    ruled = SimConfig(**{**config.__dict__, "suspend_rules": SuspendRules(min_run_factor=360.0)})
    kept = {r.name: r for r in simulate(specs, las(), ruled).records}
    assert kept["short"].start_time == free["short"].start_time == 6000.0
    assert (
        kept["long"].restarts == 2
        and kept["long"].end_time <= kept["short2"].start_time < kept["long"].end_time + 100
    )
    # and a job with less left to train than its cost is not suspended
    ending = SimConfig(
        **{**config.__dict__, "suspend_rules": SuspendRules(min_run_factor=0.0, min_left_factor=1e6)}
    )
    assert {r.name: r.jct for r in simulate(specs, las(), ending).records} == {
        r.name: r.jct
        for r in simulate(specs, las(), SimConfig(**{**config.__dict__, "preemption": False})).records
    }
    never = SimConfig(**{**config.__dict__, "suspend_rules": SuspendRules(max_per_hour=0)})
    floor = {
        r.name: r
        for r in simulate(specs, las(), SimConfig(**{**config.__dict__, "preemption": False})).records
    }
    assert {r.name: r.jct for r in simulate(specs, las(), never).records} == {
        n: r.jct for n, r in floor.items()
    }, "no suspension allowed: the floor"


@pytest.mark.parametrize("round_s, suspends", [(2.0, True), (None, False)])
def test_pcrr_live_plans_its_first_slot_as_long_as_the_daemons_round(round_s, suspends):
    """A long job holding every slot, short ones arriving: PCRR with the LP's first slot = the 2 s
    round suspends it for them; with a 60 s first slot, which a 10 s job finishes in whether it runs
    now or not, the long one keeps its slots round after round."""
    from taiji.sched.policies import make_policy

    policy = make_policy("pcrr", SYSTEMS["taiji"], round_s=round_s)
    assert (policy.slot_s, policy.slots) == ((2.0, 13) if round_s else (60.0, 8)), "the same ~2.1 h horizon"
    sched = Scheduler(slots=2, policy=policy, rules=SuspendRules())
    long = sched.submit(0.0, ["long"], min_np=2, max_np=2, work=120000, checkpoint_dir="/c/long")
    sched.round(0.0)
    sched.launched(0.5, long.id)
    shorts = [
        sched.submit(at, ["short"], min_np=1, max_np=2, work=6000, checkpoint_dir=f"/c/{at}")
        for at in (14.9, 26.2, 30.6)
    ]
    kinds = []
    for now in range(8, 40, 2):  # 1460 samples/s at 2 workers (0.088 s a step of 128): ~80 s left
        step = 1 + int((now - 8) * 1460 / 128)
        sched.observe(
            float(now),
            long.id,
            Observed(
                size=2,
                version=1,
                step=step,
                batch_size=128,
                position=128 * step,
                end=120000,
                samples_per_s=1460.0,
            ),
        )
        kinds += [(c.job, c.kind) for c in sched.round(float(now))]
    assert ((long.id, "suspend") in kinds) is suspends and not any(
        j in dict(kinds) for j in (s.id for s in shorts)
    )


class Timed:
    """A policy whose answer depends on the time: ``plan(now)`` -> {job: workers on host 0}."""

    name = "timed"

    def __init__(self, plan):
        self.plan = plan

    def allocate(self, now, cluster, jobs):
        return {
            job.name: Allocation((n,), job.spec.batch_size)
            for job in jobs
            for name, n in self.plan(now).items()
            if name == job.name and n
        }


def test_the_simulator_holds_a_jobs_min_np_and_its_boot_as_the_daemon_does():
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    cost = ResizeCost(start=10.0, grow=0.03, shrink=0.01, move=0.04, resume=12.0)
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2), resize=cost, interval_s=1.0, preemption=False
    )
    specs = [JobSpec("rigid", 0.0, "cifar10", 2, 128), JobSpec("short", 20.0, "cifar10", 1, 128)]
    split = Timed(lambda now: {"rigid": 2} if now < 20 else {"rigid": 1, "short": 1})
    free = {r.name: r for r in simulate(specs, split, config).records}
    floor = {
        r.name: r
        for r in simulate(
            specs, split, SimConfig(**{**config.__dict__, "min_replicas": (("rigid", 2),)})
        ).records
    }
    assert free["short"].start_time < 25.0, "without a --min-np the rigid job shrinks to 1 for it"
    assert floor["short"].start_time >= floor["rigid"].end_time, "below its --min-np: kept whole (the floor)"
    # a grow while it still boots does not cut its boot short (live: a booting launcher takes no resize)
    one = SimConfig(cluster=Cluster(num_hosts=1, gpus_per_host=2), resize=cost, interval_s=1.0)
    alone = [JobSpec("a", 0.0, "cifar10", 2, 128)]
    whole = simulate(alone, Timed(lambda now: {"a": 2}), one).records[0]
    grown = simulate(alone, Timed(lambda now: {"a": 1 if now < 1 else 2}), one).records[0]
    assert grown.jct >= whole.jct - 0.1 and grown.restarts == 2


def test_a_job_the_rules_keep_holds_only_its_min_np_and_a_start_takes_the_slots_left():
    """The daemon clamps a running job the policy left out (and may not suspend) to its --min-np,
    and its rounds start a waiting job on the slots that leaves (down to that job's own --min-np);
    the simulator does the same for jobs with a --min-np, and keeps the whole job without one."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    cost = ResizeCost(start=1.0, grow=0.03, shrink=0.01, move=0.04, resume=2.0)
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2),
        resize=cost,
        interval_s=1.0,
        suspend_rules=SuspendRules(max_per_hour=0),
    )  # nothing may be suspended
    specs = [JobSpec("first", 0.0, "cifar10", 2, 128), JobSpec("next", 10.0, "cifar10", 2, 128)]
    swap = Timed(lambda now: {"first": 2} if now < 10 else {"next": 2})  # the policy turns to "next"
    whole = {r.name: r for r in simulate(specs, swap, config).records}
    assert whole["next"].start_time >= whole["first"].end_time, (
        "no --min-np known: kept whole, the start waits"
    )
    floors = SimConfig(**{**config.__dict__, "min_replicas": (("first", 1), ("next", 1))})
    clamped = {r.name: r for r in simulate(specs, swap, floors).records}
    assert clamped["next"].start_time == 10.0 < clamped["first"].end_time, (
        "first keeps 1, next starts on the other"
    )
    assert clamped["first"].restarts == 2, "its start and its shrink to its --min-np"
    rigid = SimConfig(**{**config.__dict__, "min_replicas": (("first", 1), ("next", 2))})
    waits = {r.name: r for r in simulate(specs, swap, rigid).records}
    assert waits["next"].start_time >= waits["first"].end_time, (
        "one free slot is below next's --min-np: it waits"
    )


def test_the_simulators_rounds_fall_when_the_daemons_did():
    """A replay's rounds are the daemon's (their times as it recorded them), then every interval."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    cost = ResizeCost(start=1.0, grow=0.03, shrink=0.01, move=0.04)
    specs = [JobSpec("a", 0.1, "cifar10", 1, 128), JobSpec("b", 3.2, "cifar10", 1, 128)]
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2), resize=cost, interval_s=2.0, max_time_s=20.0
    )
    fixed = {
        r.name: r.start_time for r in simulate(specs, Timed(lambda now: {"a": 1, "b": 1}), config).records
    }
    assert fixed == {"a": 2.0, "b": 4.0}, "every 2 s from 0"
    replayed = SimConfig(**{**config.__dict__, "round_times": (0.7, 3.1)})
    assert {
        r.name: r.start_time for r in simulate(specs, Timed(lambda now: {"a": 1, "b": 1}), replayed).records
    } == {"a": 0.7, "b": 5.1}, "the recorded rounds, then every 2 s after the last"


def test_the_scheduler_records_its_rounds_and_keeps_them_across_a_restart():
    sched = Scheduler(slots=2, policy=Tiresias(threshold_gpu_s=None))
    assert sched.round(1.0) == [] and sched.round_times == [], "no job: the policy did not run"
    sched.submit(2.0, ["job"], min_np=1, max_np=2)
    sched.round(2.5)
    sched.round(4.75)
    again = Scheduler(slots=2, policy=Tiresias(threshold_gpu_s=None))
    again.load_json(sched.to_json())
    assert sched.round_times == again.round_times == [2.5, 4.75]


def test_the_scheduler_times_a_grow_from_its_ask_to_its_joiners_arrival():
    sched = Scheduler(slots=2, policy=Tiresias(threshold_gpu_s=None))
    job = sched.submit(0.0, ["job"], min_np=1, max_np=2, np=1)
    assert [c.kind for c in sched.round(0.0)] == ["start"]
    sched.launched(0.0, job.id)
    sched.observe(3.0, job.id, Observed(size=1, version=1, step=1, batch_size=128, samples_per_s=100.0))
    job.requested = 2  # (the policy now gives it both slots)
    assert [c.kind for c in sched.round(4.0)] == ["grow"] and job.growing == 4.0
    sched.request_failed(job.id)  # its launcher did not answer: not asked, not timed
    assert job.growing is None
    assert [c.kind for c in sched.round(6.0)] == ["grow"]
    sched.observe(8.0, job.id, Observed(size=1, version=1, step=5, batch_size=128, samples_per_s=100.0))
    sched.observe(10.5, job.id, Observed(size=2, version=2, step=9, batch_size=128, samples_per_s=200.0))
    assert job.joins == [4.5] and job.growing is None


def linear_jobs(*names: str, steps: int = 100):
    """LIVE jobs of ``steps`` steps of batch 128 at 0.01 s a sample of the local batch (1.28 s a
    step on one worker, 0.64 s on two), for exact timings."""
    from taiji.sched.live import StepModel, live_application
    from taiji.sched.workload import LIVE

    app = lambda name: live_application(name, StepModel(0.0, 0.01, 0.0, 0.0, 0.0), 128, 128 * steps, 1, 2)  # noqa: E731
    return LIVE, tuple((name, app(name)) for name in names)


class Known:
    """A replay's view of jobs whose models are known (``daemon_view``)."""

    def __init__(self, live):
        self.apps = dict(live)

    def guess(self, name, measured):
        return self.apps[name]


def test_a_grows_new_workers_train_only_once_they_joined():
    """Live, a grow's new workers boot and join seconds after it is asked; the job trains at its
    old size meanwhile: the simulator charges ``join`` so, exactly."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, live = linear_jobs("a")
    grows = Timed(lambda now: {"a": 1 if now < 1 else 2})
    jct = {}
    for join in (0.0, 5.0):
        cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0, join=join)
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2), resize=cost, interval_s=1.0, live=live
        )
        jct[join] = simulate([JobSpec("a", 0.0, kind, 2, 128)], grows, config).records[0].jct
    # boot 0-1 s, then 100 steps at 0.64 s; with join 5 s, 1-6 s at 1.28 s a step: 2.5 s later
    assert jct[0.0] == pytest.approx(65.0) and jct[5.0] == pytest.approx(67.5)


def test_what_starts_in_a_suspended_jobs_slots_waits_for_its_stall():
    """Live, a suspended job's slots are free once its launcher checkpointed and exited, and a
    round's starts come after its shrinks: the job started in its place waits for that stall."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, long = linear_jobs("old", steps=1000)
    _, short = linear_jobs("new", steps=10)
    swap = Timed(lambda now: {"old": 2} if now < 10 else {"new": 2})
    specs = [JobSpec("old", 0.0, kind, 2, 128), JobSpec("new", 9.5, kind, 2, 128)]
    jct = {}
    for stall in (0.0, 3.0):
        cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0)
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2),
            resize=cost,
            interval_s=1.0,
            live=long + short,
            job_costs=(("old", dataclasses.replace(cost, stall=stall)),),
        )
        jct[stall] = {r.name: r.jct for r in simulate(specs, swap, config).records}
    # new: round at 10 s, its boot (1 s), the stall, 10 steps of 0.64 s
    assert jct[0.0]["new"] == pytest.approx(0.5 + 1.0 + 6.4) and jct[3.0]["new"] == pytest.approx(
        jct[0.0]["new"] + 3.0
    )


def test_a_start_waits_for_a_suspended_jobs_exit_and_a_round_meanwhile_defers_it():
    """Live, a round's starts wait for its suspensions (the daemon's Rounds: grows after shrinks);
    a later round replaces it, finds the slots still held by the exiting launcher and defers its
    start to a round after the exit. A round within ``same_tick_s`` before the exit ran, live, in
    the tick that saw the launcher gone (the daemon reads its jobs, then runs its round)."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, long = linear_jobs("old", steps=1000)
    _, short = linear_jobs("new", steps=10)
    swap = Timed(lambda now: {"old": 2} if now < 10 else {"new": 1} if now < 11 else {"new": 2})
    specs = [JobSpec("old", 0.0, kind, 2, 128), JobSpec("new", 9.5, kind, 2, 128)]
    cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0, join=5.0)

    def new(stall, **tick):
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2),
            resize=cost,
            interval_s=1.0,
            **tick,
            live=long + short,
            job_costs=(("old", dataclasses.replace(cost, stall=stall)),),
        )
        return next(r for r in simulate(specs, swap, config).records if r.name == "new")

    # the round at 10 s asks `new` to start on 1 once old is gone (12.5 s); the rounds at 11 and 12 s
    # replace it (2 workers) and find old's slots held: it starts at the round at 13 s, on 2
    assert new(2.5).jct == pytest.approx(13.0 - 9.5 + 1.0 + 6.4) and new(2.5).restarts == 1
    assert new(3.0).jct == pytest.approx(13.0 - 9.5 + 1.0 + 6.4)  # gone at 13 s: the round at 13 s starts it
    assert new(3.05).jct == pytest.approx(14.0 - 9.5 + 1.0 + 6.4)  # gone just after: the next round
    assert new(3.05, same_tick_s=0.1).jct == pytest.approx(13.0 - 9.5 + 1.0 + 6.4)  # ... unless in its tick


def test_a_job_named_several_times_in_job_costs_pays_each_launch_its_own_costs():
    """A replay charges each launch of a job what that launch measured: the k-th entry of its
    ``job_costs`` is its k-th launch's (the first, then each resume), with the stall of the
    suspension that ends it and its own exit after its last step."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, long = linear_jobs("old", steps=20)
    _, short = linear_jobs("new", steps=5)
    swap = Timed(lambda now: {"old": 2} if now < 4 else {"new": 2} if now < 11 else {"old": 2})
    cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0)
    own = (
        ("old", dataclasses.replace(cost, stall=2.0)),
        ("old", dataclasses.replace(cost, resume=3.0, exit=0.5)),
    )
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2),
        resize=cost,
        interval_s=1.0,
        live=long + short,
        job_costs=own,
    )
    jobs = {
        r.name: r
        for r in simulate(
            [JobSpec("old", 0.0, kind, 2, 128), JobSpec("new", 3.5, kind, 2, 128)], swap, config
        ).records
    }
    # old: boot 1 s, 3 s of steps of 0.64 s, suspended at 4 s (its slots free at 6 s: new boots 1 s and
    # trains 5 steps, done at 10.2 s); resumed at 11 s (3 s), the 15.3125 steps left, its exit of 0.5 s
    assert jobs["new"].jct == pytest.approx(10.2 - 3.5) and jobs["old"].restarts == 2
    assert jobs["old"].jct == pytest.approx(11.0 + 3.0 + (20 - 3.0 / 0.64) * 0.64 + 0.5)


def test_a_rounds_starts_wait_for_a_shrink_its_job_can_no_longer_take_until_its_launcher_exits():
    """Live, a job that trained to its end takes no shrink: a round that asked it for one waits
    for its launcher's exit, then starts what it asked (the daemon's Rounds). A round that asked it
    nothing starts what fits at once, and what did not fit waits for the next round."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, live = linear_jobs("a", "b", steps=10)
    specs = [JobSpec("a", 0.0, kind, 2, 128), JobSpec("b", 0.0, kind, 2, 128)]
    cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0)
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2),
        resize=cost,
        interval_s=4.0,
        live=live,
        preemption=False,
        exit_s=1.5,
        daemon_view=Known(live),
    )

    def jcts(plan, **change):
        result = simulate(specs, Timed(plan), SimConfig(**{**config.__dict__, **change}))
        return {r.name: r.jct for r in result.records}

    # a: boot 1 s, 10 steps of 0.64 s (the last at 7.4 s), its exit at 8.9 s. The round at 8 s asks
    # it for 1 (b for 1): b starts on 1 at the exit, boots, 10 steps of 1.28 s, exits
    assert jcts(lambda now: {"a": 2} if now < 6 else {"a": 1, "b": 1}) == pytest.approx(
        {"a": 8.9, "b": 8.9 + 1.0 + 12.8 + 1.5}
    )
    # the round at 8 s gives b both slots and keeps a (no preemption): b waits for the round at 12 s
    assert jcts(lambda now: {"a": 2} if now < 6 else {"b": 2}) == pytest.approx(
        {"a": 8.9, "b": 12.0 + 1.0 + 6.4 + 1.5}
    )
    assert jcts(lambda now: {"a": 2} if now < 6 else {"b": 2}, exit_s=0.0) == pytest.approx(
        {"a": 7.4, "b": 8.0 + 1.0 + 6.4}
    )


class Watching(Timed):
    """A Timed policy that records, per round, what it saw of each job: (workers, progress)."""

    def __init__(self, plan):
        super().__init__(plan)
        self.seen = {}

    def allocate(self, now, cluster, jobs):
        self.seen[round(now, 6)] = {
            j.name: (j.allocation and j.allocation.replicas, j.progress) for j in jobs
        }
        return super().allocate(now, cluster, jobs)


def test_in_a_replay_the_policy_sees_a_job_as_late_as_the_daemon_did():
    """Live, the daemon sees a job's steps some time after they happen (its readings lag): the job
    trains from its first step, but a round just after that still sees it boot, and a round just
    after its last step still sees it train with work left. A replay with ``ResizeCost.seen``
    trains it from the same time and shows the policy each job that late."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, live = linear_jobs("a", steps=10)
    seen = {}
    for lag in (0.0, 0.5):
        policy = Watching(lambda now: {"a": 2})
        cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0, seen=lag)
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2),
            resize=cost,
            interval_s=0.25,
            live=live,
            daemon_view=Known(live),
            exit_s=1.0,
        )
        record = simulate([JobSpec("a", 0.0, kind, 2, 128)], policy, config).records[0]
        assert record.jct == pytest.approx(
            1.0 + 6.4 + 1.0
        )  # boot, 10 steps of 0.64 s, exit: the lag costs nothing
        seen[lag] = {t: v["a"] for t, v in policy.seen.items()}
    assert (
        seen[0.0][1.25][0] == 2 and seen[0.5][1.25][0] is None and seen[0.5][1.5][0] == 2
    )  # booting until seen
    for t in (1.75, 3.0, 7.25):  # the same progress, 0.5 s late
        assert seen[0.5][t][1] == pytest.approx(seen[0.0][round(t - 0.5, 6)][1])
    target = seen[0.0][7.25][1] / (
        6.25 / 6.4
    )  # the round after its last step (7.4 s): done, or not yet seen done
    assert seen[0.0][7.5][1] == pytest.approx(target) and seen[0.5][7.5][1] == pytest.approx(
        target * 6.0 / 6.4
    )
    policy = Watching(lambda now: {"a": 2})  # a round reads at its tick: the lag less half a tick
    simulate([JobSpec("a", 0.0, kind, 2, 128)], policy, dataclasses.replace(config, same_tick_s=0.2))
    assert policy.seen[3.0]["a"][1] == pytest.approx(seen[0.0][2.75][1] + (3.0 - 2.75 - 0.3) / 0.64)


def test_in_a_replay_the_policy_sees_a_jobs_workers_from_the_daemons_first_listing_of_them():
    """Live, the daemon lists a job's workers (its launcher's first status) before it sees the
    job's first step: from then a policy sees it hold them, and its attained service counts from
    then. A replay with ``ResizeCost.listed`` shows it so; without, it shows the workers once the
    job's first step is seen, and counts their service from that step."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    class Attained(Watching):
        def allocate(self, now, cluster, jobs):
            self.seen[round(now, 6)] = {
                j.name: (j.allocation and j.allocation.replicas, j.attained_gpu_s) for j in jobs
            }
            return Timed.allocate(self, now, cluster, jobs)

    kind, live = linear_jobs("a", steps=10)
    seen = {}
    for listed in (None, 1.0):
        policy = Attained(lambda now: {"a": 2})
        cost = ResizeCost(start=2.0, grow=0.0, shrink=0.0, move=0.0, seen=0.5, listed=listed)
        config = SimConfig(
            cluster=Cluster(num_hosts=1, gpus_per_host=2),
            resize=cost,
            interval_s=0.25,
            live=live,
            daemon_view=Known(live),
        )
        simulate([JobSpec("a", 0.0, kind, 2, 128)], policy, config)
        seen[listed] = {t: v["a"] for t, v in policy.seen.items()}
    assert (
        seen[1.0][0.75] == (None, 0.0)
        and seen[1.0][1.0] == (2, 0.0)
        and seen[1.0][1.5] == (2, pytest.approx(1.0))
    )
    assert seen[None][1.75] == (None, 0.0) and seen[None][2.25] == (
        None,
        pytest.approx(0.5),
    )  # from its first step
    assert seen[None][2.5] == (2, pytest.approx(1.0))


def test_in_a_replay_a_job_the_daemon_still_sees_booting_is_not_suspended():
    """Live, a job is suspended only once the daemon has seen it run (``may_suspend`` needs its
    workers): a round that would suspend it while it boots, or trains unseen, keeps it."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, live = linear_jobs("a", steps=10)
    blink = Timed(lambda now: {} if 1.1 < now < 1.4 else {"a": 2})  # 0 at the round at 1.25 s only
    cost = ResizeCost(start=1.0, grow=0.0, shrink=0.0, move=0.0, seen=0.5)
    config = SimConfig(cluster=Cluster(num_hosts=1, gpus_per_host=2), resize=cost, interval_s=0.25, live=live)
    record = simulate(
        [JobSpec("a", 0.0, kind, 2, 128)], blink, SimConfig(**{**config.__dict__, "daemon_view": Known(live)})
    ).records[0]
    assert record.restarts == 1 and record.jct == pytest.approx(1.0 + 6.4)


def test_a_trail_gives_the_progress_lag_seconds_ago():
    from taiji.sched.trail import Trail

    trail = Trail(1.0)  # asked at each time it is told of, or later
    asked = {}
    for t, p in ((1.0, 0.0), (2.0, 10.0), (3.0, 30.0), (3.5, 35.0), (4.0, 30.0)):
        trail.add(t, p)
        asked[t] = trail.at(t)
    assert asked == pytest.approx({1.0: 0.0, 2.0: 0.0, 3.0: 10.0, 3.5: 20.0, 4.0: 30.0})
    assert (
        trail.at(4.25) == pytest.approx(32.5) and len(trail.points) <= 3
    )  # only what a later ``at`` may ask is kept
    trail = Trail(0.0)
    trail.add(2.0, 7.0)
    assert trail.at(2.0) == 7.0


def test_in_a_replay_a_booting_jobs_shrink_lands_at_once_and_frees_its_slot_once_it_stepped():
    """Live, a shrink asked while a job boots lands in its cluster at once (it trains on fewer from
    its first step), but frees its slot only once the daemon saw that step (the worker taken out is
    a process booting until then): the round's start waits for it, and the simulated cluster never
    holds more workers than slots."""
    from taiji.sched.cluster import Cluster
    from taiji.sched.sim import SimConfig, simulate
    from taiji.sched.workload import JobSpec

    kind, live = linear_jobs("a", "b", steps=10)
    share = Timed(lambda now: {"a": 2} if now < 1 else {"a": 1, "b": 1})
    cost = ResizeCost(start=3.0, grow=0.0, shrink=0.0, move=0.0)
    config = SimConfig(
        cluster=Cluster(num_hosts=1, gpus_per_host=2),
        resize=cost,
        interval_s=2.0,
        live=live,
        daemon_view=Known(live),
    )
    result = simulate([JobSpec("a", 0.0, kind, 2, 128), JobSpec("b", 1.5, kind, 1, 128)], share, config)
    assert max(used for _, used in result.utilization) <= 2, result.utilization
    jobs = {r.name: r for r in result.records}
    assert jobs["b"].start_time == pytest.approx(3.0)  # the round at 2 s shrinks a, booting until 3 s
    assert jobs["a"].jct == pytest.approx(3.0 + 12.8)  # 10 steps of 1.28 s on 1 worker from its first step
