"""Lightning and Hugging Face Trainer entry points (issue #39) under real `taiji run` processes.

Each framework trains on 2 workers, grows to 3 (asked for at start, so the joiner boots while the
first workers do), loses a SIGKILLed worker once steps at 3 workers were committed, and stops a few
steps later by a policy. The per-step logs are audited as docs/design.md#invariants asks
(tests/scripts/elastic_train.py ``audit``): contiguous committed steps, bitwise-identical replicas after every
step, every sample of every finished epoch exactly once, and the final model equal to an
uninterrupted 1-worker taiji Job's. A 1-worker run under plain ``python`` equals the framework's
own single-process run. A 2-worker job that saves the framework's own checkpoints is SIGKILLed whole
and resumed through the framework's resume path (``ckpt_path=``, ``resume_from_checkpoint=``): the
steps after the checkpoint are trained again bitwise as they first ran, every sample once. No
worker is killed at its exit (the launcher's grace after training ends, issue 39).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taiji_harness.testing import REPO, SCRIPTS, kill_job, load_script, stop_launcher, wait_for

pytestmark = pytest.mark.slow

BATCH = 16
EXIT_KILL = (
    "after it stopped its heartbeat at the end of training"  # the launcher's message when it kills one
)


def committed_at(out: Path, size: int) -> int:
    """Steps committed at ``size`` workers so far (rank 0's log)."""
    path = out / "w0.jsonl"
    if not path.exists():
        return 0
    return sum(
        1 for line in path.read_text().splitlines() if line.endswith("}") and json.loads(line)["size"] == size
    )


def grow_kill_and_audit(
    out: Path, script: str, *args: str, same_model: bool = True, timeout: float = 300
) -> dict:
    """`taiji run -np 2 --max-np 3` on ``script``: grown to 3 at start; w1 SIGKILLed once 3 steps
    at 3 workers are committed; a policy changes the global batch every 4 steps (mid-epoch, the
    LR following it); the audit of its logs."""
    command = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--max-np",
        "3",
        "--timeout",
        "10",
        "--run-dir",
        str(out / "run"),
        "--",
        sys.executable,
        str(SCRIPTS / script),
        str(out),
        "--batch",
        str(BATCH),
        "--steps",
        "3000",
        "--peak",
        "3",
        "--shuffle",
        "--grow-at-start",
        "--policy",
        "cycle",
        *args,
    ]
    log = open(out / "launcher.log", "w")
    launcher = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(REPO),
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: committed_at(out, 3) >= 3 or launcher.poll() is not None, timeout, "3 steps at 3 workers"
        )
        assert launcher.poll() is None, (out / "launcher.log").read_text()[-4000:]
        os.kill(int((out / "w1.pid").read_text()), signal.SIGKILL)
        launcher.wait(timeout=timeout)
    finally:
        stop_launcher(launcher, grace=10)
        log.close()
    text = (out / "launcher.log").read_text()
    assert launcher.returncode == 0, text[-4000:]
    assert EXIT_KILL not in text, "a worker was killed while it exited"
    result = load_script("elastic_train").audit(out, BATCH, policy="cycle")
    assert result["steps"] > 0 and not result["gaps"] and not result["worker_gaps"], result
    assert not result["divergences"], f"replicas differ after steps {result['divergences']}"
    assert result["lost_samples"] == 0 and result["duplicated_samples"] == 0, result
    assert result["sizes"][:3] == [2, 3, 2], result["sizes"]
    if same_model:  # elastic_train.py's model and optimizer: its uninterrupted 1-worker Job is the reference
        assert result["trajectory_error"] is not None and result["trajectory_error"] < 1e-9, result
    return result


def plain_equals_own(tmp_path: Path, script: str, prefix: str = "") -> None:
    """One worker under plain ``python`` against the framework's own single-process run (the two
    one after the other in one process: one import of the framework)."""
    subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / script),
            str(tmp_path),
            "--steps",
            "20",
            "--batch",
            str(BATCH),
            "--compare",
        ],
        check=True,
        cwd=str(REPO),
        timeout=240,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ours, theirs = torch.load(tmp_path / f"{prefix}final.pt"), torch.load(tmp_path / f"{prefix}plain.pt")
    assert max(float((a - b).abs().max()) for a, b in zip(ours, theirs)) < 1e-9


def test_lightning_grows_survives_a_kill_exactly_once(tmp_path):
    pytest.importorskip(
        "lightning", reason="the lightning extra is not installed: pip install 'taiji[lightning]'"
    )
    grow_kill_and_audit(tmp_path, "lightning_train.py", "--step-delay", "0.02")


def test_lightning_one_worker_equals_lightnings_own_loop(tmp_path):
    pytest.importorskip(
        "lightning", reason="the lightning extra is not installed: pip install 'taiji[lightning]'"
    )
    plain_equals_own(tmp_path, "lightning_train.py")


def test_hf_trainer_grows_survives_a_kill_exactly_once(tmp_path):
    pytest.importorskip(
        "transformers", reason="the transformers extra is not installed: pip install 'taiji[transformers]'"
    )
    grow_kill_and_audit(tmp_path, "hf_train.py", same_model=False)


def test_hf_trainer_one_worker_equals_the_trainers_own_loop(tmp_path):
    pytest.importorskip(
        "transformers", reason="the transformers extra is not installed: pip install 'taiji[transformers]'"
    )
    plain_equals_own(tmp_path, "hf_train.py", prefix="hf_")
    # the gradient norm the Trainer logs is the one its own loop logs (taken before the commit)
    ours, theirs = torch.load(tmp_path / "hf_norms.pt"), torch.load(tmp_path / "hf_plain_norms.pt")
    assert len(ours) == len(theirs) == 2 and ours == pytest.approx(theirs, rel=1e-6), (ours, theirs)


def launch(out: Path, script: str, *args: str) -> subprocess.Popen:
    """`taiji run -np 2` on ``script`` (the batch changed every 4 steps by a policy), logging to OUT."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--timeout",
        "10",
        "--",
        sys.executable,
        str(SCRIPTS / script),
        str(out),
        "--batch",
        str(BATCH),
        "--steps",
        "16",
        "--shuffle",
        "--policy",
        "cycle",
        *args,
    ]
    with open(out / "launcher.log", "w") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,
        )


def rows(out: Path, worker: str = "w0") -> dict[int, dict]:
    path = out / f"{worker}.jsonl"
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def killed_then_resumed(tmp_path: Path, script: str, save: list[str], resume_from: Path, final: str) -> dict:
    """Run a: 2 workers, the framework's checkpoint every 4 steps, every process SIGKILLed once
    step 10 is committed (the checkpoint of step 8 is complete by then: rank 0 writes it before its
    next step). Run b: the same job resumed from that checkpoint through the framework. The steps
    it trains again (8 on) match run a's bitwise (same size: SyncSGD is deterministic); the two
    runs' logs, a's steps before 8 and b's from 8, are audited as one job."""
    a, b = tmp_path / "a", tmp_path / "b"
    first = launch(a, script, *save, "--step-delay", "0.05")
    try:
        wait_for(lambda: len(rows(a)) >= 11 or first.poll() is not None, 240, "step 10 of run a")
    finally:
        kill_job(first.pid)
        first.wait()
    assert resume_from.exists(), sorted(p.name for p in resume_from.parent.iterdir())
    second = launch(b, script, "--resume", str(resume_from))
    try:
        second.wait(timeout=240)
    finally:
        stop_launcher(second, grace=10)
    text = (b / "launcher.log").read_text()
    assert second.returncode == 0, text[-4000:]
    assert EXIT_KILL not in text, "a worker was killed while it exited"
    before, after = rows(a), rows(b)
    assert min(after) == 8, f"run b began at step {min(after)}, not at the checkpoint's step 8"
    again = sorted(set(before) & set(after))
    assert again and again[0] == 8, (sorted(before), sorted(after))
    for step in again:
        assert (after[step]["epoch"], after[step]["span"], after[step]["digest"]) == (
            before[step]["epoch"],
            before[step]["span"],
            before[step]["digest"],
        ), f"step {step} trained differently"
    merged = tmp_path / "merged"
    merged.mkdir()
    for worker in ("w0", "w1"):
        lines = [json.dumps(r) for r in rows(a, worker).values() if r["step"] < 8]
        lines += [json.dumps(r) for r in rows(b, worker).values()]
        (merged / f"{worker}.jsonl").write_text("".join(line + "\n" for line in lines))
    if final == "final.pt":
        (merged / final).write_bytes((b / final).read_bytes())
    result = load_script("elastic_train").audit(merged, BATCH, policy="cycle")
    assert result["steps"] == 16 and not result["gaps"] and not result["worker_gaps"], result
    assert not result["divergences"], f"replicas differ after steps {result['divergences']}"
    assert result["lost_samples"] == 0 and result["duplicated_samples"] == 0, result
    return result


def test_lightning_resumes_through_ckpt_path_exactly_once(tmp_path):
    pytest.importorskip(
        "lightning", reason="the lightning extra is not installed: pip install 'taiji[lightning]'"
    )
    ckpt = tmp_path / "ckpt"
    result = killed_then_resumed(
        tmp_path,
        "lightning_train.py",
        ["--checkpoint-every", "4", str(ckpt)],
        ckpt / "step=8.ckpt",
        "final.pt",
    )
    # the resumed job ends where an uninterrupted 1-worker Job ends (the policies' batch changes included)
    assert result["trajectory_error"] is not None and result["trajectory_error"] < 1e-9, result


def test_hf_trainer_resumes_through_resume_from_checkpoint_exactly_once(tmp_path):
    pytest.importorskip(
        "transformers", reason="the transformers extra is not installed: pip install 'taiji[transformers]'"
    )
    killed_then_resumed(
        tmp_path,
        "hf_train.py",
        ["--checkpoint-every", "4"],
        tmp_path / "a" / "hf" / "checkpoint-8",
        "hf_final.pt",
    )
