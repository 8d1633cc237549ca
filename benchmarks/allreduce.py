"""taiji ``Communicator.allreduce(t, "sum")`` vs raw ``torch.distributed.all_reduce``, same backend.

Both run on gloo (CPU) over loopback, inside the SAME worker processes: each worker builds
the raw default group and a taiji Communicator from one parent-hosted TCPStore, and timed
blocks of the two alternate (taiji first on even repetitions, raw first on odd ones), so
machine noise hits both alike. Reported: median bus bandwidth,
busbw = size_bytes * 2*(n-1)/n / time_per_allreduce, in GB/s (1e9 bytes/s), and as ``ratio``
the median over repetitions of the paired ratio anchor_time/taiji_time (each pair = two adjacent
blocks), which cancels slow drift in machine load better than a ratio of medians does
(that one is reported too, as ``ratio_of_medians``).

    .venv/bin/python benchmarks/allreduce.py --quick       # <= 90 s
    .venv/bin/python benchmarks/allreduce.py               # more repetitions
    .venv/bin/python benchmarks/allreduce.py --sizes-mb 1 10 --nprocs 2
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

MB = 10**6


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (<= 90 s in all)")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--reps", type=int, default=None, help="timed blocks per side and size (default: 9 quick, 25 full)"
    )
    parser.add_argument(
        "--block-mb",
        type=float,
        default=None,
        help="bytes allreduced per timed block, so small messages are timed over "
        "many calls (default: 20 quick, 50 full)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="hard limit per worker group in seconds (default: 40 quick, 300 full)",
    )
    worker_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.sizes_mb) <= 0 or min(args.nprocs) < 2:
        parser.error("sizes must be positive and process counts at least 2")
    args.reps = args.reps or (9 if args.quick else 25)
    args.block_mb = args.block_mb or (20.0 if args.quick else 50.0)
    args.timeout = args.timeout or (40.0 if args.quick else 300.0)
    return args


def worker(args: argparse.Namespace) -> None:
    with side_by_side_groups(args, channels=("grad",)) as comm:
        rows = measure(args, comm)
    print_result("allreduce", rows, record=False)


def measure(args: argparse.Namespace, comm) -> list[dict]:
    """One row per message size: interleaved timed blocks of taiji's and the raw allreduce."""
    import torch
    import torch.distributed as dist

    rank, n = args.rank, args.world_size

    def taiji_allreduce(t):
        comm.allreduce(t, "sum")

    def raw_allreduce(t):
        dist.all_reduce(t)

    sides = {"taiji": taiji_allreduce, "anchor": raw_allreduce}
    # both must actually reduce: a benchmark of a no-op would be meaningless
    for name, op in sides.items():
        t = torch.full((1000,), float(rank + 1))
        op(t)
        if not torch.all(t == n * (n + 1) / 2):
            raise SystemExit(f"{name} allreduce returned a wrong sum: {t[:3].tolist()}")

    cpu_times: dict[str, list[float]] = {name: [] for name in sides}

    def time_block(name: str, tensor, iters: int) -> float:
        """Seconds per allreduce on the slowest rank; records the CPU seconds per call as well."""
        wall, cpu = time_on_all_ranks(lambda: sides[name](tensor), iters)
        cpu_times[name].append(cpu / iters)
        return wall / iters

    rows = []
    for size_mb in args.sizes_mb:
        numel = size_mb * MB // 4
        # zeros: sums stay finite and free of denormals, whatever the number of calls
        tensors = {name: torch.zeros(numel, dtype=torch.float32) for name in sides}
        iters = max(1, round(args.block_mb / size_mb))
        times: dict[str, list[float]] = {name: [] for name in sides}
        for name in sides:  # warm-up: gloo buffers, page faults, code paths
            time_block(name, tensors[name], max(1, iters // 4))
        for cpu_list in cpu_times.values():
            cpu_list.clear()
        for rep in range(args.reps):
            for name in interleaved(list(sides), rep):
                times[name].append(time_block(name, tensors[name], iters))
        factor = 2 * (n - 1) / n
        busbw = {name: numel * 4 * factor / median(times[name]) / 1e9 for name in sides}
        rows.append(
            contract_row(
                f"{size_mb}MB n={n} busbw GB/s",
                round(busbw["taiji"], 3),
                round(busbw["anchor"], 3),
                higher_is_better=True,
                ratio=paired_ratio(times["taiji"], times["anchor"]),
                ratio_of_medians=round(busbw["taiji"] / busbw["anchor"], 3),
                nproc=n,
                size_bytes=numel * 4,
                reps=args.reps,
                iters_per_rep=iters,
                taiji_ms=round(median(times["taiji"]) * 1e3, 3),
                anchor_ms=round(median(times["anchor"]) * 1e3, 3),
                taiji_ms_spread=spread((t * 1e3 for t in times["taiji"]), 3),
                anchor_ms_spread=spread((t * 1e3 for t in times["anchor"]), 3),
                taiji_cpu_ms=round(median(cpu_times["taiji"]) * 1e3, 3),
                anchor_cpu_ms=round(median(cpu_times["anchor"]) * 1e3, 3),
            )
        )
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    reap_on_sigterm()
    passthrough = [
        "--reps",
        str(args.reps),
        "--block-mb",
        str(args.block_mb),
        "--timeout",
        str(args.timeout),
        "--sizes-mb",
        *map(str, args.sizes_mb),
    ]
    rows = []
    for n in args.nprocs:
        started = time.monotonic()
        result = run_workers(os.path.abspath(__file__), n, passthrough, args.timeout)
        rows += result["rows"]
        print(f"# {n} processes: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print_result("allreduce", rows, backend="gloo", cpus=os.cpu_count(), quick=args.quick)


if __name__ == "__main__":
    main()
