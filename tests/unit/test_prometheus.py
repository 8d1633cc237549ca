"""Metrics: the pure mapping from a launcher's snapshot and its controller's actions to Prometheus
families (metrics/prometheus.py), the status record rank 0 writes for it, the HTTP exporter
(launch/metrics_http.py, with prometheus_client) and `taiji top`'s rendering (launch/top.py)."""

from __future__ import annotations

import urllib.request

import pytest

from taiji.cluster import spec
from taiji.cluster.controller import (
    Beat,
    Bounds,
    FailureReported,
    Kill,
    Proposal,
    Publish,
    Tick,
    WorkerExited,
    WorkerReady,
    initial_state,
)
from taiji.errors import LaunchError
from taiji.launch import top
from taiji.metrics.prometheus import Family, Tally, change_kind, job_families, kill_kind, sched_families
from taiji.runtime import reporting
from taiji.runtime.reporting import Event, Reporter, Snapshot, StepCommitted
from taiji_harness.testing import actions_of, feed

SNAPSHOT = {
    "job": "j1",
    "pid": 1,
    "version": 3,
    "workers": ["w0", "w1"],
    "joiners": ["w2"],
    "desired": 3,
    "min_np": 1,
    "max_np": 4,
    "failures": 1,
    "busy": ["w1"],
    "hosts": [["127.0.0.1", 4, 3]],
    "progress": {
        "step": 120,
        "epoch": 1,
        "batch_size": 64,
        "version": 3,
        "size": 2,
        "position": 7680,
        "end": 0,
        "samples_per_s": 950.5,
        "time": 1.7e9,
        "step_s": 0.067,
        "allreduce_wait_s": 0.004,
        "lr": 0.1,
        "loss": 0.52,
        "straggler": 1.1,
        "gns": None,
    },
}


def values(families: list[Family]) -> dict[tuple, float]:
    return {(f.exposed_name, labels): value for f in families for labels, value in f.samples}


def test_a_snapshot_maps_to_named_series_with_a_job_label():
    got = values(job_families(SNAPSHOT, Tally()))
    job = (("job_id", "j1"),)
    assert got[("taiji_job_step", job)] == 120
    assert got[("taiji_job_samples_per_second", job)] == 950.5
    assert got[("taiji_job_step_seconds", job)] == 0.067
    assert got[("taiji_job_allreduce_wait_seconds", job)] == 0.004
    assert got[("taiji_job_cluster_size", job)] == 2
    assert got[("taiji_job_cluster_version", job)] == 3
    assert got[("taiji_job_joining_workers", job)] == 1
    assert got[("taiji_job_busy_workers", job)] == 1
    assert got[("taiji_job_failures_total", job)] == 1
    assert got[("taiji_job_learning_rate", job)] == 0.1
    assert got[("taiji_job_straggler_ratio", job)] == 1.1
    assert got[("taiji_job_host_workers", (("job_id", "j1"), ("host", "127.0.0.1")))] == 3
    # a value rank 0 has not reported (GNS before its first estimate) is absent, not 0
    assert not any(name == "taiji_job_gradient_noise_scale" for name, _ in got)
    # counters are named _total, gauges are not; every name has the prefix and a base unit
    for fam in job_families(SNAPSHOT, Tally()):
        assert fam.exposed_name.startswith("taiji_job_")
        assert fam.exposed_name.endswith("_total") == (fam.kind == "counter")
        assert "_ms" not in fam.name and "millis" not in fam.name


def test_a_job_without_progress_yet_has_only_cluster_series():
    got = values(job_families({"job": "j2"}, Tally()))
    assert got[("taiji_job_cluster_size", (("job_id", "j2"),))] == 0
    assert not any(name == "taiji_job_step" for name, _ in got)


def _reasons(actions) -> list:
    return [change_kind(a.reason) for a in actions_of(actions, Publish)]


def test_the_real_controllers_publish_reasons_are_classified():
    state = initial_state(2, Bounds(min_np=1, max_np=4))
    state, acts = feed(state, Proposal(3), WorkerReady("w2"))
    assert _reasons(acts) == [("resize", "grow")]
    state, acts = feed(state, Proposal(2))
    assert _reasons(acts) == [("resize", "shrink")]
    state, acts = feed(state, WorkerExited("w2", 0, training=True))  # the leaver of the shrink
    assert _reasons(acts) == []
    state, acts = feed(state, WorkerExited("w1", 1, training=True))
    assert _reasons(acts) == [("recovery", "failure")]
    state, acts = feed(state, Proposal(2), WorkerReady("w3"))
    state, acts = feed(
        state, FailureReported("w0", state.config.version), FailureReported("w3", state.config.version)
    )
    assert _reasons(acts) == [("recovery", "rebuild")]
    state, acts = feed(state, WorkerExited("w3", 0, training=True))  # the one stopped as a suspected hang
    assert _reasons(acts) == [("recovery", "failure")]
    _, acts = feed(initial_state(2, Bounds(min_np=1, max_np=4)), WorkerExited("w1", 0, training=True))
    assert _reasons(acts) == [("resize", "leave")]
    assert change_kind("start") is None


def test_hung_workers_are_counted_by_reason_until_they_leave_the_config():
    state = initial_state(3, Bounds(min_np=1, max_np=4, stale_after=1.0))
    state, _ = feed(state, Beat("w0", 4.5), Beat("w1", 4.5), Beat("w2", 0.0), now=4.5)  # w2's beat is stale
    state, acts = feed(state, FailureReported("w0", 1), FailureReported("w1", 1), now=5.0)
    kills = actions_of(acts, Kill)
    assert [k.id for k in kills] == ["w2"] and kill_kind(kills[0].reason) == "hang"
    tally = Tally()
    for action in acts:
        tally = tally.killed(action.id, action.reason) if isinstance(action, Kill) else tally
    assert tally.count("kill", "hang") == 1
    fams = values(job_families({"job": "j", "workers": ["w0", "w1", "w2"]}, tally))
    assert fams[("taiji_job_hung_workers", (("job_id", "j"),))] == 1
    assert fams[("taiji_job_worker_kills_total", (("job_id", "j"), ("reason", "hang")))] == 1
    fams = values(job_families({"job": "j", "workers": ["w0", "w1"]}, tally))  # w2 dropped
    assert fams[("taiji_job_hung_workers", (("job_id", "j"),))] == 0
    assert kill_kind("no longer needed") is None and kill_kind("the job is stopping") is None


def test_the_tally_counts_published_changes_by_reason():
    tally = Tally().published("start").published("grow to 3: admit ['w2']").published("shrink 3 -> 2")
    tally = tally.published("grow to 3: admit ['w4'], drop failed ['w1']")
    fams = values(job_families({"job": "j"}, tally))
    assert fams[("taiji_job_resizes_total", (("job_id", "j"), ("reason", "grow")))] == 1
    assert fams[("taiji_job_resizes_total", (("job_id", "j"), ("reason", "shrink")))] == 1
    assert fams[("taiji_job_recoveries_total", (("job_id", "j"), ("reason", "failure")))] == 1
    assert fams[("taiji_job_recoveries_total", (("job_id", "j"), ("reason", "rebuild")))] == 0


def test_scheduler_families():
    reply = {
        "slots": 4,
        "host_names": ["h1", "h2"],
        "up": [True, False],
        "asked": {"s1": [[3, 0], [3, 0], False]},
        "jobs": [
            {
                "id": "s1",
                "state": "running",
                "size": 2,
                "placement": [2, 0],
                "home": 0,
                "name": "a",
                "end": 1000,
                "position": 600,
                "samples_per_s": 10.0,
            },
            {"id": "s4", "state": "running", "size": 1, "placement": [], "home": 1, "name": "d"},
            {"id": "s2", "state": "queued", "size": 0, "placement": [], "name": "b"},
            {"id": "s3", "state": "finished", "size": 0, "placement": [1, 0], "name": "c"},
        ],
    }
    got = values(sched_families(reply, 7, 0.25, {"grow": 2, "start": 1}))
    assert got[("taiji_sched_jobs", (("state", "running"),))] == 2
    assert got[("taiji_sched_jobs", (("state", "queued"),))] == 1
    assert got[("taiji_sched_host_slots_used", (("host", "h1"),))] == 2
    assert got[("taiji_sched_host_slots_used", (("host", "h2"),))] == 1  # s4 on its home host
    assert got[("taiji_sched_host_slots_free", (("host", "h1"),))] == 2
    assert got[("taiji_sched_host_slots_free", (("host", "h2"),))] == 0  # down
    assert got[("taiji_sched_decisions_total", (("kind", "grow"),))] == 2
    assert got[("taiji_sched_decisions_total", (("kind", "shrink"),))] == 0
    assert got[("taiji_sched_job_target_workers", (("job_id", "s1"), ("name", "a")))] == 3
    assert got[("taiji_sched_job_target_workers", (("job_id", "s4"), ("name", "d")))] == 1
    assert got[("taiji_sched_job_estimated_finish_seconds", (("job_id", "s1"), ("name", "a")))] == 40.0
    assert ("taiji_sched_job_estimated_finish_seconds", (("job_id", "s4"), ("name", "d"))) not in got
    assert got[("taiji_sched_rounds_total", ())] == 7
    assert got[("taiji_sched_round_seconds", ())] == 0.25


# -- the status record rank 0 writes -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return 1e9 + self.now


def test_rank0s_status_carries_the_last_steps_figures_at_least_once_a_second(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(reporting, "time", clock)
    written: list[dict] = []
    report = Reporter(None, 50, lead=lambda: True, write_status=written.append)
    report.on(Event("start", 0))
    for index in range(6):
        clock.now += 0.25
        where = Snapshot(step=index + 1, epoch=0, batch_size=16, version=1, size=2)
        report.on(
            StepCommitted(
                index,
                0,
                where,
                16,
                monitored=True,
                loss=0.5,
                grad_variance=None,
                straggler=1.2,
                gns=300.0 if index == 0 else None,
                grad_sqnorm=None,
                trace_sigma=None,
                lr=0.05,
                allreduce_wait=0.002,
            )
        )
    # steps of 0.25 s and log_every 50: a status after the 4th step (1 s) only, not after every step
    assert [s["step"] for s in written] == [4]
    status = written[0]
    assert status["samples_per_s"] == pytest.approx(64.0)
    assert status["step_s"] == pytest.approx(0.25) and status["allreduce_wait_s"] == 0.002
    assert status["lr"] == 0.05 and status["straggler"] == 1.2 and status["loss"] == 0.5
    assert status["gns"] == 300.0  # the last estimate, kept through steps that did not measure
    assert "checkpoint_step" not in status  # no checkpoint taken yet
    # a checkpoint: its step, stall and time ride on every later status record
    taken_at = clock.time()
    report.on(Event("checkpoint", 6, {"stall_s": 0.012, "staged_bytes": 4096, "parts": 2}))
    for index in range(6, 10):
        clock.now += 0.25
        report.on(
            StepCommitted(
                index,
                0,
                Snapshot(step=index + 1, epoch=0, batch_size=16, version=1, size=2),
                16,
                monitored=True,
                loss=0.5,
                grad_variance=None,
                straggler=1.2,
                gns=None,
                grad_sqnorm=None,
                trace_sigma=None,
                lr=0.05,
                allreduce_wait=0.002,
            )
        )
    status = written[-1]
    assert len(written) == 2 and status["step"] > 6
    assert status["checkpoint_step"] == 6 and status["checkpoint_stall_s"] == 0.012
    assert status["checkpoint_time"] == taken_at
    got = values(job_families(dict(SNAPSHOT, progress=status), Tally()))
    assert got[("taiji_job_checkpoint_step", (("job_id", "j1"),))] == 6
    assert got[("taiji_job_checkpoint_stall_seconds", (("job_id", "j1"),))] == 0.012
    assert got[("taiji_job_checkpoint_timestamp_seconds", (("job_id", "j1"),))] == status["checkpoint_time"]


# -- the HTTP exporter (prometheus_client) ---------------------------------------------------


def test_the_exporter_serves_the_families_and_refuses_a_port_in_use():
    pytest.importorskip(
        "prometheus_client", reason="the metrics extra (pip install 'taiji[metrics]') is missing"
    )
    from taiji.launch.metrics_http import JobExporter, MetricsConfig, MetricsServer

    exporter = JobExporter(lambda: SNAPSHOT)
    exporter.on_actions(
        [
            Publish(spec.ClusterConfig(4, ()), "shrink 3 -> 2"),
            Kill("w9", "no heartbeat for 6.0s (more than --liveness-timeout 5s): ..."),
            Tick(),
        ]
    )
    server = MetricsServer(MetricsConfig(0), exporter.families)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
        assert 'taiji_job_step{job_id="j1"} 120.0' in text
        assert 'taiji_job_resizes_total{job_id="j1",reason="shrink"} 1.0' in text
        assert 'taiji_job_worker_kills_total{job_id="j1",reason="frozen"} 1.0' in text
        assert "# TYPE taiji_job_samples_per_second gauge" in text
        with pytest.raises(LaunchError, match=f"--metrics-port {server.port}: cannot listen on 127.0.0.1"):
            MetricsServer(MetricsConfig(server.port), exporter.families)
    finally:
        server.close()


# -- `taiji top` ------------------------------------------------------------------------------


def test_top_renders_one_row_per_job_with_the_figures():
    text = top.render([SNAPSHOT], {"j9": "the launcher did not answer"}, now=1.7e9 + 2)
    header, line = text.splitlines()[2:4]
    assert header.split()[:4] == ["JOB", "SIZE", "VER", "STEP"]
    cells = line.split()
    assert cells[:7] == ["j1", "2+1/3", "v3", "120", "950", "64", "-"]
    assert "67.0" in cells and "4.0" in cells and "1.10" in cells and "2s" in cells
    assert "busy: w1" in text and "j9: no answer" in text
    assert "no job is running" in top.render([], {}, now=0)


def test_the_grafana_dashboard_names_only_metrics_that_exist():
    import json
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "taiji.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\btaiji_[a-z_]+", e)}
    reply = {"jobs": [], "slots": 1}
    exposed = {f.exposed_name for f in job_families(SNAPSHOT, Tally()) + sched_families(reply, 0, None, {})}
    assert used and used <= exposed, used - exposed
    assert {"taiji_job_samples_per_second", "taiji_sched_host_slots_free"} <= used


def test_a_metrics_port_without_the_extra_says_which_extra_to_install(monkeypatch):
    import argparse
    import sys

    from taiji.errors import ConfigError
    from taiji.launch import metrics_http

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    args = argparse.Namespace(metrics_port=9400, metrics_host="127.0.0.1")
    with pytest.raises(ConfigError, match=r"pip install 'taiji\[metrics\]'"):
        metrics_http.config_of(args)
    assert metrics_http.config_of(argparse.Namespace(metrics_port=None, metrics_host="127.0.0.1")) is None
    with pytest.raises(ConfigError, match="0..65535"):
        metrics_http.config_of(argparse.Namespace(metrics_port=70000, metrics_host="127.0.0.1"))
