"""Pauses and short last batches: what the Reporter logs for them and how ``taiji plot`` draws
them (a pause is a shaded span, not a throughput collapse; a short batch is not a resize)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taiji.metrics import read_jsonl, runlog
from taiji.metrics.plot import plot_run, timeline
from taiji.runtime import reporting
from taiji.runtime.reporting import Ended, Event, Paused, Reporter, Snapshot, StepCommitted

WALL0 = 1_700_000_000.0


class FakeClock:
    """Stands in for the ``time`` module in reporting and runlog: both clocks move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return WALL0 + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(reporting, "time", fake)
    monkeypatch.setattr(runlog, "time", fake)
    return fake


def committed(
    index: int,
    samples: int,
    decided: int,
    epoch: int = 0,
    epoch_after: int = 0,
    allreduce_wait: float | None = None,
    topology: str = "",
) -> StepCommitted:
    where = Snapshot(step=index + 1, epoch=epoch_after, batch_size=decided, version=1, size=1)
    return StepCommitted(
        index,
        epoch,
        where,
        samples,
        monitored=True,
        loss=1.0,
        grad_variance=None,
        straggler=0.0,
        gns=None,
        grad_sqnorm=None,
        trace_sigma=None,
        lr=0.1,
        allreduce_wait=allreduce_wait,
        topology=topology,
    )


def reporter(run_dir: Path, log_every: int = 0) -> Reporter:
    return Reporter(str(run_dir), log_every, lead=lambda: True, write_status=lambda status: None)


def test_a_pause_is_logged_with_its_start_and_length_and_left_out_of_both_rates(tmp_path, clock):
    report = reporter(tmp_path, log_every=3)
    report.on(Event("start", 0))
    for index in range(2):
        clock.advance(1.0)
        report.on(committed(index, 8, 8))
    clock.advance(5.0)  # an evaluation inside `with job.pause():`
    report.on(Paused())
    clock.advance(1.0)
    report.on(committed(2, 8, 8))  # step 3 is a log_every boundary: the periodic rate
    report.on(Event("end", 3))

    rates = [row["samples_per_s"] for row in read_jsonl(tmp_path / "metrics.jsonl")]
    assert rates == [8.0, 8.0, 8.0]  # the step after the pause is timed from its end
    # 24 samples in 8 s, of which 5 s paused: the periodic rate (log line, status) is 8/s, not 3/s
    assert report.samples_per_second == pytest.approx(8.0)
    pause = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "pause"]
    assert pause == [
        {"time": pytest.approx(WALL0 + 102.0), "kind": "pause", "step": 2, "seconds": pytest.approx(5.0)}
    ]


def test_a_transitions_pause_is_not_logged_again(tmp_path, clock):
    report = reporter(tmp_path)
    report.on(Event("start", 0))
    clock.advance(1.0)
    report.on(committed(0, 8, 8))
    clock.advance(4.0)
    report.on(Event("resize", 1, {"size": 2, "from_size": 1, "seconds": 4.0}))
    report.on(Paused(transition=True))  # the transition's: its event already says how long it took
    clock.advance(1.0)
    report.on(committed(1, 8, 8))
    clock.advance(2.0)
    report.on(Paused())  # a later job.pause() is logged as usual
    report.on(Event("end", 2))
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [e["kind"] for e in events] == ["start", "resize", "pause", "end"]
    assert events[2]["step"] == 2 and events[2]["seconds"] == pytest.approx(2.0)
    assert [row["samples_per_s"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [8.0, 8.0]


def test_a_step_row_logs_the_decided_batch_size_and_the_samples_it_trained_on(tmp_path, clock):
    report = reporter(tmp_path)
    report.on(Event("start", 0))
    for index, samples in enumerate([4, 4, 2, 4]):  # 10 samples, batch 4: epoch 0 ends short
        clock.advance(0.5)
        report.on(committed(index, samples, 4))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["batch_size"], r["samples"]) for r in rows] == [(4, 4), (4, 4), (4, 2), (4, 4)]
    assert [r["samples_per_s"] for r in rows] == [8.0, 8.0, 4.0, 8.0]


def metric(t: float, step: int, samples: int, decided: int, rate: float) -> dict:
    return {
        "time": t,
        "step": step,
        "size": 1,
        "batch_size": decided,
        "samples": samples,
        "samples_per_s": rate,
        "loss": 1.0,
    }


def test_timeline_shades_recorded_pauses_and_keeps_the_rate_after_them():
    # a 5 s pause after step 4: step 5 is logged at 10 s and was timed from the pause's end
    metrics = [metric(s + (5.0 if s >= 5 else 0.0), s, 8, 8, 8.0) for s in range(10)]
    events = [{"time": 4.0, "kind": "pause", "step": 5, "seconds": 5.0}]
    data = timeline(metrics, events, 0.0)
    assert data.pauses == [(4.0, 9.0)]
    assert (4.0, 9.0) in data.breaks
    assert data.series["samples_per_s"] == (
        [0.0, 1.0, 2.0, 3.0, 4.0, 10.0, 11.0, 12.0, 13.0, 14.0],
        [8.0] * 10,
    )


def test_timeline_drops_a_rate_timed_across_an_unrecorded_gap():
    """User code between steps outside job.pause(): the step after it took 6 s for 8 samples,
    which is the gap's length, not a collapse of training speed."""
    metrics = [metric(float(s), s, 8, 8, 8.0) for s in range(5)]
    metrics += [metric(10.0, 5, 8, 8, 8 / 6.0)] + [metric(10.0 + s, 5 + s, 8, 8, 8.0) for s in range(1, 5)]
    data = timeline(metrics, [], 0.0)
    xs, ys = data.series["samples_per_s"]
    assert 10.0 not in xs and min(ys) == 8.0
    assert data.pauses == [] and data.breaks == [(4.0, 10.0)]


def test_timeline_plots_the_decided_batch_and_marks_short_last_batches():
    steps = [(4, 4), (4, 4), (2, 4), (4, 4), (4, 4), (2, 4), (6, 6)]  # (samples, decided)
    metrics = [metric(float(i), i, samples, decided, 8.0) for i, (samples, decided) in enumerate(steps)]
    data = timeline(metrics, [], 0.0)
    assert data.series["batch_size"][1] == [4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 6.0]  # one change, to 6
    assert data.short_batches == ([2.0, 5.0], [2.0, 2.0])


def test_plot_run_draws_pauses_and_short_batches_from_a_reporters_run_dir(tmp_path, clock):
    report = reporter(tmp_path)
    report.on(Event("start", 0))
    for index in range(30):
        clock.advance(0.5)
        report.on(
            committed(
                index,
                3 if index % 10 == 9 else 4,
                4,
                allreduce_wait=0.002 if index < 20 else None,
                topology="tree",
            )
        )
        if index == 14:
            clock.advance(6.0)
            report.on(Paused())
    report.on(Event("end", 30))
    report.on(Ended(Snapshot(30, 1, 4, 1, 1)))
    data = timeline(read_jsonl(tmp_path / "metrics.jsonl"), read_jsonl(tmp_path / "events.jsonl"), WALL0)
    assert data.pauses == [(pytest.approx(107.5), pytest.approx(113.5))]
    assert set(data.series["batch_size"][1]) == {4.0} and data.short_batches[1] == [3.0, 3.0, 3.0]
    assert set(data.series["samples_per_s"][1]) == {6.0, 8.0}  # 3 or 4 samples in 0.5 s each
    assert data.series["allreduce_wait_ms"][1] == [pytest.approx(2.0)] * 20  # none where no allreduce ran
    assert {r["topology"] for r in read_jsonl(tmp_path / "metrics.jsonl")} == {"tree"}
    output = plot_run(tmp_path)
    assert output.read_bytes().startswith(b"\x89PNG")


def test_a_step_row_carries_the_epoch_its_samples_came_from(tmp_path, clock):
    """An epoch's short last step commits into the next epoch: its row still names its own."""
    report = reporter(tmp_path)
    report.on(Event("start", 0))
    clock.advance(1.0)
    report.on(committed(0, 2, 4, epoch=0, epoch_after=1))
    assert [row["epoch"] for row in read_jsonl(tmp_path / "metrics.jsonl")] == [0]
