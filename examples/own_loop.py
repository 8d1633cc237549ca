"""Your own training loop, elastic and fault-tolerant: wrap the optimizer in ``taiji.Optimizer``.

    taiji run -np 3 --min-np 1 python examples/own_loop.py --steps 300
    python examples/own_loop.py --steps 100          # the same script on one worker

``opt.step()`` applies the update only if every worker's gradients arrived; if a worker died,
nothing is applied, the survivors re-form and sync, and ``step()`` returns False: the loop
simply runs the same batch again over the survivors. Which samples a worker trains is the loop's
business here (a ``taiji.Job`` would do it exactly-once for you): this one splits each global
batch into equal shares by rank.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import taiji
from taiji.comm.transfer import digest
from taiji.data.datasets import FASHION_MNIST_DIR, DatasetMissing, SyntheticImages, load_fashion_mnist
from taiji.log import configure_logging

log = logging.getLogger("own_loop")


def load_data() -> torch.utils.data.TensorDataset:
    try:
        return load_fashion_mnist()
    except DatasetMissing:
        log.warning("Fashion-MNIST not found in %s: training on a synthetic stand-in", FASHION_MNIST_DIR)
        return SyntheticImages().build()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=96, help="global batch per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="write this worker's final state summary here (tests)")
    args = parser.parse_args()
    configure_logging("INFO")
    taiji.init()

    images, labels = load_data().tensors
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = taiji.Optimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), model)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))
    retries = 0
    while opt.steps < args.steps:
        opt.zero_grad()  # joins the job the first time; rank and size are current after it
        start = (opt.steps * args.batch) % (len(order) - args.batch)
        shares = order[start : start + args.batch].chunk(taiji.size())
        mine = shares[taiji.rank()] if taiji.rank() < len(shares) else order[:0]
        F.cross_entropy(model(images[mine]), labels[mine]).backward()
        if not opt.step():
            retries += 1  # a peer failed: nothing was applied; the same batch runs again
            continue
        if taiji.rank() == 0 and opt.steps % 50 == 0:
            log.info("step %d on %d workers", opt.steps, taiji.size())
    opt.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{taiji.rank()}.json").write_text(
            json.dumps(
                {
                    "steps": opt.steps,
                    "size": taiji.size(),
                    "retries": retries,
                    "transitions": opt.transitions,
                    "digest": digest(list(model.parameters())),
                }
            )
        )


if __name__ == "__main__":
    main()
