"""examples/shakespeare_char.py under `taiji run`: a short elastic run (grow, then shrink) keeps
exactly-once data and identical replicas after every step, on a tiny corpus the test writes."""

import sys

import pytest

from taiji_harness.testing import REPO, load_script, random_play, taiji_run

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

BATCH = 16
# the joiner asked for at step 5 boots in seconds while the others train (a step takes ~30 ms);
# the shrink comes late enough (50 steps before the end, ~20 s in) that the grow has landed by then
STEPS = 700


def test_the_example_grows_and_shrinks_keeping_every_invariant(tmp_path):
    for seed in range(3):
        (tmp_path / "plays").mkdir(exist_ok=True)
        (tmp_path / "plays" / f"p{seed}.md").write_text(random_play(seed, 400))
    proc = taiji_run(
        2,
        [
            sys.executable,
            str(REPO / "examples" / "shakespeare_char.py"),
            "--data",
            str(tmp_path / "plays"),
            "--block",
            "32",
            "--batch-size",
            str(BATCH),
            "--layers",
            "1",
            "--d-model",
            "64",
            "--max-steps",
            str(STEPS),
            "--epochs",
            "1000",
            "--resize",
            "5:3",
            f"{STEPS - 50}:2",
            "--log-every",
            "0",
            "--validation-windows",
            "64",
            "--sample-chars",
            "40",
            "--audit-dir",
            str(tmp_path / "audit"),
        ],
        extra=["--max-np", "3", "--timeout", "30"],
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "validation loss" in proc.stdout and "sample:" in proc.stdout
    from taiji.data.shakespeare import load_shakespeare

    windows = len(load_shakespeare(tmp_path / "plays", block=32).train)
    result = load_script("elastic_train").audit(tmp_path / "audit", BATCH, num_samples=windows)
    assert result["steps"] == STEPS and not result["gaps"], result
    assert result["sizes"] == [2, 3, 2], result["sizes"]
    assert not result["divergences"], f"replicas differ after steps {result['divergences']}"
    assert result["lost_samples"] == 0 and result["duplicated_samples"] == 0, result
