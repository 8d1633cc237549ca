"""Worker of `benchmarks/strategies.py`: one `taiji run -np 4` job training the Fashion-MNIST CNN of
examples/fashion_mnist.py with one synchronisation strategy, optionally with one slowed worker.

    taiji run -np 4 -- python benchmarks/_strategies_train.py --strategy sync --out DIR
    taiji run -np 4 -- python benchmarks/_strategies_train.py --strategy pair --straggler 3 --out DIR
    taiji run -np 4 -- python benchmarks/_strategies_train.py --strategy local --local-every 8 --out DIR

The straggler (``--straggler RANK``) takes twice as long per step as it would: after each
``step.backward`` it sleeps for as long as its own forward + backward just took (wall time from
receiving the step to the last gradient of the backward pass, taken by a post-accumulate-grad
hook, so a wait for peers' gradients is not part of it). Every rank writes ``DIR/rank{R}.json``:
its samples, loop start/end (``time.monotonic``, one clock for all processes of the host),
per-step timings, a checksum of its final parameters, and on rank 0 the test accuracy of the
final model (the Job averages the replicas of non-exact strategies when training ends).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import taiji
from taiji.strategies.local_sgd import LocalSGD
from taiji.strategies.pair_averaging import PairAveraging
from taiji_harness.testing import load_example

_example = load_example("fashion_mnist")  # the example's model and data
Net, evaluate, load_data = _example.Net, _example.evaluate, _example.load_data


def make_strategy(args: argparse.Namespace) -> taiji.Strategy:
    if args.strategy == "sync":
        return taiji.SyncSGD()
    if args.strategy == "avg":
        return taiji.ModelAveraging(alpha=args.ma_alpha, every=args.ma_every)
    if args.strategy == "local":
        return LocalSGD(every=args.local_every, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    return PairAveraging(age_scale=None if args.strategy == "pair_equal" else args.pair_age_scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", required=True, choices=["sync", "avg", "pair", "pair_equal", "local"])
    parser.add_argument("--straggler", type=int, default=-1, help="rank slowed 2x (-1: none)")
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-subset", type=int, default=0, help="train on N samples (0 = all 60k)")
    parser.add_argument("--ma-alpha", type=float, default=1.0)
    parser.add_argument("--ma-every", type=int, default=4)
    parser.add_argument(
        "--sync-every",
        type=int,
        default=0,
        help="PairAveraging sync point every N samples (0 = the Job's default, one epoch)",
    )
    parser.add_argument("--pair-age-scale", type=float, default=1.0, help="PairAveraging age_scale")
    parser.add_argument("--local-every", type=int, default=8, help="LocalSGD: average every H global batches")
    parser.add_argument(
        "--outer-lr", type=float, default=1.0, help="LocalSGD outer learning rate (1: plain average)"
    )
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="LocalSGD outer Nesterov momentum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="directory for rank{R}.json")
    args = parser.parse_args()

    torch.set_num_threads(1)  # 4 workers on 2 cores (the launcher sets OMP_NUM_THREADS=1 as well)
    # the Job's own INFO lines (phases, sync points) belong in the launcher's log of the job
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    taiji.init()
    torch.manual_seed(args.seed)
    train, test, name = load_data(None)
    if name != "Fashion-MNIST":
        raise SystemExit("the real Fashion-MNIST is required (/usr/share/datasets/fashion-mnist)")
    if args.train_subset:  # a fixed random subset, the same on every rank and in every job
        keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(1234))[: args.train_subset]
        train = torch.utils.data.TensorDataset(*(t[keep] for t in train.tensors))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    strategy = make_strategy(args)
    job = taiji.Job(
        model,
        optimizer,
        train,
        batch_size=args.batch,
        epochs=args.epochs,
        strategy=strategy,
        data=taiji.DataOptions(seed=args.seed),
        sync=taiji.SyncOptions(sync_every=args.sync_every or None),
        monitoring=taiji.MonitorOptions(log_every=0, run_dir=""),
    )

    last_grad = [0.0]  # when the backward pass accumulated its latest gradient
    for p in model.parameters():  # registered after the strategy's hooks: fires after them
        p.register_post_accumulate_grad_hook(lambda _p: last_grad.__setitem__(0, time.perf_counter()))
    slowed = taiji.rank() == args.straggler
    samples = steps = 0
    compute_ms: list[float] = []  # receive step -> last gradient accumulated
    step_ms: list[float] = []  # receive step -> step.backward returned (incl. waiting for peers)
    between_ms: list[float] = []  # step.backward returned (+ sleep) -> next step received: the Job's work
    slept = 0.0
    start = done = 0.0
    for step in job:
        got = time.perf_counter()
        if steps == 0:
            start = time.monotonic()  # after the join and the first state sync
        else:
            between_ms.append((got - done) * 1e3)
        images, labels = step.batch
        step.backward(F.cross_entropy(model(images), labels))
        returned = time.perf_counter()
        compute = max(last_grad[0] - got, 0.0)
        compute_ms.append(compute * 1e3)
        step_ms.append((returned - got) * 1e3)
        if slowed:
            time.sleep(compute)
            slept += compute
        samples += step.local_batch_size
        steps += 1
        done = time.perf_counter()
    end = time.monotonic()  # the loop includes the last sync point and the final averaging

    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    result = {
        "rank": taiji.rank(),
        "size": taiji.size(),
        "strategy": strategy.name,
        "slowed": slowed,
        "samples": samples,
        "steps": steps,
        "start": start,
        "end": end,
        "slept_s": round(slept, 3),
        "compute_ms_median": statistics.median(compute_ms) if compute_ms else None,
        "step_ms_median": statistics.median(step_ms) if step_ms else None,
        "between_ms_median": statistics.median(between_ms) if between_ms else None,
        "checksum": checksum,
        "train_samples": len(train),
        "epochs": args.epochs,
    }
    if isinstance(strategy, PairAveraging):
        result.update(pair_averaged=strategy.averaged, pair_skipped=strategy.skipped)
    if isinstance(strategy, LocalSGD):
        result.update(sync_points=strategy.averaged)
    if taiji.rank() == 0:
        t0 = time.perf_counter()
        result["accuracy"] = evaluate(model, test)
        result["eval_s"] = round(time.perf_counter() - t0, 3)
        result["test_samples"] = len(test)
    Path(args.out, f"rank{taiji.rank()}.json").write_text(json.dumps(result))
    print(f"done: {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
