"""Train a small CNN on Fashion-MNIST with taiji.

    taiji run -np 2 --max-np 4 python examples/fashion_mnist.py --epochs 2 --resize 150:3 600:2
    python examples/fashion_mnist.py --epochs 1          # the same script on one worker

``--resize STEP:SIZE`` asks for SIZE workers when training reaches STEP: joiners boot while
the others keep training, then join at a step boundary and receive the state; a shrink
lets the newest workers leave. The global batch stays the same, so the result does not
depend on how many workers computed it.

Uses the real data set from /usr/share/datasets/fashion-mnist (Debian package
`dataset-fashion-mnist`) or --data DIR; without it, says so and trains on a synthetic
stand-in so the demo still runs.
"""
from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import taiji
from taiji.data.datasets import FASHION_MNIST_DIR, DatasetMissing, SyntheticImages, load_fashion_mnist

log = logging.getLogger("fashion_mnist")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(root: str | None) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset, str]:
    try:
        return load_fashion_mnist(root, train=True), load_fashion_mnist(root, train=False), "Fashion-MNIST"
    except DatasetMissing as exc:
        if taiji.rank() == 0:
            log.warning("real data set not found: %s Falling back to a SYNTHETIC stand-in; "
                        "accuracy figures below are not Fashion-MNIST's.", exc)
        full = SyntheticImages(num_samples=12000).build()
        train = torch.utils.data.TensorDataset(*(t[:10000] for t in full.tensors))
        test = torch.utils.data.TensorDataset(*(t[10000:] for t in full.tensors))
        return train, test, "synthetic"


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.utils.data.TensorDataset, batch: int = 1000) -> float:
    model.eval()
    images, labels = data.tensors
    correct = sum(int((model(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum())
                  for i in range(0, len(labels), batch))
    model.train()
    return correct / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--data", default=None, help=f"IDX directory (default {FASHION_MNIST_DIR})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--resize", nargs="*", default=[], metavar="STEP:SIZE",
                        help="ask for SIZE workers at STEP (needs `taiji run ... --max-np`)")
    args = parser.parse_args()
    try:
        resizes = dict(sorted((int(a), int(b)) for a, b in (item.split(":") for item in args.resize)))
    except ValueError:
        parser.error(f"--resize takes STEP:SIZE pairs, got {args.resize}")

    taiji.configure_logging("INFO")
    taiji.init()
    torch.manual_seed(args.seed)
    train, test, name = load_data(args.data)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    job = taiji.Job(model, optimizer, train, batch_size=args.batch_size, epochs=args.epochs,
                    max_steps=args.max_steps, seed=args.seed, log_every=args.log_every)
    if taiji.rank() == 0:
        log.info("training on %s: %d samples, %d workers, global batch %d, %d epoch(s)",
                 name, len(train), taiji.size(), args.batch_size, args.epochs)
    epoch = 0
    started = time.perf_counter()
    for step in job:
        if taiji.rank() == 0 and step.index in resizes:
            taiji.resize(resizes[step.index])  # returns at once; lands at a later step boundary
        if step.epoch != epoch and taiji.rank() == 0:
            log.info("epoch %d done: test accuracy %.4f", epoch, evaluate(model, test))
            epoch = step.epoch
        images, labels = step.batch
        loss = F.cross_entropy(model(images), labels)
        step.backward(loss)
    elapsed = time.perf_counter() - started
    if taiji.rank() == 0:
        accuracy = evaluate(model, test)
        log.info("final test accuracy %.4f on %s after %d steps in %.1fs", accuracy, name,
                 job.progress.step, elapsed)


if __name__ == "__main__":
    main()
