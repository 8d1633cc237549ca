"""Checkpoint stall and throughput: taiji's asynchronous sharded save vs `torch.save` on rank 0
and synchronous DCP, 2 workers, side by side in the same processes.

Each of the 2 worker processes holds the same replicated state (an MLP and its Adam state,
>= 200 MB in all; --quick: ~25 MB), as every SyncSGD replica does. Per repetition, in an
order alternating between repetitions, every side saves the state once into a fresh directory:

- taiji: each worker hands the tensors ``checkpoint.layout.assign`` gives it (about half) to
  its writer thread (``checkpoint.writer.Writer``, DCP underneath), which stages them in host
  memory while the next training step's forward, backward and allreduce run, then writes them;
  that step's optimizer update waits for the staging (an optimizer step pre-hook). Its stall is
  the save's blocking time plus that wait. Also measured: the same save staged at the boundary
  (``Checkpoint(overlap=False)``), ``dcp.async_save`` of the same share (DCP's own thread-based
  asynchronous save), the floor (a plain in-memory copy of the share), and the step's own time
  with a save in it vs a step without (staging competes with training for the CPU);
- torch.save: rank 0 writes the whole state synchronously while rank 1 waits (what a torchrun
  script does);
- synchronous DCP: each worker writes its share with ``dcp.save``.

A stall is the slowest worker's blocking time (the others wait for it at the next allreduce).
Then a 2-worker training loop (forward, backward, gradient allreduce, Adam) runs with a taiji
checkpoint every 20 steps and without, alternating blocks; reported as steps/s, the ratio paired
(the median over adjacent pairs of blocks), and as CPU seconds per step (every thread of both
workers, the writers' included: what the checkpoints cost a machine that has no core to spare,
and a figure the load of other processes moves less than wall-clock time). Writes go to a
temporary directory on local disk (the page cache absorbs most of them: a network file system
makes the synchronous sides slower still).

    .venv/bin/python benchmarks/checkpoint.py --quick     # <= 2 min
    .venv/bin/python benchmarks/checkpoint.py             # >= 200 MB of state

On a GPU (``--device cuda``, recorded as its own variant): the model, its Adam state and the
batches live on the one GPU the 2 workers share (gloo groups: NCCL refuses two ranks on one
device); staging is then a copy from GPU memory into pinned host memory, and the floor is that copy.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time

from taiji_harness.bench import (
    connect_store,
    contract_row,
    interleaved,
    median,
    paired_ratio,  # noqa: E402
    print_result,
    reap_on_sigterm,
    run_workers,
    spread,
    watch_parent,
    worker_arguments,
)

MB = 2**20
SIDES = ("taiji", "blocking", "dcp_async", "floor", "torch_save", "dcp_sync")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~25 MB state, fewer repetitions (<= 2 min)")
    parser.add_argument("--width", type=int, default=None, help="the MLP's width (default: 2400; quick 800)")
    parser.add_argument("--reps", type=int, default=None, help="saves per side (default: 5; quick 3)")
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per throughput block (default: 40; quick 40)"
    )
    parser.add_argument(
        "--blocks", type=int, default=None, help="throughput blocks per side (default: 3; quick 2)"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the state lives")
    parser.add_argument(
        "--dir", default=None, help="where checkpoints are written (default: a temporary directory)"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="hard limit in seconds (default: 600; quick 150)"
    )
    worker_arguments(parser)
    args = parser.parse_args(argv)
    args.width = args.width or (800 if args.quick else 2400)
    args.reps = args.reps or (3 if args.quick else 5)
    args.steps = args.steps or 40
    args.blocks = args.blocks or (2 if args.quick else 3)
    args.timeout = args.timeout or (150.0 if args.quick else 600.0)
    return args


def build(width: int, device: str = "cpu"):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(3) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())],
        torch.nn.Linear(width, 10),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, opt


def train_step(model, opt, width: int, device: str = "cpu") -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    x = torch.randn(32, width, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g)).div_(dist.get_world_size())
        offset += g.numel()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()  # a step's time is its kernels' too


def everything(model, opt) -> dict:
    from taiji.checkpoint.layout import tensor_keys
    from taiji.comm.transfer import encode

    tensors: list = []
    encode(opt.state_dict(), tensors)
    return tensor_keys(model.state_dict(), tensors)


def slowest(seconds: float, *, summed: bool = False) -> float:
    """The slowest worker's ``seconds`` (the others wait for it at the next allreduce); with
    ``summed``, the workers' sum."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if summed else dist.ReduceOp.MAX)
    return float(t.item())


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from taiji.checkpoint.layout import Manifest, assign
    from taiji.checkpoint.storage import Storage
    from taiji.checkpoint.writer import Writer, stage, until_update

    torch.set_num_threads(1)
    watch_parent(args.parent_pid)
    import datetime

    dist.init_process_group(
        "gloo",
        store=connect_store(args.port, args.timeout),
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    rank, n = args.rank, args.world_size
    model, opt = build(args.width, args.device)
    step_on = functools.partial(train_step, model, opt, args.width, args.device)
    step_on()  # Adam's state exists
    state = everything(model, opt)
    owners = assign({k: t.numel() * t.element_size() for k, t in state.items()}, n)
    mine = {k: t for k, t in state.items() if owners[k] == rank}
    total = sum(t.numel() * t.element_size() for t in state.values())
    share = sum(t.numel() * t.element_size() for t in mine.values())
    root = os.path.join(args.dir, f"r{rank}")
    storage = Storage(root)
    writer = Writer(storage)
    manifest = Manifest(1, "bench", 0, n, 0.0, n, {}, owners, state=None) if rank == 0 else None
    stalls: dict[str, list[float]] = {side: [] for side in SIDES}
    floor_buffers = stage(mine)
    written: list[float] = []
    waits: list[float] = []
    opt.register_step_pre_hook(lambda *a: waits.append(writer.settle()))  # what the Job's Checkpointer does
    steps: dict[str, list[float]] = {"plain": [], "with_save": []}

    def timed_step() -> float:
        begun = time.perf_counter()
        step_on()
        return time.perf_counter() - begun

    def fresh() -> None:
        dist.barrier()
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        dist.barrier()

    for rep in range(args.reps):
        for side in interleaved(SIDES, rep):
            fresh()
            if side == "taiji":
                steps["plain"].append(slowest(timed_step()))
                share_now = {k: t for k, t in everything(model, opt).items() if owners[k] == rank}
                dist.barrier()
                start = time.perf_counter()
                now, later = until_update(share_now, opt)
                writer.save(rep, rank, now, manifest, later)
                blocking = time.perf_counter() - start
                waits.clear()
                steps["with_save"].append(slowest(blocking + timed_step()))
                stall = blocking + sum(waits)
                writer.wait()
                written.append(time.perf_counter() - start)
                stalls[side].append(slowest(stall))
                continue
            start = time.perf_counter()
            if side == "blocking":
                writer.save(rep, rank, mine, manifest)
                stall = time.perf_counter() - start
                writer.wait()
            elif side == "dcp_async":
                future = dcp.async_save(dict(mine), storage_writer=storage.dcp_writer("async"), no_dist=True)
                stall = time.perf_counter() - start
                future.result()
            elif side == "floor":
                stage(mine, floor_buffers)  # a copy into memory touched before: memcpy alone
                stall = time.perf_counter() - start
            elif side == "torch_save":
                if rank == 0:
                    torch.save({k: t for k, t in state.items()}, os.path.join(root, "model.pt"))
                dist.barrier()  # the others wait for rank 0
                stall = time.perf_counter() - start
            else:
                dcp.save(dict(mine), storage_writer=storage.dcp_writer("sync"), no_dist=True)
                stall = time.perf_counter() - start
            stalls[side].append(slowest(stall))

    # throughput: a checkpoint every 20 steps vs none, alternating blocks (wall and CPU seconds)
    rates: dict[str, list[float]] = {"every20": [], "none": []}
    block_s: dict[str, list[float]] = {"every20": [], "none": []}
    cpu_s: dict[str, list[float]] = {"every20": [], "none": []}
    for block in range(args.blocks):
        for side in interleaved(("every20", "none"), block):
            fresh()
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for step in range(1, args.steps + 1):
                step_on()
                if side == "every20" and step % 20 == 10:  # mid-block: its write overlaps later steps
                    share_now = {k: t for k, t in everything(model, opt).items() if owners[k] == rank}
                    now, later = until_update(share_now, opt)
                    writer.save(1000 + step, rank, now, manifest, later)
            writer.wait()  # a write still running counts against the side that started it
            block_s[side].append(slowest(time.perf_counter() - start))
            rates[side].append(args.steps / block_s[side][-1])
            cpu_s[side].append(
                slowest(time.process_time() - cpu_start, summed=True)
            )  # every thread of both workers
    fresh()
    if rank == 0:
        ms = {side: round(median(v) * 1e3, 2) for side, v in stalls.items()}
        rows = [
            contract_row(
                "stall per checkpoint vs torch.save",
                ms["taiji"],
                ms["torch_save"],
                higher_is_better=False,
                unit="ms",
                digits=2,
                taiji_spread=spread(v * 1e3 for v in stalls["taiji"]),
                anchor_spread=spread(v * 1e3 for v in stalls["torch_save"]),
            ),
            contract_row(
                "stall per checkpoint vs synchronous DCP",
                ms["taiji"],
                ms["dcp_sync"],
                higher_is_better=False,
                unit="ms",
                digits=2,
                anchor_spread=spread(v * 1e3 for v in stalls["dcp_sync"]),
            ),
            contract_row(
                "stall per checkpoint vs dcp.async_save",
                ms["taiji"],
                ms["dcp_async"],
                higher_is_better=False,
                unit="ms",
                digits=2,
                anchor_spread=spread(v * 1e3 for v in stalls["dcp_async"]),
            ),
            contract_row(
                "stall per checkpoint vs an in-memory copy of the share (the floor)",
                ms["taiji"],
                ms["floor"],
                higher_is_better=False,
                unit="ms",
                digits=2,
                target=">= 0.5",
            ),
            contract_row(
                "stall per checkpoint staged at the boundary (overlap=False) vs torch.save",
                ms["blocking"],
                ms["torch_save"],
                higher_is_better=False,
                unit="ms",
                digits=2,
                taiji_spread=spread(v * 1e3 for v in stalls["blocking"]),
            ),
            contract_row(
                "a step with a checkpoint in it vs a step without",
                round(median(steps["with_save"]) * 1e3, 1),
                round(median(steps["plain"]) * 1e3, 1),
                higher_is_better=False,
                unit="ms",
                taiji_spread=spread(v * 1e3 for v in steps["with_save"]),
                anchor_spread=spread(v * 1e3 for v in steps["plain"]),
            ),
            contract_row(
                "throughput with checkpoints every 20 steps vs none",
                round(median(rates["every20"]), 3),
                round(median(rates["none"]), 3),
                higher_is_better=True,
                unit="steps/s",
                ratio=paired_ratio(block_s["every20"], block_s["none"]),
                ratio_is="paired",
                pair_ratios=[round(n / e, 3) for e, n in zip(block_s["every20"], block_s["none"])],
                taiji_spread=spread(rates["every20"]),
                anchor_spread=spread(rates["none"]),
                target=">= 0.98",
            ),
            contract_row(
                "CPU per step with checkpoints every 20 steps vs none (both workers)",
                round(median(cpu_s["every20"]) / args.steps * 1e3, 1),
                round(median(cpu_s["none"]) / args.steps * 1e3, 1),
                higher_is_better=False,
                unit="ms",
                ratio=paired_ratio(cpu_s["every20"], cpu_s["none"]),
                ratio_is="paired",
                taiji_spread=spread(v / args.steps * 1e3 for v in cpu_s["every20"]),
                anchor_spread=spread(v / args.steps * 1e3 for v in cpu_s["none"]),
                target=">= 0.98",
            ),
            contract_row(
                "host memory for staging per worker vs the whole state",
                round(share / MB, 1),
                round(total / MB, 1),
                higher_is_better=False,
                unit="MiB",
            ),
        ]
        print_result(
            "checkpoint",
            rows,
            record=False,
            state_mib=round(total / MB, 1),
            workers=n,
            background_write_ms=round(median(written) * 1e3, 1),
        )
    dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    reap_on_sigterm()
    directory = tempfile.mkdtemp(prefix="taiji-bench-ckpt-", dir=args.dir)
    passthrough = [
        "--device",
        args.device,
        "--width",
        str(args.width),
        "--reps",
        str(args.reps),
        "--steps",
        str(args.steps),
        "--blocks",
        str(args.blocks),
        "--timeout",
        str(args.timeout),
        "--dir",
        directory,
    ]
    try:
        result = run_workers(os.path.abspath(__file__), 2, passthrough, args.timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    variant = {"variant": "cuda"} if args.device == "cuda" else {}
    print_result(
        "checkpoint",
        result["rows"],
        state_mib=result.get("state_mib"),
        workers=2,
        **variant,
        background_write_ms=result.get("background_write_ms"),
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
