"""A Lightning Trainer on taiji: the demo's CNN on Fashion-MNIST, grown, shrunk, its batch following the GNS.

    taiji run -np 2 --max-np 3 python examples/lightning_fashion_mnist.py --resize 100:3 300:2 --gns
    python examples/lightning_fashion_mnist.py --max-steps 200       # one worker, the same script
    # Lightning's ModelCheckpoint:
    taiji run -np 2 python examples/lightning_fashion_mnist.py --checkpoint-every 100
    # ... resumed:
    taiji run -np 3 python examples/lightning_fashion_mnist.py --checkpoint-every 100 --resume last

The LightningModule is plain Lightning; ``TaijiStrategy`` makes each training batch one global step
of an elastic job: the DataLoader's batch_size is the *global* batch, every worker trains on its
share, a killed worker's step is run again over the survivors, and the monitors (loss over the
global batch, gradient noise scale, batch size, workers, samples/s) go to the Trainer's logger
(CSV under runs/lightning/). Validation runs on every worker; ``sync_dist`` averages over them.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

import taiji
from fashion_mnist import Net, load_data
from taiji.integrations.lightning import TaijiStrategy
from taiji.policies import GNSBatchSize, LRScaling, ScheduledResize, parse_resize_schedule


class FashionClassifier(L.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.net, self.lr = Net(), lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_accuracy", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=128, help="the global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--resize", nargs="*", default=[], metavar="STEP:SIZE", help="ask for SIZE workers at STEP"
    )
    parser.add_argument(
        "--gns", action="store_true", help="the batch follows the gradient noise scale (up to 1024)"
    )
    parser.add_argument(
        "--data", default=None, help="Fashion-MNIST's IDX files (default: the Debian package's)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="Lightning's checkpoints (with taiji's state) in runs/lightning/checkpoints",
    )
    parser.add_argument("--resume", default=None, metavar="CKPT", help="a .ckpt path, or 'last'")
    args = parser.parse_args()
    taiji.log.configure_logging("INFO")
    taiji.init()
    train, test, name = load_data(args.data)
    torch.manual_seed(0)
    policies: list[taiji.policies.Policy] = (
        [ScheduledResize(parse_resize_schedule(args.resize))] if args.resize else []
    )
    if args.gns:
        policies += [GNSBatchSize(max_batch=1024, warmup=100, interval=50), LRScaling("sqrt")]
    # the ModelCheckpoint also finds `last` to resume from (at any size: the checkpoint holds taiji's state)
    checkpoints = (
        [
            ModelCheckpoint(
                dirpath="runs/lightning/checkpoints",
                save_last=True,
                save_top_k=-1,
                every_n_train_steps=args.checkpoint_every or None,
            )
        ]
        if args.checkpoint_every or args.resume
        else []
    )
    trainer = L.Trainer(
        strategy=TaijiStrategy(policies=policies),
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        max_epochs=-1,
        val_check_interval=None,
        check_val_every_n_epoch=1,
        logger=CSVLogger("runs", name="lightning"),
        log_every_n_steps=20,
        callbacks=checkpoints,
        enable_checkpointing=bool(checkpoints),
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        FashionClassifier(args.lr),
        DataLoader(train, batch_size=args.batch, shuffle=True),
        DataLoader(test, batch_size=1000),
        ckpt_path=args.resume,
    )
    if taiji.rank() == 0:
        print(f"{name}: trained {trainer.strategy.progress.step} steps on {taiji.size()} worker(s)")


if __name__ == "__main__":
    main()
