"""One job of `benchmarks/sched_live.py`: the CNN of examples/fashion_mnist.py trained on a fixed
subset of Fashion-MNIST (``--samples``, one epoch by default), started by the scheduler daemon as
``taiji run ... -- python benchmarks/_sched_job.py --samples N``. It reports its progress every
few steps (the daemon reads samples/s and position from it) and prints its last loss at the end
on rank 0 (no test evaluation: its seconds would count in the job's completion time).

Every worker process also appends to ``$TAIJI_RUN_DIR/samples-<process>.jsonl`` (the job's run
directory, which the daemon keeps across suspensions): a ``draw`` record when a step hands it its
batch and a ``commit`` record when the step commits, each with the batch's sample indices and
epoch: what ``sched_live.py``'s exactly-once audit reads (``samples_exactly_once``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.nn.functional as F

import taiji
from taiji_harness.testing import load_example

_example = load_example("fashion_mnist")  # the example's model and data
Net, load_data = _example.Net, _example.load_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, required=True, help="training samples (a fixed random subset)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s"
    )
    torch.set_num_threads(1)
    taiji.init()
    torch.manual_seed(args.seed)
    train, _, name = load_data(None)
    keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(1234))[: args.samples]
    train = torch.utils.data.TensorDataset(*(t[keep] for t in train.tensors))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    log = samples_log()

    def on_commit(step) -> None:  # noqa: ANN001
        log("commit", step)

    job = taiji.Job(
        model,
        optimizer,
        train,
        batch_size=args.batch,
        epochs=args.epochs,
        on_commit=on_commit,
        data=taiji.DataOptions(seed=args.seed),
        monitoring=taiji.MonitorOptions(log_every=5),
    )
    loss = torch.zeros(())
    for step in job:
        log("draw", step)
        images, labels = step.batch
        loss = F.cross_entropy(model(images), labels)
        step.backward(loss)
    if taiji.rank() == 0:
        print(
            f"done: {len(train)} samples x {args.epochs} epoch(s) of {name}, last loss {float(loss):.4f}",
            flush=True,
        )


def samples_log():  # noqa: ANN201
    """``log(event, step)``: one JSON line with the step's sample indices in this process's own
    file of the job's run directory (a no-op outside ``taiji run``)."""
    run_dir = os.environ.get("TAIJI_RUN_DIR")
    if not run_dir:
        return lambda event, step: None
    worker = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one file per process: a resumed job's are new ones
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    out = open(Path(run_dir) / f"samples-{worker}.jsonl", "a", buffering=1)

    def log(event: str, step) -> None:  # noqa: ANN001
        out.write(
            json.dumps(
                {
                    "event": event,
                    "worker": worker,
                    "step": step.index,
                    "epoch": step.epoch,
                    "samples": step.indices.tolist(),
                    "time": time.time(),
                }
            )
            + "\n"
        )

    return log


if __name__ == "__main__":
    main()
