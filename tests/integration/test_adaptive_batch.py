"""The GNS-adaptive batch adapts, and keeps the small batch's accuracy: benchmarks/adaptive_batch.py's
own repetition (small, large and adaptive runs through `taiji run -np 2`, on the real
Fashion-MNIST), shortened to 8,000 samples and one large-batch LR, with the policy checking every 20
steps after 30.

Fails when the adaptive run stops adapting (its batch never grows past the small batch) or its
accuracy falls away from the small run's (more than 2 points: a short run's final evaluation
moves by about a point with the seed). Accuracies are deterministic for a seed, so the outcome
is too. Needs the data set (`make data`; CI installs it)."""

import pytest

from taiji.data.datasets import FASHION_MNIST_DIR
from taiji_harness.testing import load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").exists()
    and not (FASHION_MNIST_DIR / "train-images-idx3-ubyte").exists(),
    reason=f"Fashion-MNIST is not installed in {FASHION_MNIST_DIR} (run `make data`)",
)
def test_the_gns_adaptive_batch_grows_and_keeps_the_small_batchs_accuracy(tmp_path):
    bench = load_benchmark("adaptive_batch")
    args = bench.parse_args(
        [
            "--quick",
            "--arms",
            "adaptive",
            "--train-subset",
            "8000",
            "--test-subset",
            "4000",
            "--warmup",
            "30",
            "--interval",
            "20",
            "--eval-every",
            "0.25",
            "--timeout",
            "240",
            "--large-lr-factors",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    rep = bench.one_rep(0, args, tmp_path)
    adaptive, small = rep["runs"]["adaptive"], rep["runs"]["small"]
    assert adaptive["data_set"] == small["data_set"] == "Fashion-MNIST"
    batches = [batch for _, batch in adaptive["trajectory"]]
    assert max(batches) > args.small, f"the adaptive batch never grew: {adaptive['trajectory']}"
    assert adaptive["final_batch"] > args.small and adaptive["steps"] < small["steps"]
    assert rep["adaptive_minus_small_points"] >= -2.0, (adaptive["evals"], small["evals"])
