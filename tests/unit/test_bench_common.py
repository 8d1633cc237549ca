"""The benchmarks' harness (taiji_harness/bench.py): processes are always ended and reaped, and
the repetition and statistics helpers. The processes started here are short shell commands."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from taiji_harness.bench import (
    Session,
    interleaved,
    paired_ratio,
    run_launcher,
    run_to_end,
    signal_if_ours,
    spread,
    wait_all,
)


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for whoever its parent now is."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_until_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_close_kills_the_whole_session_and_reaps_its_first_process(tmp_path):
    # the shell starts a background child, tells us its pid, and waits
    session = Session(["bash", "-c", "sleep 60 & echo $!; wait"], output=tmp_path / "out")
    deadline = time.monotonic() + 10
    while not session.text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(session.text().split()[0])
    assert session.running() and not gone(child)
    session.close()
    assert session.returncode is not None  # reaped, not a zombie of ours
    assert wait_until_gone(child)  # the grandchild went with its session


def test_running_does_not_reap_so_close_can_still_signal_the_group(tmp_path):
    session = Session(["bash", "-c", "exit 3"], output=tmp_path / "out")
    deadline = time.monotonic() + 10
    while session.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert session.returncode == 3
    assert session.popen.returncode is None  # seen exited, not reaped yet
    session.close()
    assert session.popen.returncode == 3


def test_run_to_end_kills_at_the_timeout_and_keeps_the_output():
    started = time.monotonic()
    finished = run_to_end(["bash", "-c", "echo started; sleep 60"], timeout=0.5, name="sleeper")
    assert finished.timed_out and finished.returncode is None
    assert time.monotonic() - started < 10
    assert finished.output.strip() == "started"


def test_run_to_end_reports_the_exit_code_and_output(tmp_path):
    finished = run_to_end(
        [sys.executable, "-c", "print('hello'); raise SystemExit(4)"],
        timeout=30,
        name="x",
        output=tmp_path / "log",
    )
    assert (finished.returncode, finished.output.strip()) == (4, "hello")
    assert (tmp_path / "log").read_text().strip() == "hello"


def test_a_temporary_output_file_is_removed_on_close():
    session = Session(["true"])
    path = session.output
    session.wait(30)
    session.close()
    assert not path.exists()
    assert session.text() == ""


def test_run_launcher_raises_with_the_output_on_a_failed_command(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)exited with 3.*boom"):
        run_launcher(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "log", 30, name="job"
        )
    with pytest.raises(RuntimeError, match="still running"):
        run_launcher(["sleep", "60"], tmp_path / "log", 0.3, name="job")
    assert run_launcher(["true"], tmp_path / "log", 30, name="job").returncode == 0


def test_wait_all_fails_fast_on_the_first_failure(tmp_path):
    slow = Session(["sleep", "60"], output=tmp_path / "slow")
    failing = Session(["bash", "-c", "echo broken; exit 2"], output=tmp_path / "failing", name="failing")
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="(?s)failing exited with 2.*broken"):
            wait_all([slow, failing], timeout=30, what="workers")
        assert time.monotonic() - started < 10
    finally:
        slow.close()
        failing.close()
    assert slow.returncode is not None


def test_wait_all_times_out(tmp_path):
    with Session(["sleep", "60"], output=tmp_path / "out") as slow:
        with pytest.raises(RuntimeError, match="still running"):
            wait_all([slow], timeout=0.2, what="workers")


def test_signal_if_ours_spares_a_process_without_the_marker(tmp_path):
    with subprocess.Popen(["sleep", "60"]) as stranger:
        try:
            signal_if_ours(stranger.pid, 9, marker=str(tmp_path))
            time.sleep(0.1)
            assert stranger.poll() is None
            signal_if_ours(stranger.pid, 9, marker="60")
            assert stranger.wait(timeout=5) == -9
        finally:
            stranger.kill()
    signal_if_ours(2**22 + 12345, 9, marker="x")  # no such process: nothing happens


def test_interleaved_reverses_every_other_repetition():
    assert interleaved(["taiji", "anchor"], 0) == ["taiji", "anchor"]
    assert interleaved(("taiji", "anchor", "job"), 1) == ["job", "anchor", "taiji"]
    assert interleaved(["a", "b"], 2) == ["a", "b"]


def test_paired_ratio_is_the_median_of_anchor_over_taiji():
    assert paired_ratio([1.0, 2.0, 4.0], [2.0, 2.0, 2.0]) == 1.0  # ratios 2, 1, 0.5
    assert paired_ratio([1.0, 1.0], [1.1, 1.3]) == pytest.approx(1.2)
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        paired_ratio([], [])


def test_spread_is_min_and_max():
    assert spread([3.0, 1.23456, 2.0], digits=2) == [1.23, 3.0]
