"""SyncSGD across launched processes matches one worker (tests/scripts/train_equiv.py under
`taiji run`). The same with ranks as threads, and SyncSGD's units: tests/unit/test_sync_sgd.py."""

import sys

import pytest
import torch

from taiji_harness.testing import SCRIPTS, assert_close_to_reference, taiji_run, train_equiv_reference

pytestmark = pytest.mark.timeout(180)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4])
def test_launched_processes_match_one_worker(tmp_path, n):
    steps, batch = 20, 10
    proc = taiji_run(
        n,
        [sys.executable, str(SCRIPTS / "train_equiv.py"), str(tmp_path), str(steps), str(batch), "float64"],
        extra=["--timeout", "30"],
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    saved = [torch.load(tmp_path / f"rank{r}.pt") for r in range(n)]
    results = [(s["params"], s["momenta"], s["consumed"]) for s in saved]
    assert_close_to_reference(results, train_equiv_reference(steps, batch), rtol=1e-9, atol=1e-11)
