"""taiji.Optimizer runs the Job's step: a model with running statistics (BatchNorm) keeps identical
buffers on every worker after every step, as under taiji.Job."""

import pytest
import torch
import torch.nn as nn

import taiji
from taiji_harness.testing import run_threads


def _train_with_batchnorm(peer, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = taiji.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, peer=peer)
    data = torch.randn(steps, 12, 4, generator=torch.Generator().manual_seed(1))
    buffers = []
    while opt.steps < steps:
        opt.zero_grad()
        x = data[opt.steps][peer.rank :: peer.size] * (1 + peer.rank)  # each worker's share differs
        model(x).pow(2).mean().backward()
        assert opt.step()
        buffers.append([b.clone() for b in model.buffers()])
    opt.close()
    return buffers


@pytest.mark.timeout(60)
def test_batchnorm_buffers_stay_identical_on_every_worker_after_every_step():
    first, second = run_threads(2, _train_with_batchnorm, timeout=20)
    assert len(first) == len(second) == 4
    for step, (a, b) in enumerate(zip(first, second)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"the workers' buffers differ after step {step}"
