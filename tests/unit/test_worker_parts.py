"""One assembly of the worker (runtime/worker.py), the Job's public state, and the checkpoint setting."""

import ast

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import taiji
from taiji.checkpoint.config import Checkpoint
from taiji.errors import ConfigError
from taiji.runtime.peer import Peer
from taiji_harness.testing import REPO

# the parts only WorkerParts.build may construct: each entry point gets them from it
PARTS = {"StepEngine", "Transitions", "Checkpointer", "TrainState", "ControlChannel", "membership_for"}


def test_only_the_builder_assembles_a_workers_parts():
    builder = REPO / "src" / "taiji" / "runtime" / "worker.py"
    found = []
    for path in sorted((REPO / "src" / "taiji").rglob("*.py")):
        if path == builder:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in PARTS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} builds {name}")
    assert not found, "build the worker's parts with WorkerParts.build:\n" + "\n".join(found)


def _job(data, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, taiji.Job(model, opt, data, 4, peer=Peer.solo(), log_every=0, epochs=2, **kw)


def _train(model, job, until=None):
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        if until is not None and job.progress.step == until:
            break


def test_a_jobs_state_dict_resumes_a_new_job_where_the_first_left_off():
    data = TensorDataset(torch.randn(18, 2), torch.randint(0, 2, (18,)))
    whole_model, _, whole = _job(data)
    _train(whole_model, whole)

    model, opt, first = _job(data)
    _train(model, first, until=3)  # ends inside the first epoch, mid-cursor
    assert first.has_state
    state, params = first.state_dict(), model.state_dict()
    assert state["progress"]["step"] == 3 and state["progress"]["cursor"] == 12

    model2, _, second = _job(data)
    model2.load_state_dict(params)
    second.load_state_dict(state)
    assert second.progress.step == 3 and second.progress.sampler.cursor == 12
    _train(model2, second)
    assert second.progress.step == whole.progress.step
    for a, b in zip(model2.parameters(), whole_model.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # momentum and the data order came back too


def test_a_running_jobs_state_is_not_loaded():
    data = TensorDataset(torch.randn(8, 2), torch.randint(0, 2, (8,)))
    model, _, job = _job(data)
    state = job.state_dict()
    steps = iter(job)
    next(steps)
    with pytest.raises(ConfigError, match="before iterating"):
        job.load_state_dict(state)
    steps.close()


def test_the_scripts_checkpoint_wins_and_takes_the_launchers_resume(monkeypatch):
    monkeypatch.delenv("TAIJI_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("TAIJI_RESUME", raising=False)
    assert Checkpoint.resolve(None) is None
    own = Checkpoint("/mine", steps=5)
    assert Checkpoint.resolve(own) is own
    monkeypatch.setenv("TAIJI_CHECKPOINT_DIR", "/launcher")
    monkeypatch.setenv("TAIJI_RESUME", "auto")
    assert Checkpoint.resolve(None).path == "/launcher"
    merged = Checkpoint.resolve(own)
    assert merged.path == "/mine" and merged.resume == "auto"
