"""Lightning and Hugging Face Trainer entry points (issue #39) under real `taiji run` processes.

Each framework trains on 2 workers, grows to 3 (asked for at start, so the joiner boots while the
first workers do), loses a SIGKILLed worker once steps at 3 workers were committed, and stops a few
steps later by a policy. The per-step logs are audited as DESIGN §6 asks (tests/scripts/
elastic_train.py ``audit``): contiguous committed steps, bitwise-identical replicas after every
step, every sample of every finished epoch exactly once, and the final model equal to an
uninterrupted 1-worker taiji Job's. A 1-worker run under plain ``python`` equals the framework's
own single-process run.
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

from taiji_harness.testing import REPO, SCRIPTS, load_script, stop_launcher, wait_for

pytestmark = pytest.mark.slow

BATCH = 16


def committed_at(out: Path, size: int) -> int:
    """Steps committed at ``size`` workers so far (rank 0's log)."""
    path = out / "w0.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}") and json.loads(line)["size"] == size)


def grow_kill_and_audit(out: Path, script: str, *args: str, same_model: bool = True, timeout: float = 300) -> dict:
    """`taiji run -np 2 --max-np 3` on ``script``: grown to 3 at start; w1 SIGKILLed once 3 steps
    at 3 workers are committed; a policy changes the global batch every 4 steps (mid-epoch, the
    LR following it); the audit of its logs."""
    command = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", "2", "--max-np", "3", "--timeout", "10",
               "--run-dir", str(out / "run"), "--", sys.executable, str(SCRIPTS / script), str(out),
               "--batch", str(BATCH), "--steps", "3000", "--peak", "3", "--shuffle", "--grow-at-start", "--policy", "cycle", *args]
    log = open(out / "launcher.log", "w")
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        wait_for(lambda: committed_at(out, 3) >= 3 or launcher.poll() is not None, timeout, "3 steps at 3 workers")
        assert launcher.poll() is None, (out / "launcher.log").read_text()[-4000:]
        os.kill(int((out / "w1.pid").read_text()), signal.SIGKILL)
        launcher.wait(timeout=timeout)
    finally:
        stop_launcher(launcher, grace=10)
        log.close()
    text = (out / "launcher.log").read_text()
    assert launcher.returncode == 0, text[-4000:]
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
    subprocess.run([sys.executable, str(SCRIPTS / script), str(tmp_path), "--steps", "20", "--batch", str(BATCH),
                    "--compare"], check=True, cwd=str(REPO), timeout=240, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    ours, theirs = torch.load(tmp_path / f"{prefix}final.pt"), torch.load(tmp_path / f"{prefix}plain.pt")
    assert max(float((a - b).abs().max()) for a, b in zip(ours, theirs)) < 1e-9


def test_lightning_grows_survives_a_kill_exactly_once(tmp_path):
    pytest.importorskip("lightning", reason="the lightning extra is not installed: pip install 'taiji[lightning]'")
    grow_kill_and_audit(tmp_path, "lightning_train.py", "--step-delay", "0.02")


def test_lightning_one_worker_equals_lightnings_own_loop(tmp_path):
    pytest.importorskip("lightning", reason="the lightning extra is not installed: pip install 'taiji[lightning]'")
    plain_equals_own(tmp_path, "lightning_train.py")


def test_hf_trainer_grows_survives_a_kill_exactly_once(tmp_path):
    pytest.importorskip("transformers", reason="the transformers extra is not installed: pip install 'taiji[transformers]'")
    grow_kill_and_audit(tmp_path, "hf_train.py", same_model=False)


def test_hf_trainer_one_worker_equals_the_trainers_own_loop(tmp_path):
    pytest.importorskip("transformers", reason="the transformers extra is not installed: pip install 'taiji[transformers]'")
    plain_equals_own(tmp_path, "hf_train.py", prefix="hf_")
