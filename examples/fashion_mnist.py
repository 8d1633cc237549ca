"""Train a small CNN on Fashion-MNIST with taiji, adapting while it trains.

    taiji run -np 2 --max-np 4 python examples/fashion_mnist.py --policy gns,schedule --resize 150:3 600:2
    taiji run -np 1 --max-np 4 python examples/fashion_mnist.py --policy throughput
    python examples/fashion_mnist.py --epochs 1 --policy none   # the same script on one worker

``--policy`` (comma-separated, applied in this order):
  gns         global batch follows the gradient noise scale (GNSBatchSize, up to --max-batch),
              learning rate follows the batch (--lr-rule sqrt|linear|adascale)
  goodput     global batch goes where measured samples/s times statistical efficiency (from the
              noise scale) is highest (GoodputBatchSize, Pollux's goodput), learning rate as for gns
  schedule    ``--resize STEP:SIZE`` asks for SIZE workers at STEP (ScheduledResize): joiners boot
              while the others keep training, then join at a step boundary and receive the state;
              a shrink lets the newest workers leave
  throughput  add workers while each adds >= 10% samples/s, then give back the last (ThroughputScaling)
  interference  switch to pair averaging when most workers slow down (InterferenceSwitch)
  topology    try ring, hierarchical and tree allreduce for a few steps each, keep the fastest, and
              try again when the cluster changes size (AdaptiveTopology)
  none        fixed batch and cluster
``--strategy`` sync_sgd (exact, the default) | model_averaging | pair_averaging | local_sgd (decoupled).
Every worker applies the same decisions at the same step; no sample is lost or repeated.

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
from taiji.errors import ConfigError
from taiji.policies import (
    EarlyStop,
    GNSBatchSize,
    GoodputBatchSize,
    InterferenceSwitch,
    LRScaling,
    ScheduledResize,
    ThroughputScaling,
    parse_policy_names,
    parse_resize_schedule,
)
from taiji.strategies.pair_averaging import PairAveraging

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
            log.warning(
                "real data set not found: %s Falling back to a SYNTHETIC stand-in; "
                "accuracy figures below are not Fashion-MNIST's.",
                exc,
            )
        full = SyntheticImages(num_samples=12000).build()
        train = torch.utils.data.TensorDataset(*(t[:10000] for t in full.tensors))
        test = torch.utils.data.TensorDataset(*(t[10000:] for t in full.tensors))
        return train, test, "synthetic"


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.utils.data.TensorDataset, batch: int = 1000) -> float:
    model.eval()
    images, labels = data.tensors
    correct = sum(
        int((model(images[i : i + batch]).argmax(1) == labels[i : i + batch]).sum())
        for i in range(0, len(labels), batch)
    )
    model.train()
    return correct / len(labels)


POLICIES = ("gns", "goodput", "schedule", "throughput", "interference", "topology", "none")
STRATEGIES = {
    "sync_sgd": taiji.SyncSGD,
    "model_averaging": lambda: taiji.ModelAveraging(alpha=1.0, every=4),
    "pair_averaging": PairAveraging,
    "local_sgd": taiji.LocalSGD,
}


def make_policies(
    names: list[str], args: argparse.Namespace, resizes: dict[int, int]
) -> list[taiji.policies.Policy]:
    policies: list[taiji.policies.Policy] = []
    for name in names:
        if name in ("gns", "goodput"):
            batch_policy = GNSBatchSize if name == "gns" else GoodputBatchSize
            policies += [
                batch_policy(max_batch=args.max_batch, warmup=100, interval=50),
                LRScaling(args.lr_rule),
            ]
        elif name == "schedule":
            policies.append(ScheduledResize(resizes))
        elif name == "throughput":
            policies.append(ThroughputScaling(threshold=0.1, window=20))
        elif name == "interference":
            policies.append(InterferenceSwitch("pair_averaging", fraction=0.7, window=20))
        elif name == "topology":
            policies.append(taiji.policies.AdaptiveTopology(("ring", "hierarchical", "tree"), trial_steps=10))
    if args.target_loss is not None:
        policies.append(EarlyStop("loss", target=args.target_loss, every=10))
    return policies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--data", default=None, help=f"IDX directory (default {FASHION_MNIST_DIR})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--policy", default="none", help=f"comma-separated adaptation policies: {', '.join(POLICIES)}"
    )
    parser.add_argument(
        "--resize",
        nargs="*",
        default=[],
        metavar="STEP:SIZE",
        help="with --policy schedule: ask for SIZE workers at STEP (needs `taiji run ... --max-np`)",
    )
    parser.add_argument(
        "--max-batch", type=int, default=1024, help="with --policy gns|goodput: the largest global batch"
    )
    parser.add_argument(
        "--lr-rule",
        default="sqrt",
        choices=["linear", "sqrt", "adascale"],
        help="with --policy gns|goodput: how the learning rate follows the batch",
    )
    parser.add_argument(
        "--strategy",
        default="sync_sgd",
        choices=sorted(STRATEGIES),
        help="how replicas agree (pair_averaging, local_sgd: each worker at its own pace)",
    )
    parser.add_argument(
        "--target-loss", type=float, default=None, help="stop once the smoothed loss is below"
    )
    args = parser.parse_args()
    try:
        names = parse_policy_names(args.policy, POLICIES, args.resize)
        resizes = parse_resize_schedule(args.resize)
    except ConfigError as exc:
        parser.error(str(exc))

    taiji.log.configure_logging("INFO")
    taiji.init()
    torch.manual_seed(args.seed)
    train, test, name = load_data(args.data)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    policies = make_policies(names, args, resizes)
    job = taiji.Job(
        model,
        optimizer,
        train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        max_steps=args.max_steps,
        policies=policies,
        strategy=STRATEGIES[args.strategy](),
        data=taiji.DataOptions(seed=args.seed),
        monitoring=taiji.MonitorOptions(log_every=args.log_every),
    )
    if taiji.rank() == 0:
        log.info(
            "training on %s: %d samples, %d workers, global batch %d, %d epoch(s), strategy %s, policies: %s",
            name,
            len(train),
            taiji.size(),
            args.batch_size,
            args.epochs,
            args.strategy,
            ", ".join(p.name for p in policies) or "none",
        )
    epoch = 0
    started = time.perf_counter()
    for step in job:
        if step.epoch != epoch and taiji.rank() == 0:
            with job.pause():  # rank-local: its time is not a step's (peers wait; rank 0 stays alive)
                log.info("epoch %d done: test accuracy %.4f", epoch, evaluate(model, test))
            epoch = step.epoch
        images, labels = step.batch
        loss = F.cross_entropy(model(images), labels)
        step.backward(loss)
    elapsed = time.perf_counter() - started
    if taiji.rank() == 0:
        accuracy = evaluate(model, test)
        log.info(
            "final test accuracy %.4f on %s after %d steps in %.1fs (final global batch %d, lr %.4g)",
            accuracy,
            name,
            job.progress.step,
            elapsed,
            job.progress.sampler.batch_size,
            optimizer.param_groups[0]["lr"],
        )


if __name__ == "__main__":
    main()
