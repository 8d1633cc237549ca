"""The membership state machine, event by event, without processes."""

import pytest

from taiji.cluster.controller import (
    Beat,
    Bounds,
    FailureReported,
    FatalReported,
    Finish,
    JobDone,
    Kill,
    Log,
    Proposal,
    Publish,
    Spawn,
    Tick,
    WorkerExited,
    WorkerReady,
    initial_state,
)
from taiji_harness.testing import actions_of, feed

run, of = feed, actions_of


def test_grow_spawns_then_publishes_only_when_all_joiners_are_ready():
    s = initial_state(2, Bounds(max_np=8))
    s, acts = run(s, Proposal(4))
    assert [s.ids for s in of(acts, Spawn)] == [("w2", "w3")] and not of(acts, Publish)
    s, acts = run(s, WorkerReady("w2"))
    assert not of(acts, Publish), "running workers must not wait for a booting joiner"
    s, acts = run(s, WorkerReady("w3"))
    [pub] = of(acts, Publish)
    assert pub.config.version == 2 and pub.config.ids == ("w0", "w1", "w2", "w3")


def test_shrink_publishes_at_once_dropping_the_newest():
    s = initial_state(4, Bounds())
    s, acts = run(s, Proposal(2))
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w0", "w1") and pub.config.version == 2
    assert pub.config.lost == (), "a planned shrink: the leavers finish the step with the others"
    s, acts = run(s, WorkerExited("w3", 0, True), WorkerExited("w2", 0, True))
    assert not of(acts, Publish) and not of(acts, Finish)


def test_bounds_clamp_above_and_refuse_below():
    s = initial_state(2, Bounds(min_np=2, max_np=3))
    s, acts = run(s, Proposal(10))
    assert any("clamped" in a.message for a in of(acts, Log)) and [s.ids for s in of(acts, Spawn)] == [
        ("w2",)
    ]
    s2, acts = run(s, Proposal(1))
    assert any("refused" in a.message for a in of(acts, Log)) and s2.desired == 3


def test_crash_publishes_survivors_and_keeps_order():
    s = initial_state(3, Bounds())
    s, acts = run(s, WorkerExited("w1", -9, True))
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w0", "w2") and not of(acts, Spawn)
    assert pub.config.lost == ("w1",)


def test_crash_with_replace_spawns_a_replacement_through_the_grow_path():
    s = initial_state(2, Bounds(replace=True))
    s, acts = run(s, WorkerExited("w0", 1, True))
    assert of(acts, Publish)[0].config.ids == ("w1",)
    assert [s.ids for s in of(acts, Spawn)] == [("w2",)]
    s, acts = run(s, WorkerReady("w2"))
    assert of(acts, Publish)[0].config.ids == ("w1", "w2")


def test_below_min_survivors_wait_for_one_config_with_the_replacement():
    s = initial_state(2, Bounds(min_np=2))
    s, acts = run(s, WorkerExited("w1", -9, True))
    assert not of(acts, Publish) and [s.ids for s in of(acts, Spawn)] == [("w2",)]
    s, acts = run(s, WorkerReady("w2"))
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w0", "w2") and pub.config.version == 2
    assert pub.config.lost == ("w1",)


def test_below_min_with_no_joiner_fails_clearly_after_the_join_timeout():
    s = initial_state(2, Bounds(min_np=2, join_timeout=10))
    s, _ = run(s, WorkerExited("w1", -9, True), now=0)
    s, acts = run(s, Tick(), now=5)
    assert not of(acts, Finish)
    s, acts = run(s, Tick(), now=11)
    [fin] = of(acts, Finish)
    assert fin.code == 137 and "min-np" in fin.reason and fin.failed_worker == "w1"
    assert Kill("w2", "not ready after 10s") in acts


def test_hung_worker_is_killed_when_its_peers_report():
    s = initial_state(3, Bounds())
    s, acts = run(s, FailureReported("w0", 1), FailureReported("w2", 1))
    assert [k.id for k in of(acts, Kill)] == ["w1"]
    s, acts = run(s, WorkerExited("w1", -9, True))
    assert of(acts, Publish)[0].config.ids == ("w0", "w2")


def test_two_silent_workers_are_killed_after_the_suspect_window():
    s = initial_state(4, Bounds(suspect_window=2))
    s, acts = run(s, FailureReported("w0", 1), FailureReported("w1", 1), now=0)
    assert not of(acts, Kill)
    s, acts = run(s, Tick(), now=3)
    assert sorted(k.id for k in of(acts, Kill)) == ["w2", "w3"]


def test_everyone_reporting_rebuilds_the_groups_with_the_same_members():
    s = initial_state(2, Bounds())
    s, acts = run(s, FailureReported("w0", 1), FailureReported("w1", 1))
    [pub] = of(acts, Publish)
    assert pub.config.version == 2 and pub.config.ids == ("w0", "w1")


def test_rebuilds_that_keep_failing_at_the_same_step_stop_the_job_and_progress_resets_the_count():
    s = initial_state(2, Bounds(max_rebuilds=3))

    def everyone_fails_at(s, step):
        v = s.config.version
        return run(s, FailureReported("w0", v, step), FailureReported("w1", v, step - 1))

    for _ in range(3):  # three rebuilds at step 7 are within the bound
        s, acts = everyone_fails_at(s, 7)
        assert of(acts, Publish) and not of(acts, Finish)
    s, acts = everyone_fails_at(s, 8)  # a step was committed since: the count starts again
    assert of(acts, Publish) and s.rebuilds == (8, 1)
    for _ in range(2):
        s, acts = everyone_fails_at(s, 8)
        assert of(acts, Publish)
    s, acts = everyone_fails_at(s, 8)
    [fin] = of(acts, Finish)
    assert not of(acts, Publish) and fin.code != 0 and "step 8 in 4 cluster versions in a row" in fin.reason
    assert s.finished


def test_stale_reports_are_ignored():
    s = initial_state(2, Bounds())
    s, _ = run(s, WorkerExited("w1", -9, True))
    s, acts = run(s, FailureReported("w0", 1))
    assert acts == []


def test_exit_0_after_training_is_finishing_not_leaving():
    s = initial_state(2, Bounds(min_np=2))
    s, acts = run(s, WorkerExited("w1", 0))
    assert acts == []
    s, acts = run(s, WorkerExited("w0", 0))
    assert of(acts, Finish) == [Finish(0, "every worker exited 0")]


def test_exit_0_while_others_train_is_leaving_and_job_ends_when_all_exit_0():
    s = initial_state(3, Bounds())
    s, acts = run(s, WorkerExited("w2", 0, training=True))
    assert of(acts, Publish)[0].config.ids == ("w0", "w1") and not of(acts, Spawn)
    s, acts = run(s, JobDone(), WorkerExited("w1", 0, True))
    assert not of(acts, Publish) and not of(acts, Finish)
    s, acts = run(s, WorkerExited("w0", 0, True))
    assert of(acts, Finish) == [Finish(0, "every worker exited 0")]


def test_failures_beyond_the_budget_end_the_job_with_the_first_root_cause():
    s = initial_state(2, Bounds(replace=True, max_failures=1))
    s, _ = run(s, WorkerExited("w0", 3, True))
    s, acts = run(s, WorkerExited("w2", 4, True))  # the replacement fails while booting
    [fin] = of(acts, Finish)
    assert fin.code == 3 and fin.failed_worker == "w0" and "max-failures" in fin.reason


def test_last_worker_failing_ends_the_job():
    s = initial_state(1, Bounds())
    s, acts = run(s, WorkerExited("w0", 2, True))
    assert of(acts, Finish)[0].code == 2


def test_shrink_kills_joiners_that_are_no_longer_needed():
    s = initial_state(2, Bounds())
    s, _ = run(s, Proposal(4))
    s, acts = run(s, Proposal(1))
    assert sorted(k.id for k in of(acts, Kill)) == ["w2", "w3"]
    assert of(acts, Publish)[0].config.ids == ("w0",)
    s, acts = run(s, WorkerExited("w2", -9, True), WorkerExited("w3", -9, True))
    assert acts == []


def test_late_joiner_is_dropped_and_ready_ones_admitted():
    s = initial_state(1, Bounds(join_timeout=5))
    s, _ = run(s, Proposal(3), WorkerReady("w1"), now=0)
    s, acts = run(s, Tick(), now=6)
    assert Kill("w2", "not ready after 5s") in acts
    assert of(acts, Publish)[0].config.ids == ("w0", "w1")


def test_failure_outside_a_training_loop_stops_the_job():
    s = initial_state(3, Bounds(replace=True))
    s, acts = run(s, WorkerExited("w1", 3, training=False))
    [fin] = of(acts, Finish)
    assert fin.code == 3 and fin.failed_worker == "w1" and not of(acts, Spawn)
    assert sorted(k.id for k in of(acts, Kill)) == ["w0", "w2"]


def test_invalid_bounds():
    with pytest.raises(ValueError):
        Bounds(min_np=3, max_np=2)


def test_a_fatal_report_stops_every_worker_with_its_message_even_before_it_exits():
    s = initial_state(3, Bounds(replace=True))
    s, acts = run(
        s,
        FatalReported("w1", "policy Broken.after_step raised at step 7"),
        FailureReported("w0", 1),
        WorkerExited("w1", 1, False),
    )
    [fin] = of(acts, Finish)
    assert fin.code == 1 and fin.failed_worker == "w1" and "Broken.after_step raised at step 7" in fin.reason
    assert {k.id for k in of(acts, Kill)} == {"w0", "w1", "w2"} and not of(acts, Spawn)


def test_a_member_admitted_as_the_job_finishes_is_stopped_not_rebuilt_forever():
    """Soak seed 24: a replacement was admitted just as the others ran their last step and exited 0.
    It waited for them in the state sync and reported a failure; "everyone reported" then republished
    the same members every 2 s for ever (a livelock). A finished job has nothing to rebuild."""
    s = initial_state(3, Bounds(max_np=4, replace=True))
    s, _ = run(s, Proposal(4), WorkerReady("w3"))
    s, acts = run(
        s, JobDone(), WorkerExited("w0", 0, True), WorkerExited("w1", 0, True), WorkerExited("w2", 0, True)
    )
    assert not of(acts, Finish)
    s, acts = run(s, FailureReported("w3", 2))
    assert not of(acts, Publish), "a finished job must not rebuild its groups"
    assert [k.id for k in of(acts, Kill)] == ["w3"]
    s, acts = run(s, WorkerExited("w3", -9, True))
    assert of(acts, Finish) == [Finish(0, "every worker exited 0")]
    assert s.failures == 0, "stopping a worker that came too late is not a failure"


# -- liveness: heartbeats tell a stuck worker from a busy one ------------------------------------


def beating(s, *ids, at):
    return run(s, *[Beat(i, at) for i in ids], now=at)[0]


def test_a_silent_member_with_a_stale_heartbeat_is_killed_at_once_as_hung():
    s = beating(initial_state(3, Bounds()), "w0", "w1", "w2", at=0.0)
    s = beating(s, "w0", "w1", at=2.0)  # w2 stopped beating (SIGSTOP)
    s, acts = run(s, FailureReported("w0", 1), now=2.1)
    assert [k.id for k in of(acts, Kill)] == ["w2"] and "heartbeat stopped" in of(acts, Kill)[0].reason


def test_a_silent_member_with_a_fresh_heartbeat_is_busy_and_is_not_killed():
    """An 8 s evaluation on rank 0 with --timeout 3 (issue 17 item 1): its peers' collectives time out,
    but rank 0 is alive and busy: nobody is killed; when it comes back it reports too and the
    groups are rebuilt with the same members."""
    s = beating(initial_state(2, Bounds(suspect_window=1.0)), "w0", "w1", at=0.0)
    s, acts = run(s, Beat("w0", 3.0), FailureReported("w1", 1), now=3.0)
    assert not of(acts, Kill) and any("busy" in a.message for a in of(acts, Log))
    for t in (4.0, 6.0, 8.0):  # ticks past the suspect window while w0 keeps beating
        s, acts = run(s, Beat("w0", t), Beat("w1", t), Tick(), now=t)
        assert not of(acts, Kill) and not of(acts, Publish) and not of(acts, Log), "logged once, no churn"
    s, acts = run(s, FailureReported("w0", 1), now=8.5)
    [pub] = of(acts, Publish)
    assert pub.config.ids == ("w0", "w1") and pub.config.version == 2


def test_a_booting_joiner_gets_longer_than_a_member_before_it_is_taken_for_frozen():
    """A joiner's imports can starve its heartbeat thread for seconds on a loaded host; it holds
    nobody up until it is ready, so it is judged on BOOTING_SLACK x --liveness-timeout."""
    from taiji.cluster.hangs import BOOTING_SLACK

    s = beating(initial_state(1, Bounds(liveness_timeout=2.0, max_np=4)), "w0", at=0.0)
    s, acts = run(s, Proposal(3), now=0.0)
    assert [sp.ids for sp in of(acts, Spawn)] == [("w1", "w2")]
    s, _ = run(s, Beat("w1", 0.5), Beat("w2", 0.5), WorkerReady("w2"), now=0.5)
    s, acts = run(s, Beat("w0", 3.0), Tick(), now=3.0)
    assert [k.id for k in of(acts, Kill)] == ["w2"], "a ready joiner is held to the member's timeout"
    late = 0.5 + 2.0 * BOOTING_SLACK
    s, acts = run(s, Beat("w0", late - 0.1), Tick(), now=late - 0.1)
    assert not of(acts, Kill)
    s, acts = run(s, Beat("w0", late + 0.1), Tick(), now=late + 0.1)
    assert [k.id for k in of(acts, Kill)] == ["w1"] and "stopped or frozen" in of(acts, Kill)[0].reason


def test_a_busy_member_is_killed_after_the_busy_timeout():
    s = beating(initial_state(2, Bounds(busy_timeout=30.0)), "w0", "w1", at=0.0)
    s, _ = run(s, FailureReported("w1", 1), now=1.0)
    s, acts = run(s, Beat("w0", 31.0), Beat("w1", 31.0), Tick(), now=31.0)
    assert not of(acts, Kill)
    s, acts = run(s, Beat("w0", 31.5), Beat("w1", 31.5), Tick(), now=31.5)
    assert [k.id for k in of(acts, Kill)] == ["w0"] and "--busy-timeout" in of(acts, Kill)[0].reason


def test_a_worker_without_heartbeat_for_the_liveness_timeout_is_killed_without_any_report():
    """Asynchronous phases: no collective waits on a SIGSTOPped worker, the heartbeat finds it."""
    s = beating(initial_state(3, Bounds(liveness_timeout=5.0)), "w0", "w1", "w2", at=0.0)
    s, acts = run(s, Beat("w0", 5.0), Beat("w1", 5.0), Tick(), now=5.0)
    assert not of(acts, Kill)
    s, acts = run(s, Beat("w0", 5.2), Beat("w1", 5.2), Tick(), now=5.2)
    [kill] = of(acts, Kill)
    assert kill.id == "w2" and "stopped or frozen" in kill.reason
    s, acts = run(s, Tick(), now=5.3)
    assert not of(acts, Kill), "killed once"
    s, acts = run(s, WorkerExited("w2", -9, True), now=5.4)
    assert of(acts, Publish)[0].config.ids == ("w0", "w1")


def test_after_training_ended_a_worker_exiting_slowly_gets_the_exit_timeout_not_the_liveness_timeout():
    """Issue 39: a worker's heartbeat stops at its exit; a framework's process (Lightning, transformers)
    then tears its interpreter down for seconds on a busy host. Killed 5 s after its last beat, it lost
    what ran after (exit handlers, loggers flushing) and exited -9. After training ended, a stopped
    heartbeat means "exiting": it gets ``exit_timeout``; only one still running after that is killed."""
    s = beating(initial_state(2, Bounds(liveness_timeout=5.0, exit_timeout=30.0)), "w0", "w1", at=0.0)
    s, _ = run(s, JobDone(), now=0.5)
    s, acts = run(s, Tick(), now=29.0)
    assert not of(acts, Kill), "slow to exit is not frozen"
    s, acts = run(s, WorkerExited("w0", 0, False), Tick(), now=29.5)
    assert not of(acts, Kill) and not of(acts, Finish)
    s, acts = run(s, Tick(), now=30.5)
    [kill] = of(acts, Kill)
    assert kill.id == "w1" and "after it stopped its heartbeat at the end of training" in kill.reason
    s, acts = run(s, WorkerExited("w1", -9, False), now=31.0)
    assert of(acts, Finish) == [Finish(0, "every worker exited 0")]
    during = beating(initial_state(2, Bounds(liveness_timeout=5.0, exit_timeout=30.0)), "w0", "w1", at=0.0)
    during, acts = run(during, Beat("w0", 5.2), Tick(), now=5.2)
    assert [k.id for k in of(acts, Kill)] == ["w1"], "while training the liveness timeout still holds"


def test_an_exited_worker_s_old_heartbeat_does_not_get_it_killed_again():
    s = beating(initial_state(3, Bounds(liveness_timeout=1.0)), "w0", "w1", "w2", at=0.0)
    s, _ = run(s, WorkerExited("w2", 1, True), now=0.5)
    s, acts = run(s, Beat("w0", 2.0), Beat("w1", 2.0), Tick(), now=2.0)
    assert not of(acts, Kill)
