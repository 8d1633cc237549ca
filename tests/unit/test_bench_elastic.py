"""The elastic benchmark's analysis (taiji_harness/elastic_analysis.py) and report rows on
hand-made step-log records: no process is started."""

from __future__ import annotations

import pytest

from taiji_harness.elastic_analysis import (
    each_over,
    exactly_once_audit,
    exactly_once_figures,
    join_figures,
    kill_figures,
    median_over,
    model_figures,
    normal_step,
    samples_per_s,
    select,
    step_intervals,
    taiji_change_figures,
    taiji_fault_figures,
    torchrun_change_figures,
    torchrun_fault_figures,
    worker_error,
)
from taiji_harness.elastic_report import build_rows, table
from taiji_harness.elastic_runs import joiner_steps
from taiji_harness.testing import load_benchmark


def commit(time, **fields) -> dict:
    return {"event": "commit", "time": time, **fields}


def taiji_commits(worker, times, version, size, start_step=0, began_before=0.01, **extra) -> list[dict]:
    return [
        commit(
            t, worker=worker, version=version, size=size, step=start_step + i, began=t - began_before, **extra
        )
        for i, t in enumerate(times)
    ]


def test_select_filters_by_event_and_fields_and_sorts_by_time():
    records = [
        commit(3.0, rank=0),
        commit(1.0, rank=1),
        commit(2.0, rank=0),
        {"event": "boot", "ready": 0.5, "rank": 0},
    ]
    assert [r["time"] for r in select(records, "commit", rank=0)] == [2.0, 3.0]
    assert [r["time"] for r in select(records, "commit")] == [1.0, 2.0, 3.0]
    assert select(records, "boot", rank=0) == [records[3]]
    assert select(records, "commit", rank=7) == []


def test_normal_step_leaves_out_the_first_interval_and_stops_at_settle():
    commits = [commit(t) for t in (10.0, 12.0, 12.1, 12.2, 12.4, 99.0)]
    assert step_intervals(commits[:3]) == pytest.approx([2.0, 0.1])
    # intervals of the first settle + 1 commits, without the first: 0.1, 0.1, 0.2 -> median 0.1
    assert normal_step(commits, settle=4) == pytest.approx(0.1)
    assert normal_step(commits, settle=2) == pytest.approx(0.1)


def test_taiji_change_stall_is_the_gap_minus_one_normal_step():
    before = taiji_commits("w0", [1.0, 1.1, 1.2, 1.3], version=1, size=1)
    # the change: last commit at v1 at 1.3, first at v2 at 1.65, then steps of 0.05
    after = taiji_commits("w0", [1.65, 1.70, 1.75, 1.80, 1.85], version=2, size=2, start_step=4)
    after[0]["transitions"] = [{"total_s": 0.2, "switch_s": 0.05, "sync_s": 0.1}]
    joiner = taiji_commits("w1", [1.65, 1.70, 1.75, 1.80, 1.85], version=2, size=2, start_step=4)
    boot = {"event": "boot", "worker": "w1", "exec": 0.5, "imported": 1.1, "ready": 1.6}
    records = before + after + joiner + [boot]
    figures = taiji_change_figures(records, {"to_version": 2, "to_size": 2, "requested": 1.05}, settle=3)
    assert figures["stall_s"] == pytest.approx(1.65 - 1.3 - 0.05)
    assert figures["stall_s_by_worker"] == {"w0": pytest.approx(0.3)}  # the joiner had no stall
    assert figures["transition_total_s"] == 0.2 and figures["transition_sync_s"] == 0.1
    assert figures["to_loop_s"] == pytest.approx(1.64 - 1.3)
    assert figures["first_step_extra_s"] == pytest.approx(0.0)
    assert figures["request_to_new_size_s"] == pytest.approx(1.65 - 1.05)
    assert figures["steps_while_joiners_booted"] == 3  # 1.1, 1.2, 1.3
    assert figures["joiner_import_s"] == pytest.approx(0.6)
    assert figures["step_ms_before"] == pytest.approx(100.0)
    assert figures["step_ms_after"] == pytest.approx(50.0)


def test_taiji_change_without_a_running_worker_is_an_error():
    joiner = taiji_commits("w1", [2.0, 2.1, 2.2], version=2, size=2)
    with pytest.raises(ValueError):
        taiji_change_figures(joiner, {"to_version": 2, "to_size": 2, "requested": 1.0}, settle=2)


def test_taiji_fault_counts_from_the_hit_to_the_first_survivor_commit():
    w0 = taiji_commits("w0", [1.0, 1.1, 1.2], version=1, size=3)
    w2 = taiji_commits("w2", [1.0, 1.1, 1.2], version=1, size=3)
    victim = taiji_commits("w1", [1.0, 1.1, 1.2, 1.3], version=1, size=3)  # not a survivor: ignored
    retried_w0 = taiji_commits("w0", [1.45, 1.5], version=2, size=2, start_step=3)
    retried_w0[0]["transitions"] = [{"reason": "failure", "step": 3, "total_s": 0.12}]
    retried_w2 = taiji_commits("w2", [1.4, 1.5], version=2, size=2, start_step=3)
    figures = taiji_fault_figures(
        w0 + w2 + victim + retried_w0 + retried_w2, hit=1.25, survivors=["w0", "w2"]
    )
    assert figures["resume_s"] == pytest.approx(1.4 - 1.25)
    assert figures["to_size"] == 2
    assert figures["last_committed_before"] == 2
    assert figures["retried_step"] == 3 and figures["transition_total_s"] == 0.12
    assert figures["committed_steps_redone"] == 0
    assert figures["step_ms"] == pytest.approx(100.0)


def test_taiji_fault_counts_a_step_committed_twice():
    w0 = taiji_commits("w0", [1.0, 1.1, 1.2], version=1, size=2)
    again = taiji_commits("w0", [1.5, 1.6], version=2, size=1, start_step=2)  # step 2 committed again
    assert taiji_fault_figures(w0 + again, hit=1.3, survivors=["w0"])["committed_steps_redone"] == 1


def boot(tag=None, restart=None, t0=10.0, **fields) -> dict:
    record = {
        "event": "boot",
        "exec": t0,
        "imported": t0 + 1.0,
        "joined": t0 + 1.5,
        "built": t0 + 2.5,
        "loaded": t0 + 2.6,
        "ready": t0 + 2.8,
        "resumed_at": 20,
        **fields,
    }
    if tag is not None:
        record["tag"] = tag
    if restart is not None:
        record["restart"] = restart
    return record


def test_torchrun_change_splits_the_restart_into_its_parts():
    old = [commit(5.0 + 0.1 * i, tag="0", rank=0, step=i) for i in range(20)]  # last at 6.9, step 19
    new = [commit(13.0 + 0.05 * i, tag="1", rank=0, step=20 + i) for i in range(5)]
    boots = [boot(tag="1", t0=10.0, rank=0), boot(tag="1", t0=10.2, rank=1)]
    broadcast = {
        "event": "broadcast",
        "tag": "1",
        "time": 13.1,
        "bytes": 8_000_000,
        "seconds": [0.02, 0.01, 0.03],
    }
    change = {"tag": "1", "to_size": 2, "requested": 7.0, "stopped": 7.5, "agent_started": 8.0}
    figures = torchrun_change_figures(old + new + boots + [broadcast], change, settle=3)
    assert figures["stall_s"] == pytest.approx(13.0 - 6.9 - 0.05)
    assert figures["request_to_first_step_s"] == pytest.approx(6.0)
    assert figures["stop_s"] == pytest.approx(0.5)
    assert figures["agent_boot_s"] == pytest.approx(2.0)
    assert figures["without_agent_boot_s"] == pytest.approx(4.0)
    assert figures["worker_import_s"] == pytest.approx(1.0)
    assert figures["rendezvous_s"] == pytest.approx(11.7 - 11.2)
    assert figures["build_model_optimizer_s"] == pytest.approx(1.0)
    assert figures["checkpoint_load_s"] == pytest.approx(0.1)
    assert figures["ddp_init_s"] == pytest.approx(0.2)
    assert figures["first_step_s"] == pytest.approx(13.0 - 13.0)
    assert figures["last_committed_before"] == 19 and figures["resumed_at"] == 20
    assert figures["broadcast_s"] == 0.02 and figures["broadcast_bytes"] == 8_000_000
    assert figures["step_ms_before"] == pytest.approx(100.0)


def test_torchrun_fault_counts_redone_steps_and_restarted_workers():
    before = [commit(1.0 + 0.1 * i, restart=0, rank=0, step=i) for i in range(10)]  # last step 9
    after = [commit(6.0 + 0.1 * i, restart=1, rank=0, step=8 + i) for i in range(3)]
    boots = [boot(restart=1, t0=3.0, resumed_at=8), boot(restart=1, t0=3.1, resumed_at=8)]
    figures = torchrun_fault_figures(before + after + boots, hit=2.0)
    assert figures["resume_s"] == pytest.approx(4.0)
    assert figures["committed_steps_redone"] == 2  # steps 8 and 9 again
    assert figures["workers_restarted"] == 2
    assert figures["kill_to_worker_exec_s"] == pytest.approx(1.0)
    assert figures["first_step_s"] == pytest.approx(6.0 - 5.9)
    assert figures["step_ms"] == pytest.approx(100.0)


def test_torchrun_fault_without_a_restart_is_an_error():
    with pytest.raises(ValueError):
        torchrun_fault_figures([commit(1.0, restart=0, rank=0, step=0)], hit=0.5)


def test_model_figures_from_the_first_complete_boot_record():
    records = [
        {"event": "boot", "ready": 2.0, "params": 5, "model_state_bytes": 20, "train_state_bytes": 40},
        {"event": "boot", "ready": 1.0},
        commit(0.5, params=99),
    ]
    assert model_figures(records) == {"params": 5, "model_state_bytes": 20, "train_state_bytes": 40}
    assert model_figures([commit(1.0)]) == {}


def test_median_and_each_over_repetitions_skip_what_is_missing():
    runs = [
        {"changes": [{"stall_s": 0.3}]},
        {"changes": [{"stall_s": 0.1}]},
        {"changes": [{"stall_s": None}]},
    ]
    assert median_over(runs, "changes", 0, "stall_s") == pytest.approx(0.2)
    assert each_over(runs, "changes", 0, "stall_s") == [0.3, 0.1, None]
    assert median_over([], "resume_s") is None


def test_report_rows_put_anchor_over_taiji_and_check_targets():
    def resize(stalls, broadcast=None):
        return {"changes": [{"stall_s": s, "broadcast_s": broadcast} for s in stalls]}

    results = {
        "taiji_resize": [resize([0.05, 0.2, 0.01])],
        "torchrun_resize": [resize([5.0, 8.0, 5.0], 0.01)],
        "taiji_crash": [{"resume_s": 0.1, "retried_step": 5, "last_committed_before": 4}],
        "torchrun_crash": [{"resume_s": 3.0}],
        "taiji_hang": [{"resume_s": 2.1}],
        "torchrun_hang": [],
        "taiji_crash3": [],
        "taiji_kill_join": [],
        "torchft_kill_join": [],
        "torchrun_steady": [],
    }
    rows = build_rows(results, None, {"train_state_bytes": 8_000_000}, hang_timeout=2.0)[:5]
    assert [r["ratio"] for r in rows] == [100.0, 40.0, 500.0, 30.0, 2.38]  # hang anchor: 2.0 + 3.0 (bound)
    assert [r["target_met"] for r in rows] == [True, False, True, True, True]
    assert rows[0]["target_s"] == pytest.approx(0.11) and rows[0]["broadcast_GBps"] == pytest.approx(0.8)
    assert rows[3]["taiji_inflight_step_retried"] is True
    assert all({"case", "taiji", "anchor", "ratio"} <= set(row) for row in rows)


def test_report_table_has_one_line_per_row():
    rows = [
        {"case": "grow", "taiji": 0.05, "anchor": 5.0, "ratio": 100.0, "target_met": True},
        {"case": "hang", "taiji": None, "anchor": 5.0, "ratio": None, "target_met": False},
    ]
    lines = table(rows).splitlines()
    assert len(lines) == 3 and lines[0].split()[:4] == ["case", "taiji", "anchor", "ratio"]
    assert lines[1].split() == ["grow", "0.05", "5", "100", "yes"]
    assert lines[2].split() == ["hang", "-", "5", "-", "no"]


def drawn(time, worker, step, samples, epoch=0) -> dict:
    return {"event": "draw", "time": time, "worker": worker, "step": step, "samples": samples, "epoch": epoch}


def done(time, worker, step, samples, size, epoch=0) -> dict:
    return {
        "event": "commit",
        "time": time,
        "worker": worker,
        "step": step,
        "samples": samples,
        "size": size,
        "epoch": epoch,
    }


def test_kill_counts_to_the_first_survivor_commit_and_the_attempts_thrown_away():
    records = [
        drawn(1.0, "a", 0, [0]),
        done(1.1, "a", 0, [0], 2),
        drawn(1.0, "b", 0, [1]),
        done(1.1, "b", 0, [1], 2),
        drawn(1.15, "a", 1, [2]),
        drawn(1.15, "b", 1, [3]),  # b is killed at 1.2 in step 1
        drawn(3.0, "a", 1, [4]),
        done(3.1, "a", 1, [4], 1),  # a skips [2]: step 1 on new data
        drawn(3.2, "a", 2, [5]),
        done(3.3, "a", 2, [5], 1),
    ]
    figures = kill_figures(records, hit=1.2, survivors={"a"})
    assert figures["resume_s"] == pytest.approx(1.9)
    assert figures["last_committed_before"] == 0 and figures["first_committed_after"] == 1
    assert figures["size_after"] == 1 and figures["committed_steps_redone"] == 0
    assert figures["attempts_discarded"] == 1  # the draw of [2]
    retried = records[:6] + [drawn(1.3, "a", 1, [2, 3]), done(1.4, "a", 1, [2, 3], 1)]
    assert kill_figures(retried, hit=1.2, survivors={"a"})["attempts_discarded"] == 1  # retried on other data
    with pytest.raises(ValueError):
        kill_figures(records[:6], hit=1.2, survivors={"a"})


def test_join_stall_is_the_survivor_gap_at_the_new_size_minus_a_normal_step():
    survivor = [done(1.0 + 0.1 * i, "a", i, [i], 1) for i in range(10)]  # last at size 1: 1.9
    survivor += [done(2.3 + 0.1 * i, "a", 10 + i, [10 + i], 2) for i in range(5)]
    joiner = [done(2.3 + 0.1 * i, "c", 10 + i, [20 + i], 2) for i in range(5)]
    boot = {"event": "boot", "worker": "c", "exec": 1.5, "ready": 2.2}
    figures = join_figures(survivor + joiner + [boot], requested=1.25, survivors={"a"}, size=2, settle=3)
    assert figures["stall_s"] == pytest.approx(2.3 - 1.9 - 0.1)
    assert figures["joiner_first_step_s"] == pytest.approx(2.3 - 1.25)
    assert figures["joiner_boot_to_first_step_s"] == pytest.approx(0.8)
    assert figures["request_to_new_size_s"] == pytest.approx(1.05)
    assert figures["steps_while_joiner_booted"] == 7  # 1.3 .. 1.9
    with pytest.raises(ValueError):
        join_figures(survivor, requested=1.25, survivors={"a"}, size=2, settle=3)


def test_exactly_once_counts_repeats_per_epoch_and_lost_draws_but_not_the_last_in_flight():
    records = [
        drawn(1.0, "a", 0, [0, 1]),
        done(1.1, "a", 0, [0, 1], 2),
        drawn(1.0, "b", 0, [2, 3]),
        done(1.1, "b", 0, [2, 3], 2),
        drawn(1.2, "a", 1, [4, 5]),
        drawn(1.2, "b", 1, [6, 7]),  # b killed; a's step not committed
        drawn(2.0, "a", 2, [8, 9]),
        done(2.1, "a", 2, [8, 9], 1),
        drawn(3.0, "c", 2, [2, 3]),
        done(3.1, "c", 2, [2, 3], 2),  # b's replacement reads b's data again
        drawn(3.0, "a", 3, [2, 3], epoch=1),
        done(3.1, "a", 3, [2, 3], 2, epoch=1),  # a new epoch: no repeat
        drawn(3.2, "a", 4, [10, 11]),
    ]  # in flight when the run stops
    figures = exactly_once_figures(records, killed={"b"})
    assert figures["samples_committed"] == 10 and figures["samples_distinct"] == 8
    assert figures["samples_repeated"] == 2
    assert figures["samples_lost"] == 4  # [4, 5] and b's [6, 7]
    assert figures["exactly_once_share"] == pytest.approx(6 / 12)  # 0, 1, 8, 9 and epoch 1's 2, 3
    retry = records[:6] + [drawn(1.3, "a", 1, [4, 5, 6, 7]), done(1.4, "a", 1, [4, 5, 6, 7], 1)]
    clean = exactly_once_figures(retry, killed={"b"})
    assert (
        clean["samples_lost"] == 0 and clean["samples_repeated"] == 0 and clean["exactly_once_share"] == 1.0
    )


def test_a_share_killed_after_the_last_collective_counts_as_trained_by_the_peers_commit():
    # b is killed after step 1's collectives and before its commit record: a committed step 1 in the
    # same version, so b's share is in it; step 2 fails (b gone) and a retries it alone in version 2
    def v(record, version):
        return {**record, "version": version}

    records = [
        v(drawn(1.0, "a", 0, [0, 1]), 1),
        v(done(1.1, "a", 0, [0, 1], 2), 1),
        v(drawn(1.0, "b", 0, [2, 3]), 1),
        v(done(1.1, "b", 0, [2, 3], 2), 1),
        v(drawn(1.2, "a", 1, [4, 5]), 1),
        v(drawn(1.2, "b", 1, [6, 7]), 1),
        v(done(1.3, "a", 1, [4, 5], 2), 1),
        v(drawn(1.4, "a", 2, [8, 9]), 1),  # fails: b is gone
        v(drawn(1.5, "a", 2, [8, 9, 10, 11]), 2),
        v(done(1.6, "a", 2, [8, 9, 10, 11], 1), 2),
    ]
    figures = exactly_once_figures(records, killed={"b"})
    assert figures["samples_lost"] == 0 and figures["samples_repeated"] == 0
    assert figures["samples_distinct"] == 12 and figures["exactly_once_share"] == 1.0
    # without the version a draw is covered only by its own worker's commit: b's share counts as lost
    unversioned = [
        {k: x for k, x in r.items() if k != "version"} if r["worker"] == "b" else r for r in records
    ]
    assert exactly_once_figures(unversioned, killed={"b"})["samples_lost"] == 2
    # a retry in a newer version covers no draw of the failed attempt: a share nobody committed is lost
    no_commit = [r for r in records if not (r["event"] == "commit" and r["step"] == 1)]
    assert exactly_once_figures(no_commit, killed={"b"})["samples_lost"] == 4
    # b failed step 1 but survived, its peers committed it, and b logged the adopted commit later:
    # its share counts once
    adopted = [r for r in records if r["worker"] == "a" or r["step"] == 0] + [
        v(drawn(1.2, "b", 1, [6, 7]), 1),
        v(done(1.45, "b", 1, [6, 7], 1), 2),
    ]
    assert exactly_once_figures(adopted, killed=set())["samples_repeated"] == 0


def test_a_suspended_jobs_audit_reads_every_launchers_processes_and_finds_missing_samples():
    # first launcher (a, b) stops after step 1 (its last draw in flight); the resumed one (c) goes on
    first = [
        drawn(1.0, "a", 0, [0, 1]),
        done(1.1, "a", 0, [0, 1], 2),
        drawn(1.0, "b", 0, [2, 3]),
        done(1.1, "b", 0, [2, 3], 2),
        drawn(1.2, "a", 1, [4, 5]),
    ]
    resumed = [
        drawn(5.0, "c", 1, [4, 5]),
        done(5.1, "c", 1, [4, 5], 1),
        drawn(5.2, "c", 2, [0, 1], epoch=1),
        done(5.3, "c", 2, [0, 1], 1, epoch=1),
    ]
    audit = exactly_once_audit(first + resumed, samples_per_epoch=6, epochs=2)
    assert audit["processes"] == 3 and audit["repeated"] == 0 and audit["lost"] == 0
    assert audit["missing"] == 4 and not audit["exactly_once"]  # epoch 1 trained only samples 0 and 1
    assert exactly_once_audit(first + resumed, samples_per_epoch=6, epochs=1)["exactly_once"]
    again = (
        first + resumed + [drawn(5.0, "d", 1, [4, 5]), done(5.1, "d", 1, [4, 5], 1)]
    )  # a step trained twice
    assert exactly_once_audit(again, 6, 1)["repeated"] == 2
    assert not exactly_once_audit([], 6, 1)["exactly_once"], "no sample log at all is no proof"


def test_samples_per_s_is_the_batch_over_the_median_interval_after_the_first_ones():
    commits = [commit(t) for t in (0.0, 1.0, 1.5, 1.55, 1.6, 1.7, 1.75)]
    assert samples_per_s(commits, 64, skip=2) == pytest.approx(64 / 0.05)
    assert samples_per_s(commits[:2], 64) is None


def test_joiner_steps_outlast_the_killed_worker():
    assert joiner_steps(8, 3) == 8 and joiner_steps(8, 40) == 42


def test_worker_error_names_the_last_exception_where_it_was_raised_and_its_cause():
    text = """Traceback (most recent call last):
  File "/x/torchft/manager.py", line 1327, in wait
    self._work.wait()
RuntimeError: [pair.cc:537] Read error [127.0.0.1]:62599: Connection reset by peer.
Traceback (most recent call last):
  File "/x/torchft/ddp.py", line 76, in _comm_hook
    assert fut._fut
AssertionError
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""
    assert worker_error(text) == (
        "AssertionError at torchft/ddp.py:76 in _comm_hook (after RuntimeError: "
        "[pair.cc:537] Read error [127.0.0.1]:62599: Connection reset by peer.)"
    )
    assert worker_error("just a line\n") == "just a line"
    assert worker_error("") == "no output"


def kill_join_run(resume, stall, first, share, rate, **extra) -> dict:
    return {
        "samples_per_s": rate,
        "kill": {"resume_s": resume, "committed_steps_redone": 0, "attempts_discarded": 1},
        "join": {"stall_s": stall, "joiner_first_step_s": first},
        "exactly_once": {"exactly_once_share": share, "samples_lost": 0, "samples_repeated": 0},
        **extra,
    }


def torchft_results(**changes) -> dict:
    results = {
        name: []
        for name in (
            "taiji_resize",
            "torchrun_resize",
            "taiji_crash",
            "torchrun_crash",
            "taiji_hang",
            "torchrun_hang",
            "taiji_crash3",
        )
    }
    results.update(
        taiji_kill_join=[kill_join_run(0.1, 0.02, 6.0, 1.0, 2000.0)],
        torchft_kill_join=[kill_join_run(5.0, 0.01, 12.0, 0.9, 1000.0, version="torchft-nightly 1")],
        torchrun_steady=[{"samples_per_s": 1600.0}],
        torchrun_crash=[{"resume_s": 3.0}],
    )
    results.update(changes)
    return results


def test_torchft_rows_name_the_anchor_and_put_taiji_ahead_above_one():
    rows = build_rows(torchft_results(), None, {}, hang_timeout=2.0)[5:]
    assert (
        len(rows) == 6
        and all("torchft" in r["case"] for r in rows[:5])
        and rows[5]["case"].endswith("vs DDP")
    )
    assert [r["ratio"] for r in rows] == [50.0, 0.5, 2.0, 1.111, 2.0, 1.25]
    assert rows[0]["torchrun_s"] == 3.0 and rows[0]["anchor_version"] == "torchft-nightly 1"
    assert not any("anchor_error" in r for r in rows)
    assert (rows[3]["taiji_all"], rows[3]["anchor_all"]) == ([1.0], [0.9]), (
        "every repetition's exactly-once share"
    )


def test_torchft_rows_say_what_torchft_could_not_complete():
    crashed = {
        "version": "torchft 0.2.0",
        "samples_per_s": 900.0,
        "error": {
            "phase": "kill",
            "message": "RuntimeError: exited",
            "worker_errors": {"g0": "AssertionError"},
        },
    }
    rows = build_rows(torchft_results(torchft_kill_join=[crashed]), None, {}, hang_timeout=2.0)[5:]
    assert [r["anchor"] for r in rows[:4]] == [None] * 4 and rows[4]["anchor"] == 900.0
    assert all(r["anchor_error"]["phase"] == "kill" for r in rows[:4]) and "anchor_error" not in rows[4]
    assert [line.split()[-3] for line in table(rows).splitlines()[1:]] == ["failed"] * 4 + ["900", "1600"]
    missing = build_rows(
        torchft_results(torchft_kill_join=[]), None, {}, hang_timeout=2.0, torchft_missing="not installed"
    )
    assert all(r["anchor_error"] == "not installed" for r in missing[5:10])


def test_torchft_missing_says_how_to_install_it(monkeypatch):
    _elastic_torchft = load_benchmark("_elastic_torchft")
    monkeypatch.setattr(_elastic_torchft.importlib.util, "find_spec", lambda name: None)
    message = _elastic_torchft.torchft_missing()
    assert message.startswith("not installed") and "pip install -e '.[bench]'" in message


def test_resume_phases_follow_the_slowest_worker_and_sum_every_workers_cpu(tmp_path):
    resume = load_benchmark("resume")
    boots = [
        {
            "event": "boot",
            "exec": 10.5,
            "imported": 13.0,
            "joined": 13.5,
            "built": 16.0,
            "loaded": 16.25,
            "ready": 16.5,
            "cpu": 4.0,
        },
        {
            "event": "boot",
            "exec": 10.25,
            "imported": 14.0,
            "joined": 14.5,
            "built": 17.0,
            "loaded": 17.5,
            "ready": 18.5,
            "cpu": 5.0,
        },
    ]
    got = resume.phases(boots + [{"event": "commit", "time": 19.0}], restarted=10.0)
    assert got == {
        "to_exec": 0.25,
        "import_torch": 3.75,
        "join": 0.5,
        "build": 2.5,
        "load": 0.5,
        "to_first_step": 1.0,
        "worker_cpu_s": 9.0,
    }
    assert resume.phases([], restarted=10.0) == {}
    assert resume.medians(
        [
            {"seconds": 1.0, "load": 0.5, "join": 1.0},
            {"seconds": 3.0, "load": 0.25},
            {"seconds": 2.0, "load": 1.0, "join": 2.0},
        ]
    ) == {"load": 0.5}
    (tmp_path / "events.jsonl").write_text(
        '{"kind": "start", "phases": {"groups": 9.0}}\n'
        '{"kind": "start", "phases": {"groups": 1.5, "sync": 0.25}}\n'
        '{"kind": "resume", "load_s": 0.125}\n'
    )
    assert resume.run_log_phases(tmp_path) == {
        "run_log_groups": 1.5,
        "run_log_sync": 0.25,
        "run_log_load": 0.125,
    }


def test_multihost_reads_where_a_recovery_or_a_planned_resize_went_from_the_run_log(tmp_path):
    multihost = load_benchmark("multihost")
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"kind": "resize", "size": 3, "seconds": 0.05, "phases": {"switch": 0.01, "groups": 0.03}}\n'
        '{"kind": "recovery", "size": 4, "seconds": 0.4, "phases": {"failed": 0.3}}\n'
    )
    assert multihost.recovery_phases(events) == {4: {"failed": 0.3, "total": 0.4}}
    assert multihost.recovery_phases(events, "resize") == {3: {"switch": 0.01, "groups": 0.03, "total": 0.05}}
    assert multihost.recovery_phases(tmp_path / "missing.jsonl") == {}
