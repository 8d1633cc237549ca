"""Every strategy trains the example CNN to >= 85% Fashion-MNIST test accuracy within 300 steps of
global batch 128 (about two thirds of an epoch; real data, real processes through `taiji run`).
Needs the data set (`make data`; CI installs it)."""

import re
import sys

import pytest

from taiji.data.datasets import FASHION_MNIST_DIR
from taiji_harness.testing import REPO, taiji_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").exists()
    and not (FASHION_MNIST_DIR / "train-images-idx3-ubyte").exists(),
    reason=f"Fashion-MNIST is not installed in {FASHION_MNIST_DIR} (run `make data`)",
)
@pytest.mark.parametrize(
    "strategy, workers", [("sync_sgd", 2), ("model_averaging", 3), ("pair_averaging", 4)]
)
def test_each_strategy_reaches_85_percent_on_fashion_mnist(strategy, workers, tmp_path):
    proc = taiji_run(
        workers,
        [
            sys.executable,
            str(REPO / "examples" / "fashion_mnist.py"),
            "--epochs",
            "1",
            "--max-steps",
            "300",
            "--strategy",
            strategy,
            "--log-every",
            "200",
        ],
        timeout=280,
        extra=["--run-dir", str(tmp_path / "run")],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    match = re.search(r"final test accuracy (\d\.\d+) on (\S+)", proc.stdout)
    assert match and match.group(2) == "Fashion-MNIST", proc.stdout[-2000:]
    assert float(match.group(1)) >= 0.85, match.group(0)
