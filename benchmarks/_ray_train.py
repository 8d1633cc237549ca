"""The Ray Train side of ``benchmarks/ray_engine.py``: the same model, data and global batch as
``_elastic_train.py``, under Ray Train's ``TorchTrainer`` with an elastic worker group.

    python benchmarks/_ray_train.py OUT --address HEAD:PORT [--max-workers 2] [--step-delay S]

The driver connects to the Ray cluster and runs ``TorchTrainer.fit()`` with
``ScalingConfig(num_workers=(1, MAX))`` (Ray Train v2's elastic scaling: when the cluster has room
for more workers it stops the group and starts a larger one; when a worker dies it starts the
group again with what is left) and ``FailureConfig(max_failures=-1)``. Ray Train sets up the gloo
process group (``TorchConfig(backend="gloo")``); each worker wraps the model in DDP. Rank 0 saves
model, optimizer and step after every step (a temporary file, then renamed: what ``_elastic_train``'s
torchrun side does, and cheaper than a ``ray.train.report`` checkpoint), and every worker of a
new group resumes from it, so a restart loses no committed step.

Every worker appends ``boot`` and ``commit`` records to ``OUT/raytrain-<pid>.jsonl`` as
``_elastic_train.py`` does (``size`` = the group's world size). The job is stopped from outside.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def train_loop(config: dict) -> None:
    """One Ray Train worker: resume from the checkpoint, then train until stopped."""
    import ray.train
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    started = time.time()
    sys.path.insert(0, config["benchmarks"])
    import _elastic_train as et

    torch.set_num_threads(1)
    out, batch, delay = Path(config["out"]), config["batch"], config["step_delay"]
    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    log = et.Log(out, "raytrain", "")
    model = et.make_model()
    opt = et.make_optimizer(model)
    ckpt = out / "raytrain-ckpt.pt"
    step = 0
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = saved["step"]
    ddp = DDP(model)  # on the process group Ray Train set up; broadcasts rank 0's parameters
    log.write(
        event="boot",
        side="raytrain",
        pid=os.getpid(),
        rank=rank,
        size=size,
        exec=started,
        ready=time.time(),
        resumed_at=step,
    )
    x_all, y_all = et.make_data()
    perm = torch.randperm(et.NUM_SAMPLES, generator=torch.Generator().manual_seed(11))
    share = batch // size
    while True:
        lo = (step * batch + rank * share) % et.NUM_SAMPLES
        idx = perm[lo : lo + share]
        loss = F.cross_entropy(ddp(x_all[idx]), y_all[idx])
        if delay:
            time.sleep(delay)  # stands in for a bigger model's compute, as on the other sides
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        log.write(event="commit", step=step - 1, size=size, rank=rank, pid=os.getpid(), time=time.time())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--address", required=True, help="the Ray cluster's head, HOST:PORT")
    parser.add_argument("--max-workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument(
        "--monitor-interval",
        type=float,
        default=1.0,
        help="ScalingConfig(elastic_resize_monitor_interval_s): how often a running group "
        "looks for room to grow (Ray's default is 60 s)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="the process group's timeout, seconds")
    args = parser.parse_args()

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address=args.address, logging_level="WARNING")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "out": str(args.out),
            "benchmarks": str(HERE),
            "batch": args.batch,
            "step_delay": args.step_delay,
        },
        scaling_config=ScalingConfig(
            num_workers=(1, args.max_workers),
            use_gpu=False,
            resources_per_worker={"CPU": 1},
            elastic_resize_monitor_interval_s=args.monitor_interval,
        ),
        torch_config=TorchConfig(backend="gloo", timeout_s=int(args.timeout)),
        run_config=RunConfig(
            name="bench",
            storage_path=str(args.out / "raytrain-storage"),
            failure_config=FailureConfig(max_failures=-1),
        ),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
