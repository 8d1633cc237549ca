"""RunLog (JSONL metrics/events) and plot_run (timeline PNG)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch

from taiji.errors import ConfigError
from taiji.metrics import RunLog, json_safe, plot_run, read_jsonl


def write_synthetic_run(run_dir: Path, steps: int = 200, seed: int = 0) -> None:
    """A realistic run: 2 -> 3 workers, batch 128 -> 256 -> 512, a failure 3 -> 2 and recovery."""
    rng = random.Random(seed)
    t = 1_700_000_000.0
    size, batch = 2, 128
    with RunLog(run_dir) as runlog:
        runlog.log_event("start", 0, time=t, size=size, batch_size=batch)
        for step in range(steps):
            if step == 50:
                batch = 256
                runlog.log_event("policy", step, time=t, decision="SetBatchSize(256)", gns=190.0)
            if step == 70:
                runlog.log_event("resize", step, time=t, size=3, old_size=size)
                size = 3
                t += 4.0  # joiner synchronizes state
            if step == 120:
                runlog.log_event("failure", step, time=t, size=2, lost_rank=1, error="PeerLost")
                size = 2
                t += 6.5  # collective timeout, then the launcher publishes the new config
                runlog.log_event("recovery", step, time=t, size=size, retried_step=step)
            if step == 140:
                batch = 512
                runlog.log_event("policy", step, time=t, decision="SetBatchSize(512)", gns=610.0)
            speed = size * 420.0 * (0.9 if size == 3 else 1.0) * (1 + 0.08 * rng.gauss(0, 1))
            t += batch / speed
            gns = 50.0 * 16 ** (step / steps) * math.exp(0.15 * rng.gauss(0, 1))
            runlog.log_metrics(
                {
                    "time": t,
                    "step": step,
                    "epoch": step // 100,
                    "version": 1 + (step >= 70) + (step >= 120),
                    "size": size,
                    "batch_size": batch,
                    "loss": 2.3 * math.exp(-step / 80) + 0.25 + 0.05 * rng.gauss(0, 1),
                    "samples_per_s": speed,
                    "gns": None if step < 5 or rng.random() < 0.05 else gns,
                    "lr": 0.1 * batch / 128,
                    "straggler": None,
                }
            )
        runlog.log_event("end", steps, time=t + 0.5)


def test_metrics_and_events_are_written_one_json_line_each(tmp_path):
    run = tmp_path / "a" / "b"  # parents are created
    with RunLog(run) as runlog:
        runlog.log_metrics({"step": 0, "loss": 1.5, "size": 2, "gns": None})
        runlog.log_metrics({"step": 1, "time": 12.5, "loss": 1.25})
        runlog.log_event("resize", 1, size=3, old_size=2)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["step"] == 0 and first["loss"] == 1.5 and first["gns"] is None
    assert isinstance(first["time"], float) and first["time"] > 1e9
    assert second == {"time": 12.5, "step": 1, "loss": 1.25}
    (event,) = read_jsonl(run / "events.jsonl")
    assert event["kind"] == "resize" and event["step"] == 1 and event["size"] == 3
    assert event["old_size"] == 2 and isinstance(event["time"], float)


def test_nan_and_inf_become_null_and_tensors_plain(tmp_path):
    with RunLog(tmp_path) as runlog:
        runlog.log_metrics(
            {
                "step": torch.tensor(3),
                "loss": float("nan"),
                "gns": float("inf"),
                "trace_sigma": -math.inf,
                "grad_sqnorm": torch.tensor(0.5),
                "nested": [1.0, float("nan")],
            }
        )
        runlog.log_event("policy", 3, gain=float("nan"))
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    (record,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert record["step"] == 3
    assert record["loss"] is None and record["gns"] is None and record["trace_sigma"] is None
    assert record["grad_sqnorm"] == 0.5 and record["nested"] == [1.0, None]
    assert read_jsonl(tmp_path / "events.jsonl")[0]["gain"] is None
    assert json_safe({"x": (float("nan"), 2)}) == {"x": [None, 2]}


def test_a_new_runlog_appends_to_the_same_files(tmp_path):
    with RunLog(tmp_path) as runlog:
        runlog.log_metrics({"step": 0})
        runlog.log_event("start", 0)
    with RunLog(tmp_path) as runlog:  # the rank 0 that takes over after a failure
        runlog.log_event("recovery", 1, size=2)
        runlog.log_metrics({"step": 1})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    assert [e["kind"] for e in read_jsonl(tmp_path / "events.jsonl")] == ["start", "recovery"]


def test_lines_are_on_disk_before_close(tmp_path):
    runlog = RunLog(tmp_path)
    runlog.log_metrics({"step": 7})
    runlog.log_event("failure", 7, lost_rank=2)
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["step"] == 7
    assert read_jsonl(tmp_path / "events.jsonl")[0]["lost_rank"] == 2
    runlog.close()
    runlog.close()  # idempotent
    with pytest.raises(ConfigError, match="closed"):
        runlog.log_metrics({"step": 8})


def test_truncated_last_line_is_skipped_and_the_next_writer_starts_a_fresh_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"time": 1.0, "step": 0}\n{"time": 2.0, "step": 1}\n{"time": 3.0, "st')
    assert [r["step"] for r in read_jsonl(path)] == [0, 1]
    with RunLog(tmp_path) as runlog:
        runlog.log_metrics({"step": 2})
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]


def test_metrics_need_a_step_and_events_a_kind(tmp_path):
    with RunLog(tmp_path) as runlog:
        with pytest.raises(ConfigError, match="step"):
            runlog.log_metrics({"loss": 1.0})
        with pytest.raises(ConfigError, match="kind"):
            runlog.log_event("", 0)


def test_tensorboard_is_optional_and_its_absence_is_a_clear_error(tmp_path, monkeypatch):
    RunLog(tmp_path / "plain").close()  # the default never touches tensorboard
    # Make the import fail even where tensorboard happens to be installed.
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match=r"pip install taiji\[tensorboard\]"):
        RunLog(tmp_path / "tb", tensorboard=True)
    assert not (tmp_path / "tb").exists()  # nothing half-made


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 20_000  # a real figure, not an empty canvas


def test_plot_run_writes_a_timeline_png(tmp_path):
    write_synthetic_run(tmp_path / "run")
    output = plot_run(tmp_path / "run")
    assert output == tmp_path / "run" / "timeline.png"
    _assert_png(output)
    custom = plot_run(str(tmp_path / "run"), tmp_path / "out" / "t.png")
    assert custom == tmp_path / "out" / "t.png"
    _assert_png(custom)


def test_plot_run_without_events_or_some_series(tmp_path):
    with RunLog(tmp_path) as runlog:
        for step in range(50):
            runlog.log_metrics(
                {"time": 100.0 + step, "step": step, "size": 1, "loss": 1.0 / (step + 1), "gns": None}
            )
    (tmp_path / "events.jsonl").unlink()
    _assert_png(plot_run(tmp_path))


def test_plot_run_on_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        plot_run(tmp_path / "nope")
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        plot_run(tmp_path)


def test_plot_run_with_a_single_record_or_only_events(tmp_path):
    with RunLog(tmp_path / "one") as runlog:
        runlog.log_metrics({"step": 0, "loss": 1.0, "size": 1, "batch_size": 32})
    _assert_png(plot_run(tmp_path / "one"))
    with RunLog(tmp_path / "events") as runlog:
        runlog.log_event("start", 0)
        runlog.log_event("failure", 0, lost_rank=0)
    _assert_png(plot_run(tmp_path / "events"))
    RunLog(tmp_path / "empty").close()
    with pytest.raises(ConfigError, match="nothing to plot"):
        plot_run(tmp_path / "empty")


def test_event_labels_show_the_decided_value():
    from taiji.metrics.plot import _event_label

    assert (
        _event_label({"kind": "policy", "decision": "SetBatchSize(batch_size=632)", "step": 100})
        == "policy: SetBatchSize(632) @100"
    )
    assert (
        _event_label({"kind": "strategy", "strategy": "pair_averaging", "step": 7})
        == "strategy→pair_averaging @7"
    )


def test_last_recorded_step_reads_the_tails_skipping_torn_and_cut_lines(tmp_path):
    from taiji.metrics.runlog import last_recorded_step

    assert last_recorded_step(tmp_path) is None  # no files
    (tmp_path / "metrics.jsonl").write_text(
        "".join(f'{{"time": 1, "step": {i}}}\n' for i in range(2000)) + '{"time": 1, "st'
    )  # torn by a crash
    (tmp_path / "events.jsonl").write_text(
        '{"kind": "start", "step": 0}\n[1]\n{"kind": "end", "step": 1500}\n'
    )
    assert last_recorded_step(tmp_path) == 1999
    assert last_recorded_step(tmp_path, tail_bytes=60) == 1999  # only the end is read; a cut line skipped
    (tmp_path / "metrics.jsonl").unlink()
    assert last_recorded_step(tmp_path) == 1500
