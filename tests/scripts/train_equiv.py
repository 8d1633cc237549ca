"""A deterministic small training run, used in-process (threads) and under `taiji run`.

    python train_equiv.py OUT_DIR STEPS GLOBAL_BATCH DTYPE
writes OUT_DIR/rank{r}.pt with the final parameters, optimizer state and consumed indices.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import taiji


def make_model(dtype=torch.float64):
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    )
    g = torch.Generator().manual_seed(1234)  # not the global RNG: ranks may be threads
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model.to(dtype)


def make_data(n=97, dtype=torch.float64):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 6, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(x, y)


def train(peer, steps, batch, dtype=torch.float64, bucket_mb=0.0005, optimizer="sgd"):
    """Returns (parameters, optimizer state tensors, consumed indices by step)."""
    model = make_model(dtype)
    if peer.rank != 0:  # replicas start different: the Job must sync them from rank 0
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # a tiny bucket size gives several buckets, exercising ordered launches
    job = taiji.Job(
        model,
        opt,
        make_data(dtype=dtype),
        batch_size=batch,
        max_steps=steps,
        epochs=100,
        strategy=taiji.SyncSGD(bucket_mb=bucket_mb, first_bucket_mb=bucket_mb),
        data=taiji.DataOptions(seed=3),
        monitoring=taiji.MonitorOptions(log_every=0),
        peer=peer,
    )
    consumed = []
    for step in job:
        x, y = step.batch
        loss = F.cross_entropy(model(x), y)
        step.backward(loss)
        consumed.append(step.indices.tolist())
    params = [p.detach().clone() for p in model.parameters()]
    momenta = [
        v.clone()
        for p in model.parameters()
        for k, v in sorted(opt.state[p].items())
        if torch.is_tensor(v) and v.dim() > 0
    ]
    return params, momenta, consumed


if __name__ == "__main__":
    out, steps, batch, dtype = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    peer = taiji.init()
    params, momenta, consumed = train(peer, steps, batch, getattr(torch, dtype))
    torch.save(
        {"params": params, "momenta": momenta, "consumed": consumed, "rank": peer.rank},
        out / f"rank{peer.rank}.pt",
    )
