"""A whole job lost or reclaimed, then resumed from its checkpoints (tests/scripts/elastic_train.py).

SIGKILL every process of a 2-worker job at a random step, `--resume auto` at the same size: the
steps after the checkpoint are retrained bitwise as they first were. SIGTERM to that launcher: a
final checkpoint at the next step boundary, every worker exits, status 75 ("resumable"). Then
`--resume auto -np 3` to the end: every sample of each epoch trained exactly once across the
three runs, and the end matches an uninterrupted 1-worker run.
A worker SIGKILLed while a checkpoint is being written leaves it invisible: the previous one loads.
Every launcher runs in its own session with a hard timeout; every process is reaped.
"""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from taiji.checkpoint.storage import Storage
from taiji_harness.testing import (
    ELASTIC_SCRIPT,
    REPO,
    check_invariants,
    committed_steps,
    kill_job,
    merge_runs,
    wait_for,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
STEPS, BATCH = 36, 16


def _start(out: Path, ck: Path, nproc: int, *extra: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(nproc),
        "--timeout",
        "3",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "4",
        "--run-dir",
        str(out / "run"),
        *extra,
        "--",
        sys.executable,
        ELASTIC_SCRIPT,
        str(out),
        "--steps",
        str(STEPS),
        "--batch",
        str(BATCH),
        "--step-delay",
        "0.03",
    ]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(REPO),
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )


def _kill_all(launcher: subprocess.Popen) -> None:
    """SIGKILL the launcher and every worker (they run in sessions of their own)."""
    kill_job(launcher.pid)
    launcher.communicate(timeout=30)


def _records(out: Path) -> dict[int, str]:
    return {
        json.loads(ln)["step"]: json.loads(ln)["digest"] for ln in (out / "w0.jsonl").read_text().splitlines()
    }


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_all(proc)
        raise AssertionError("the launcher did not finish in time") from None
    return out


def test_killed_then_preempted_job_resumes_exactly_once_bitwise_and_at_another_size(tmp_path):
    """Run a (2 workers) is SIGKILLed whole at a random step; run b resumes it at the same size
    and is preempted (SIGTERM to its launcher); run c resumes it with 3 workers to the end."""
    # one or two steps past a checkpoint (every 4 steps): the checkpoint the kill leaves (its write is
    # asynchronous: the one before may be the latest) is older than the last recorded step, so at least
    # one redone step has a first run to be compared with
    kill_after = random.Random().choice([9, 10, 13, 14, 17, 18, 21, 22])
    ck = tmp_path / "ck"
    a = _start(tmp_path / "a", ck, 2)
    try:
        wait_for(
            lambda: committed_steps(tmp_path / "a") >= kill_after or a.poll() is not None,
            90,
            f"{kill_after} committed steps",
        )
    finally:
        _kill_all(a)
    killed_at = Storage(str(ck)).listing().latest
    assert killed_at is not None and killed_at % 4 == 0, (kill_after, Storage(str(ck)).listing())

    b = _start(tmp_path / "b", ck, 2, "--resume", "auto")
    try:
        wait_for(lambda: committed_steps(tmp_path / "b") >= 3 or b.poll() is not None, 90, "3 resumed steps")
        b.send_signal(signal.SIGTERM)  # the launcher only: it tells its workers
        out = _finish(b, timeout=90)
    finally:
        if b.poll() is None:
            _kill_all(b)
    assert b.returncode == 75, out[-4000:]
    redone, first = _records(tmp_path / "b"), _records(tmp_path / "a")
    assert min(redone) == killed_at, f"resumed at step {min(redone)}, the checkpoint is at {killed_at}"
    both = sorted(set(redone) & set(first))
    assert both and all(redone[s] == first[s] for s in both), "a redone step differs from its first run"
    stopped_at = Storage(str(ck)).listing().latest
    assert stopped_at == max(redone) + 1, (
        f"the final checkpoint ({stopped_at}) is not at the stop ({max(redone)})"
    )
    assert f"resumable from {ck}/step-{stopped_at:08d}" in out and "Traceback" not in out, out[-4000:]
    events = [json.loads(ln) for ln in (tmp_path / "b" / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "resume" and e["step"] == killed_at for e in events), events

    c = _start(tmp_path / "c", ck, 3, "--resume", "auto", "--max-np", "3")
    out = _finish(c)
    assert c.returncode == 0, out[-4000:]
    assert min(_records(tmp_path / "c")) == stopped_at, "nothing is redone after a preemption notice"
    merge_runs(
        [
            (tmp_path / "a", 0, killed_at),
            (tmp_path / "b", killed_at, stopped_at),
            (tmp_path / "c", stopped_at, STEPS),
        ],
        tmp_path / "merged",
    )
    result = check_invariants(tmp_path / "merged", BATCH)  # exactly once; the 1-worker trajectory
    assert result["steps"] == STEPS and result["sizes"] == [2, 3], (kill_after, killed_at, stopped_at, result)


KILLED_WRITER = """
import sys, torch, taiji
from torch.utils.data import TensorDataset
from taiji.runtime.peer import Peer
torch.manual_seed(0)
model = torch.nn.Linear(2048, 2048)  # 16 MiB of parameters, 48 MiB with Adam's state
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(64, 2048), torch.randn(64, 2048))
job = taiji.Job(model, opt, data, 8, peer=Peer.solo(), log_every=0, epochs=10**6,
                checkpoint=taiji.Checkpoint(sys.argv[1], steps=1, keep=100))
for step in job:
    x, y = step.batch
    step.backward(((model(x) - y) ** 2).mean())
"""


def test_sigkill_during_a_write_leaves_the_previous_checkpoint_the_one_that_loads(tmp_path):
    """A worker that checkpoints every step is SIGKILLed as soon as a checkpoint directory exists
    that is not complete (a write in flight): that one stays invisible, the previous one loads."""
    root = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(root)],
        cwd=str(REPO),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    storage = Storage(str(root))
    try:
        wait_for(
            lambda: (
                proc.poll() is not None
                or (storage.listing().latest is not None and storage.listing().incomplete)
            ),
            60,
            "a complete checkpoint and a later one being written",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    listing = storage.listing()
    assert listing.incomplete and listing.latest is not None and listing.incomplete[-1] > listing.latest, (
        listing
    )
    import torch

    from taiji.checkpoint.reader import load_checkpoint

    model = torch.nn.Linear(2048, 2048)
    assert load_checkpoint(str(root), model)["step"] == listing.latest
