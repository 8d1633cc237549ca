"""Strategies across real processes through `taiji run` (tests/scripts/elastic_train.py).
Strategies with ranks as threads: tests/unit/test_strategies.py; under faults:
tests/faults/test_strategies_faults.py."""

import pytest

from taiji_harness.testing import run_elastic


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["pair_averaging", "local_sgd"])
def test_decoupled_strategies_keep_the_fast_workers_step_rate_next_to_a_slow_one(tmp_path, strategy):
    """Rank 2's steps take 3x as long; under a decoupled strategy the others do not wait for it."""
    proc = run_elastic(
        tmp_path, 3, "--steps", "150", "--step-delay", "0.02", "--slow-rank", "2", "--strategy", strategy
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    steps = {w: len((tmp_path / f"{w}.jsonl").read_text().splitlines()) for w in ("w0", "w1", "w2")}
    # same pace would give equal counts; 3x slower should give ~1/3 of the fast ones' steps
    assert steps["w2"] * 2 < min(steps["w0"], steps["w1"]), steps
