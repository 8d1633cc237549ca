"""A minimal taiji job for the launcher tests: join, all-reduce once, report, exit 0."""

import os

import torch

import taiji

peer = taiji.init()
value = torch.tensor([float(taiji.rank() + 1)])
taiji.allreduce(value)
expected = taiji.size() * (taiji.size() + 1) / 2
print(
    f"worker {peer.worker_id} rank {taiji.rank()} of {taiji.size()} (RANK={os.environ['RANK']}): "
    f"allreduce sum {value.item():g} (expected {expected:g})",
    flush=True,
)
taiji.shutdown()
