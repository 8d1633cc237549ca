"""A whole job lost or reclaimed, then resumed from its checkpoints (tests/scripts/elastic_train.py).

1. SIGKILL every process of a 2-worker job at a random step, `--resume auto` at the same size:
   the steps after the checkpoint are retrained bitwise as they first were, every sample of each
   epoch is trained exactly once across the two runs, and the end matches a 1-worker run.
2. SIGTERM to the launcher: a final checkpoint at the next step boundary, every worker exits,
   status 75 ("resumable"); `--resume auto -np 3` finishes with every invariant.
Every launcher runs in its own session with a hard timeout; every process is reaped.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _harness import ELASTIC_SCRIPT, REPO, _descendants, check_invariants, run_elastic, wait_for

from taiji.checkpoint.storage import Storage

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
STEPS, BATCH = 40, 16


def _start(out: Path, ck: Path, nproc: int, *extra: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", str(nproc), "--timeout", "3",
            "--checkpoint-dir", str(ck), "--checkpoint-every", "4", "--run-dir", str(out / "run"), *extra,
            "--", sys.executable, ELASTIC_SCRIPT, str(out), "--steps", str(STEPS), "--batch", str(BATCH),
            "--step-delay", "0.03"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO),
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)


def _committed(out: Path) -> int:
    path = out / "w0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_all(launcher: subprocess.Popen) -> None:
    """SIGKILL the launcher and every worker (they run in sessions of their own)."""
    pids = _descendants(launcher.pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.communicate(timeout=30)
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in pids), 30,
             "every process of the killed job to be gone")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _merge(first: Path, second: Path, resumed_at: int, into: Path) -> None:
    """The steps the first run committed before the checkpoint, then the resumed run's."""
    into.mkdir()
    for log in sorted(set(p.name for p in first.glob("w*.jsonl")) | set(p.name for p in second.glob("w*.jsonl"))):
        lines = [ln for ln in (first / log).read_text().splitlines() if json.loads(ln)["step"] < resumed_at] \
            if (first / log).exists() else []
        lines += (second / log).read_text().splitlines() if (second / log).exists() else []
        (into / log).write_text("".join(ln + "\n" for ln in lines))
    shutil.copy(second / "final.pt", into / "final.pt")


def _records(out: Path) -> dict[int, str]:
    return {json.loads(ln)["step"]: json.loads(ln)["digest"] for ln in (out / "w0.jsonl").read_text().splitlines()}


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_all(proc)
        raise AssertionError("the launcher did not finish in time")
    return out


def test_whole_job_killed_at_a_random_step_resumes_exactly_once_and_bitwise(tmp_path):
    kill_after = random.Random().randint(9, 30)
    ck = tmp_path / "ck"
    first = _start(tmp_path / "a", ck, 2)
    try:
        wait_for(lambda: _committed(tmp_path / "a") >= kill_after or first.poll() is not None, 90,
                 f"{kill_after} committed steps")
    finally:
        _kill_all(first)
    listing = Storage(str(ck)).listing()
    assert listing.latest is not None and listing.latest % 4 == 0, (kill_after, listing)
    resumed_at = listing.latest
    second = _start(tmp_path / "b", ck, 2, "--resume", "auto")
    out = _finish(second)
    assert second.returncode == 0, out[-4000:]
    redone = _records(tmp_path / "b")
    killed = _records(tmp_path / "a")
    assert min(redone) == resumed_at, f"resumed at step {min(redone)}, the checkpoint is at {resumed_at}"
    both = sorted(set(redone) & set(killed))
    assert all(redone[s] == killed[s] for s in both), "a redone step differs from its first run (same size)"
    _merge(tmp_path / "a", tmp_path / "b", resumed_at, tmp_path / "merged")
    result = check_invariants(tmp_path / "merged", BATCH)
    assert result["steps"] == STEPS, (kill_after, resumed_at, result)
    events = [json.loads(ln) for ln in (tmp_path / "b" / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "resume" and e["step"] == resumed_at for e in events), events


def test_sigterm_takes_a_final_checkpoint_and_the_job_resumes_at_another_size(tmp_path):
    ck = tmp_path / "ck"
    first = _start(tmp_path / "a", ck, 2)
    try:
        wait_for(lambda: _committed(tmp_path / "a") >= 6 or first.poll() is not None, 90, "6 committed steps")
        first.send_signal(signal.SIGTERM)  # the launcher only: it tells its workers
        out = _finish(first, timeout=90)
    finally:
        if first.poll() is None:
            _kill_all(first)
    assert first.returncode == 75, out[-4000:]
    last = max(_records(tmp_path / "a"))
    final = Storage(str(ck)).listing().latest
    assert final == last + 1, f"the final checkpoint (step {final}) is not at the stop (after step index {last})"
    assert f"resumable from {ck}/step-{final:08d}" in out, out[-3000:]
    assert "Traceback" not in out, out[-4000:]
    second = _start(tmp_path / "b", ck, 3, "--resume", "auto", "--max-np", "3")
    out = _finish(second)
    assert second.returncode == 0, out[-4000:]
    assert min(_records(tmp_path / "b")) == final, "nothing redone after a preemption notice"
    _merge(tmp_path / "a", tmp_path / "b", final, tmp_path / "merged")
    result = check_invariants(tmp_path / "merged", BATCH)
    assert result["steps"] == STEPS and result["sizes"] == [2, 3], result


def test_sigterm_without_a_checkpoint_dir_says_nothing_was_saved(tmp_path):
    (tmp_path / "a").mkdir()
    args = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", "2", "--timeout", "3", "--", sys.executable,
            ELASTIC_SCRIPT, str(tmp_path / "a"), "--steps", "400", "--step-delay", "0.03"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO),
                            start_new_session=True)
    try:
        wait_for(lambda: _committed(tmp_path / "a") >= 2 or proc.poll() is not None, 90, "2 committed steps")
        proc.send_signal(signal.SIGTERM)
        out = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            _kill_all(proc)
    assert proc.returncode == 128 + signal.SIGTERM and "nothing was saved" in out, out[-3000:]
