"""How far the sampled bucket norms move the gradient noise scale from the exact one.

Large gradient buckets (more than 2^20 elements) are measured on chunks (``monitor/norms.py``):
a full pass would cost milliseconds per step. This trains a 5.8M-parameter MLP on Fashion-MNIST
(synthetic images where the data set is not installed; the result says which) as two workers
would (two half-batches of 64: the small batches; their mean: the big one), groups the
gradients into SyncSGD's buckets, and feeds four noise-scale estimators from the same
gradients every step: exact norms, taiji's (1/17 of a bucket in chunks that move on each step:
``parts(step)``), the same with 1/33 (cheaper), and the fixed 1/16 chunks taiji used before
(``parts(0)`` every step). At every checkpoint it compares each sampled estimate with the exact one
(|log ratio|).

    .venv/bin/python benchmarks/gns_sampling.py --quick   # 150 steps, ~1 min
    .venv/bin/python benchmarks/gns_sampling.py           # 400 steps

``taiji`` / ``anchor``: the mean |log(estimate / exact)| of taiji's / the former fixed chunks over
the checkpoints (lower is better; ``ratio`` = anchor / taiji); ``error_1_33``: that of moving 1/33
chunks. The last line is the JSON result.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from taiji_harness.bench import contract_row, print_result  # noqa: E402

HALF = 64  # each worker's batch
CHECK_EVERY = 25  # steps between checkpoints


def data():
    from taiji.data.datasets import DatasetMissing, SyntheticImages, load_fashion_mnist

    try:
        return load_fashion_mnist(), "fashion-mnist"
    except DatasetMissing:
        print(
            "# Fashion-MNIST is not installed (apt-get install -y dataset-fashion-mnist): "
            "synthetic images instead",
            file=sys.stderr,
        )
        return SyntheticImages(num_samples=20000).build(), "synthetic"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 steps")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps (default 150 quick, 400 full)"
    )
    parser.add_argument(
        "--pad-to",
        type=int,
        default=0,
        help="append zero input features up to this many (dead inputs: their weights get no "
        "gradient, and a fixed subset may over- or under-read them)",
    )
    args = parser.parse_args(argv)
    steps = args.steps or (150 if args.quick else 400)

    import torch
    import torch.nn.functional as F
    from torch import nn

    from taiji.monitor.gns import GNSEstimator
    from taiji.monitor.norms import SAMPLE_CHUNK, BucketNorm, sum_of_parts
    from taiji.strategies.sync_sgd import FIRST_BUCKET_MB, plan_buckets

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dataset, source = data()
    x_all, y_all = dataset.tensors
    x_all = x_all.reshape(len(x_all), -1)
    if args.pad_to > x_all.shape[1]:
        x_all = F.pad(x_all, (0, args.pad_to - x_all.shape[1]))
        source += f", zero-padded to {args.pad_to} features"
    model = nn.Sequential(
        nn.Linear(x_all.shape[1], 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    params = list(reversed(list(model.parameters())))  # SyncSGD's order
    plan = plan_buckets([p.numel() * 4 for p in params], 25 * 2**20, int(FIRST_BUCKET_MB * 2**20))
    buckets = [torch.zeros(sum(params[i].numel() for i in members)) for members in plan]
    samplers = {
        "moving": ([BucketNorm(b) for b in buckets], True),  # taiji's
        "moving_1_33": ([BucketNorm(b, period=33 * SAMPLE_CHUNK) for b in buckets], True),
        "fixed_1_16": ([BucketNorm(b, period=16 * SAMPLE_CHUNK) for b in buckets], False),
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def gradients_into_buckets() -> list[torch.Tensor]:
        for bucket, members in zip(buckets, plan):
            torch.cat([params[i].grad.reshape(-1) for i in members], out=bucket)
        return [b.clone() for b in buckets]

    def measure(grads: list[torch.Tensor], how: str, step: int) -> float:
        if how == "exact":
            return sum(float(g.double().square().sum()) for g in grads)
        norms, moving = samplers[how]
        total = 0.0
        for norm, bucket, g in zip(norms, buckets, grads):
            bucket.copy_(g)
            total += sum_of_parts(norm.parts(step if moving else 0))
        return total

    estimators = {how: GNSEstimator(0.95) for how in ("exact", *samplers)}
    g = torch.Generator().manual_seed(1)
    checkpoints = []
    started = time.monotonic()
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (2 * HALF,), generator=g)
        halves = []
        for h in range(2):
            optimizer.zero_grad()
            part = idx[h * HALF : (h + 1) * HALF]
            F.cross_entropy(model(x_all[part]), y_all[part]).backward()
            halves.append(gradients_into_buckets())
        big = [(a + b) / 2 for a, b in zip(*halves)]
        for how, estimator in estimators.items():
            small = (measure(halves[0], how, step) + measure(halves[1], how, step)) / 2
            estimator.update(small, measure(big, how, step), HALF, 2 * HALF)
        optimizer.zero_grad()
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        optimizer.step()
        if (step + 1) % CHECK_EVERY == 0:
            values = {how: e.b_noise for how, e in estimators.items()}
            checkpoints.append({"step": step + 1, **values})
            print(
                f"# step {step + 1}: B_noise "
                + ", ".join(f"{k} {v:.1f}" if v else f"{k} -" for k, v in values.items()),
                file=sys.stderr,
                flush=True,
            )

    def error(how: str) -> float | None:
        """Mean |log(estimate / exact)|; a checkpoint where either has no estimate counts as an error of 1."""
        logs = [
            abs(math.log(c[how] / c["exact"]))
            if c[how] and c["exact"] and c[how] > 0 and c["exact"] > 0
            else 1.0
            for c in checkpoints
        ]
        return round(sum(logs) / len(logs), 4) if logs else None

    moving, fixed = error("moving"), error("fixed_1_16")
    params_total = sum(p.numel() for p in params)
    row = contract_row(
        f"noise scale of a {params_total / 1e6:.1f}M-param MLP on {source}: mean |log(sampled / exact)|, "
        "taiji's moving 1/17 chunks vs the former fixed 1/16",
        moving,
        fixed,
        higher_is_better=False,
        error_1_33=error("moving_1_33"),
        buckets=[b.numel() for b in buckets],
        steps=steps,
        checkpoints=checkpoints,
        seconds=round(time.monotonic() - started, 1),
    )
    print_result("gns_sampling", [row], quick=args.quick, pad_to=args.pad_to)


if __name__ == "__main__":
    main()
