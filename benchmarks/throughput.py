"""taiji SyncSGD vs torch DistributedDataParallel: training samples/s, side by side.

A third side runs the same SyncSGD inside ``taiji.Job`` (the loop users run: sampler, the
per-step control message with monitors, commit); its figures are ``taiji_job_loop`` and
``ratio_job_loop`` (DDP time / Job time). A fourth runs ``taiji.Optimizer`` around a plain loop (the
user's own loop made elastic): ``taiji_optimizer`` and ``ratio_optimizer``.

With ``--nproc 1`` the anchor is the plain PyTorch loop, and two more rows per model say what taiji
costs a one-worker run in CPU time per step, where host overhead shows (``--models tiny``: a 3-layer
MLP of ~1.5 ms a step): "1 worker: Job loop vs a plain PyTorch loop, CPU ms per step" and the same
for ``taiji.Optimizer`` (docs/design.md#performance-targets: ≤ 1.03×).

Two worker processes (one compute thread each, gloo over loopback). Every worker builds,
from one seeded initialisation, a DDP-wrapped model (its default 25 MiB buckets with a 1 MiB
first bucket, on the raw default group) and a taiji copy synchronised by ``SyncSGD(bucket_mb=25)`` (on a taiji
Communicator), each with its own plain SGD optimizer, and alternates timed blocks of K steps between them
(taiji first on even repetitions, DDP first on odd ones). Both see the same synthetic batches
in the same order. Reported per model: median global samples/s of each, and as ``ratio`` the
median over repetitions of the paired ratio ddp_time/taiji_time of adjacent blocks (robust to
drifting machine load; ``ratio_of_medians`` is reported too). At the end it checks that the
taiji replicas are bitwise identical across workers and that training changed them, so the
benchmark cannot be timing a no-op.

    .venv/bin/python benchmarks/throughput.py --quick      # <= 90 s
    .venv/bin/python benchmarks/throughput.py              # more repetitions
    .venv/bin/python benchmarks/throughput.py --quick --nproc 1 --models tiny   # one worker's tax

On a GPU (``--device cuda``, recorded as its own variant): the workers share the one GPU, so both
sides' groups are gloo (NCCL refuses two ranks on one device; taiji's through
``TAIJI_CUDA_BACKEND=gloo``, as ``taiji run --cuda-backend gloo`` sets it); ``--models resnet18``
is torchvision's ResNet-18 on 32x32 images; with ``--nproc 1`` the anchor is a plain PyTorch loop
(no DDP wrapper) and the rows measure what the Job loop costs a single GPU:

    python benchmarks/throughput.py --device cuda --models resnet18 cnn --nproc 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from taiji_harness.bench import (
    contract_row,
    interleaved,
    median,
    paired_ratio,
    print_result,  # noqa: E402
    reap_on_sigterm,
    run_workers,
    side_by_side_groups,
    spread,
    time_on_all_ranks,
    worker_arguments,
)

BUCKET_MB = 25
TAX_TARGET = 1.03  # one worker: at most this many times a plain loop's CPU per step


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (<= 90 s in all)")
    parser.add_argument(
        "--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn", "resnet18", "tiny"]
    )
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where models and batches live"
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="workers (1: the anchor is a plain loop, no DDP)"
    )
    parser.add_argument(
        "--monitor-every", default="1", help="the Job's MonitorOptions(every=...): 1, k, 0 or auto"
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="timed blocks per side and model (default: 8 quick, 20 full)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per timed block (default: 4 quick, 8 full)"
    )
    parser.add_argument(
        "--ddp-bucket-view",
        action="store_true",
        help="run DDP with gradient_as_bucket_view=True (no copy back from its "
        "buckets, as taiji does); the default is DDP's default",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="hard limit for the worker group in seconds (default: 85 quick, 600 full)",
    )
    worker_arguments(parser)
    args = parser.parse_args(argv)
    args.reps = args.reps or (8 if args.quick else 20)
    args.steps = args.steps or (4 if args.quick else 8)
    args.timeout = args.timeout or (85.0 if args.quick else 600.0)
    return args


def build_model(name: str):
    """(model, per-sample input shape, per-worker batch size)."""
    from torch import nn

    if name == "resnet18":  # ~11.2M parameters, ~45 MB of fp32 gradients
        try:
            from torchvision.models import resnet18
        except ImportError:
            raise SystemExit("--models resnet18 needs torchvision (pip install torchvision)") from None
        return resnet18(num_classes=10), (3, 32, 32), 128
    if name == "mlp":  # ~6.3M parameters, ~25 MB of fp32 gradients: two buckets
        model = nn.Sequential(
            nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
        )
        return model, (1024,), 64
    if name == "tiny":  # ~0.4M parameters, ~1.5 ms a step on one core: the host's overhead shows
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        return model, (256,), 64
    # a small CIFAR-sized conv net, ~1.1M parameters: compute-bound rather than comm-bound
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    return model, (3, 32, 32), 32


def monitor_every(value: str) -> int | str:
    return value if value == "auto" else int(value)


def elastic_peer(rank: int, n: int, port: int, job_id: str):
    """A Peer of an n-worker taiji job on the benchmark's store (what `taiji run` sets up)."""
    from taiji.cluster import spec
    from taiji.cluster.store import JobStore
    from taiji.cluster.store import connect_store as taiji_connect
    from taiji.runtime.peer import Peer, PeerOptions

    raw = taiji_connect("127.0.0.1", port)
    job_store = JobStore(raw, job_id)  # one job per model: its groups get their own prefix
    config = spec.initial([spec.WorkerSpec(f"w{r}") for r in range(n)])
    if rank == 0:
        job_store.publish(config)
    return Peer(raw, job_store, f"w{rank}", job_store.read_config(1), PeerOptions(timeout=60.0))


def bench_model(name: str, args, comm) -> dict:
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import taiji
    from taiji.runtime import allocator

    rank, n = args.rank, args.world_size
    device = torch.device(args.device)
    torch.manual_seed(0)  # same initial weights on every worker and for both sides
    base, shape, batch = build_model(name)
    base.to(device)
    initial = [p.detach().clone() for p in base.parameters()]
    taiji_model = copy.deepcopy(base)
    sync = taiji.SyncSGD(bucket_mb=BUCKET_MB).attach(taiji_model, comm)
    # DDP's default bucket_cap_mb IS 25 MiB; leaving it unset matters: in torch 2.13 an explicit
    # bucket_cap_mb also turns off DDP's small (1 MiB) first bucket, which taiji does have
    if n > 1:
        ddp_model = DDP(copy.deepcopy(base), gradient_as_bucket_view=args.ddp_bucket_view)
        assert ddp_model.bucket_bytes_cap == BUCKET_MB * 2**20, ddp_model.bucket_bytes_cap
        anchor_module = ddp_model.module
    else:  # one worker: the anchor is the plain PyTorch loop
        ddp_model = anchor_module = copy.deepcopy(base)
    opts = {
        "taiji": torch.optim.SGD(taiji_model.parameters(), lr=0.01),
        "anchor": torch.optim.SGD(ddp_model.parameters(), lr=0.01),
    }

    gen = torch.Generator().manual_seed(1000 + rank)  # each worker its own slice of the data
    host_batches = [
        (torch.randn(batch, *shape, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
        for _ in range(4)
    ]
    batches = [(x.to(device), y.to(device)) for x, y in host_batches]
    cursor = {"taiji": 0, "anchor": 0, "job": 0, "own": 0}  # every side walks the same batch sequence

    # the same SyncSGD inside the full training loop users run (taiji.Job: sampler, control
    # message with monitors, commit); its data set holds the same batches in the same order
    job_model = copy.deepcopy(base)
    job_peer = elastic_peer(rank, n, args.port, f"throughput-{name}")
    data = torch.utils.data.TensorDataset(
        torch.cat([b[0] for b in host_batches] * n), torch.cat([b[1] for b in host_batches] * n)
    )
    job = taiji.Job(
        job_model,
        torch.optim.SGD(job_model.parameters(), lr=0.01),
        data,
        batch * n,
        strategy=taiji.SyncSGD(bucket_mb=BUCKET_MB),
        epochs=10**6,
        data=taiji.DataOptions(shuffle=False, device=device),
        monitoring=taiji.MonitorOptions(every=monitor_every(args.monitor_every), log_every=0, run_dir=""),
        peer=job_peer,
    )
    job_steps = iter(job)
    # taiji.Optimizer around the user's own loop (its own job: one Peer per entry point)
    own_model = copy.deepcopy(base)
    own_peer = elastic_peer(rank, n, args.port, f"throughput-own-{name}")
    own = taiji.Optimizer(torch.optim.SGD(own_model.parameters(), lr=0.01), own_model, peer=own_peer)

    def taiji_step(x, y) -> None:
        sync.begin_step(1.0 / n)  # equal shares of the global batch
        F.cross_entropy(taiji_model(x), y).backward()
        sync.synchronize()
        opts["taiji"].step()
        opts["taiji"].zero_grad()

    def ddp_step(x, y) -> None:
        F.cross_entropy(ddp_model(x), y).backward()
        opts["anchor"].step()
        opts["anchor"].zero_grad()

    def job_step(x, y) -> None:  # the Job brings its own batch (the same tensors)
        step = next(job_steps)  # also commits the previous step
        bx, by = step.batch
        step.backward(F.cross_entropy(job_model(bx), by))

    def own_step(x, y) -> None:
        own.zero_grad()
        F.cross_entropy(own_model(x), y).backward()
        assert own.step(), "a step of a fault-free run failed"

    sides = {"taiji": taiji_step, "anchor": ddp_step, "job": job_step, "own": own_step}
    cpu_times: dict[str, list[float]] = {side: [] for side in sides}

    def next_step(side: str) -> None:
        sides[side](*batches[cursor[side] % len(batches)])
        cursor[side] += 1

    def time_block(side: str, steps: int) -> float:
        """Seconds for ``steps`` steps on the slowest worker; records the CPU seconds per step too."""
        wall, cpu = time_on_all_ranks(
            lambda: next_step(side), steps, finish=torch.cuda.synchronize if device.type == "cuda" else None
        )
        cpu_times[side].append(cpu / steps)
        return wall

    for side in sides:  # warm-up: allocator, gloo buffers, autograd graph caches
        time_block(side, 2)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for cpu_list in cpu_times.values():
        cpu_list.clear()
    for rep in range(args.reps):
        for side in interleaved(list(sides), rep):
            times[side].append(time_block(side, args.steps))

    # invariant 1 of docs/design.md#invariants: the taiji replicas must be bitwise identical after each step
    flat = torch.cat([p.detach().reshape(-1) for p in taiji_model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    same = torch.tensor([1 if torch.equal(flat, reference) else 0])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    changed = any(not torch.equal(p.detach(), p0) for p, p0 in zip(taiji_model.parameters(), initial))
    drift = max(
        (a.detach() - b.detach()).abs().max().item()
        for a, b in zip(taiji_model.parameters(), anchor_module.parameters())
    )
    taiji_buckets = sync.num_buckets
    sync.detach()
    job_steps.close()
    job_peer.close()
    own.close()
    own_peer.close()

    samples = args.steps * batch * n
    rate = {side: samples / median(times[side]) for side in sides}
    params = sum(p.numel() for p in base.parameters())
    on = "" if device.type == "cpu" else ", cuda" + (" (one GPU shared through gloo)" if n > 1 else "")
    cpu_ms = {side: round(median(cpu_times[side]) * 1e3, 3) for side in sides}
    row = contract_row(
        f"{name} {params / 1e6:.1f}M params, batch {batch}/worker x{n}{on}, samples/s"
        + ("" if n > 1 else " vs a plain PyTorch loop"),
        round(rate["taiji"], 1),
        round(rate["anchor"], 1),
        higher_is_better=True,
        ratio=paired_ratio(times["taiji"], times["anchor"]),
        ratio_of_medians=round(rate["taiji"] / rate["anchor"], 3),
        taiji_job_loop=round(rate["job"], 1),
        ratio_job_loop=round(paired_ratio(times["job"], times["anchor"]), 3),
        taiji_optimizer=round(rate["own"], 1),
        ratio_optimizer=round(paired_ratio(times["own"], times["anchor"]), 3),
        samples_per_s_spread={side: spread((samples / t for t in times[side]), 1) for side in sides},
        taiji_cpu_ms_per_step=cpu_ms["taiji"],
        anchor_cpu_ms_per_step=cpu_ms["anchor"],
        job_cpu_ms_per_step=cpu_ms["job"],
        optimizer_cpu_ms_per_step=cpu_ms["own"],
        params=params,
        taiji_buckets=taiji_buckets,
        ddp_bucket_cap_bytes=ddp_model.bucket_bytes_cap if n > 1 else None,
        reps=args.reps,
        steps_per_rep=args.steps,
        taiji_replicas_identical=bool(same.item()),
        taiji_params_changed=changed,
        # the Job set glibc's malloc thresholds for this process: every side ran with them
        malloc_tuned=allocator.applied(),
        max_abs_diff_taiji_vs_ddp=drift,
    )
    if n > 1:
        return [row]
    # one worker: what the Job loop and taiji.Optimizer cost the plain loop, per step, in CPU time
    # (medians of the timed blocks; the paired ratio of each block's CPU time to its neighbour's)
    taxes = [
        contract_row(
            f"1 worker: {label} vs a plain PyTorch loop, CPU ms per step ({name}{on})",
            cpu_ms[side],
            cpu_ms["anchor"],
            higher_is_better=False,
            ratio=paired_ratio(cpu_times[side], cpu_times["anchor"]),
            target=f"<= {TAX_TARGET}x the plain loop's",
            target_met=paired_ratio(cpu_times[side], cpu_times["anchor"]) >= 1 / TAX_TARGET,
            reps=args.reps,
            steps_per_rep=args.steps,
        )
        for label, side in (("Job loop", "job"), ("taiji.Optimizer", "own"))
    ]
    return [row, *taxes]


def worker(args: argparse.Namespace) -> None:
    with side_by_side_groups(args) as comm:
        rows = [row for name in args.models for row in bench_model(name, args, comm)]
    print_result("throughput", rows, record=False)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    reap_on_sigterm()
    passthrough = [
        "--reps",
        str(args.reps),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--monitor-every",
        args.monitor_every,
        "--timeout",
        str(args.timeout),
        "--models",
        *args.models,
    ]
    if args.device == "cuda":  # the workers share one GPU: taiji's groups for CUDA tensors are gloo too
        os.environ["TAIJI_CUDA_BACKEND"] = "gloo"
    passthrough += ["--ddp-bucket-view"] * args.ddp_bucket_view
    started = time.monotonic()
    result = run_workers(os.path.abspath(__file__), args.nproc, passthrough, args.timeout)
    print(f"# {args.nproc} processes: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    if args.device == "cuda":
        variant = {"variant": f"cuda-x{args.nproc}"}
    else:  # the committed two-worker figures are the plain name's; another size is its own variant
        variant = {} if args.nproc == 2 else {"variant": f"x{args.nproc}"}
    print_result(
        "throughput",
        result["rows"],
        backend="gloo",
        nproc=args.nproc,
        bucket_mb=BUCKET_MB,
        **variant,
        ddp_gradient_as_bucket_view=args.ddp_bucket_view,
        cpus=os.cpu_count(),
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
