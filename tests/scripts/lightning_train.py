"""A Lightning Trainer on TaijiStrategy, used by tests/integration/test_integrations_procs.py.

    taiji run -np N --max-np M ... -- python lightning_train.py OUT --steps S --batch B \
        [--resize STEP:SIZE ...]
    python lightning_train.py OUT --steps S --batch B --plain     # Lightning's own single-process run
    python lightning_train.py OUT --steps S --batch B --compare   # both, one after the other
    ... lightning_train.py OUT --checkpoint-every K CKPT_DIR      # ModelCheckpoint every K steps
    ... lightning_train.py OUT --resume CKPT_DIR/step=8.ckpt      # trainer.fit(..., ckpt_path=...)

Each worker appends to OUT/<worker>.jsonl one line per committed step (step, epoch, global span,
version, size, rank, digest of parameters and optimizer state after the commit), as
elastic_train.py does, so its ``audit`` checks the run. The worker that ends as rank 0 writes
OUT/final.pt (parameters); ``--plain`` writes OUT/plain.pt.
"""

import argparse
import sys
import time
from pathlib import Path

import taiji

if (
    __name__ == "__main__"
    and "--grow-at-start" in sys.argv
    and taiji.init().version == 1
    and taiji.rank() == 0
):
    taiji.resize(3)  # asked before Lightning's import: the joiner boots while the first workers do

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F
from torch.utils.data import DataLoader

from taiji_harness.testing import load_script

elastic = load_script("elastic_train")


class Classifier(L.LightningModule):
    def __init__(self, step_delay=0.0):
        super().__init__()
        self.net = elastic.make_model()
        self.step_delay = step_delay

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.step_delay:
            time.sleep(self.step_delay)  # a bigger model's compute: the joiner boots while steps run
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--resize", nargs="*", default=[])
    parser.add_argument(
        "--peak", type=int, default=0, help="stop a few steps after growing to PEAK and shrinking"
    )
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--policy", default="", choices=["", "cycle"], help="elastic_train.py's policies")
    parser.add_argument("--grow-at-start", action="store_true", help="rank 0 asks for 3 workers at once")
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--plain", action="store_true", help="Lightning's own loop, no taiji")
    parser.add_argument("--compare", action="store_true", help="Lightning's own loop, then TaijiStrategy's")
    parser.add_argument(
        "--checkpoint-every",
        nargs=2,
        default=None,
        metavar=("K", "DIR"),
        help="Lightning's ModelCheckpoint every K steps into DIR (step=K.ckpt, ...)",
    )
    parser.add_argument("--resume", default=None, help="trainer.fit(..., ckpt_path=RESUME)")
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(elastic.make_data(), batch_size=args.batch, shuffle=args.shuffle)
    common = dict(
        max_steps=args.steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if args.plain or args.compare:
        own = Classifier()
        L.Trainer(accelerator="cpu", devices=1, **common).fit(own, loader)
        torch.save([p.detach() for p in own.parameters()], args.out / "plain.pt")
        if args.plain:
            return
    module = Classifier(args.step_delay)
    from taiji.integrations.lightning import TaijiStrategy
    from taiji.policies import ScheduledResize, parse_resize_schedule

    log_file = elastic.open_worker_log(args.out)

    def on_commit(step):
        opt = strategy.optimizers[0]
        elastic.log_commit(
            log_file, step, [t for p in module.net.parameters() for t in (p, opt.state[p]["momentum_buffer"])]
        )

    policies = [ScheduledResize(parse_resize_schedule(args.resize))] if args.resize else []
    policies += [elastic.GrowThenShrink(args.peak)] if args.peak else []
    policies += elastic.make_policies(args.policy, args.batch)
    strategy = TaijiStrategy(policies=policies, seed=11, on_commit=on_commit)
    if args.checkpoint_every:
        from lightning.pytorch.callbacks import ModelCheckpoint

        every, where = args.checkpoint_every
        common.update(
            enable_checkpointing=True,
            callbacks=[
                ModelCheckpoint(
                    dirpath=where, filename="{step}", every_n_train_steps=int(every), save_top_k=-1
                )
            ],
        )
    L.Trainer(accelerator="cpu", devices=1, strategy=strategy, **common).fit(
        module, loader, ckpt_path=args.resume
    )
    if taiji.rank() == 0:
        torch.save([p.detach() for p in module.parameters()], args.out / "final.pt")


if __name__ == "__main__":
    main()
