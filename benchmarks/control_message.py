"""The step's control message by worker count: every worker's whole row allgathered (the anchor,
taiji below its threshold) against the compact message (``taiji.monitor.compact``: one
sum-allreduce of the sums and a slot per worker), at 2 to 32 workers on loopback gloo.

Each size runs its workers as threads of this process, one gloo process group each (a process
per worker would not fit this machine; at 64 its 128 gloo threads keep two cores busy for over
ten minutes), so the collective's time is measured with every worker issuing it together; the decode
(``agree`` of the gathered rows against ``agree_compact`` of the summed message) is timed apart on one thread,
as each worker does it alone. A row is the message's cost per step: collective + decode, in milliseconds.
``crossover_workers``: the first size where the compact message costs less (None: none measured, and
``TAIJI_CONTROL_COMPACT_AT`` stays 0, off).

    .venv/bin/python benchmarks/control_message.py --quick
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from taiji.monitor.compact import agree_compact, compact_message, compact_width
from taiji.monitor.stats import ControlRow
from taiji.runtime.control import agree
from taiji_harness.bench import contract_row, interleaved, median, print_result, spread


def row(rank: int) -> ControlRow:
    return ControlRow(
        version_seen=3.0,
        local_sqnorm=1.5 + rank,
        sqnorm_batch=32.0,
        local_batch=32.0,
        loss_sum=70.0 + rank,
        compute_seconds=0.01 * (1 + rank % 3),
        clock=time.time() if rank == 0 else 0,
        decisions=12345.0,
        wall_seconds=0.02,
        previous_global_sqnorm=0.1,
        previous_allreduce_wait=0.001,
        previous_monitor_seconds=0.0005,
    )


def groups(n: int) -> list:
    store = dist.HashStore()
    made: list = [None] * n

    def make(rank: int) -> None:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=300)
        options._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
        made[rank] = dist.ProcessGroupGloo(dist.PrefixStore(f"n{n}", store), rank, n, options)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made


def collective_ms(pgs: list, side: str, calls: int) -> float:
    """Mean milliseconds of one collective, every worker issuing ``calls`` of them together."""
    n = len(pgs)
    took = [0.0] * n

    def body(rank: int) -> None:
        pg = pgs[rank]
        if side == "anchor":
            mine = torch.tensor(row(rank).to_row(), dtype=torch.float64)
            outs = [torch.empty_like(mine) for _ in range(n)]
            run = lambda: pg.allgather([outs], [mine]).wait()  # noqa: E731
        else:
            message = torch.tensor(compact_message(row(rank), rank, n), dtype=torch.float64)
            run = lambda: pg.allreduce([message]).wait()  # noqa: E731
        pg.barrier().wait()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        took[rank] = time.perf_counter() - start

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(took) / calls * 1e3


def decode_ms(n: int, side: str, calls: int) -> float:
    """Mean milliseconds of one worker's decode of the received message."""
    if side == "anchor":
        rows = [row(r).to_row() for r in range(n)]
        decode = lambda: agree(rows)  # noqa: E731
    else:
        summed = torch.zeros(compact_width(n), dtype=torch.float64)
        for r in range(n):
            summed += torch.tensor(compact_message(row(r), r, n), dtype=torch.float64)
        decode = lambda: agree_compact(summed.numpy(), n)  # noqa: E731
    start = time.perf_counter()
    for _ in range(calls):
        decode()
    return (time.perf_counter() - start) / calls * 1e3


def measure(n: int, reps: int, calls: int) -> dict:
    pgs = groups(n)
    sides = ("anchor", "taiji")
    times: dict[str, list[float]] = {s: [] for s in sides}
    for rep in range(reps):
        for side in interleaved(sides, rep):
            times[side].append(collective_ms(pgs, side, calls) + decode_ms(n, side, calls))
    for pg in pgs:
        del pg
    anchor, taiji = median(times["anchor"]), median(times["taiji"])
    return {
        "workers": n,
        "anchor_ms": anchor,
        "taiji_ms": taiji,
        "anchor_spread": spread(times["anchor"]),
        "taiji_spread": spread(times["taiji"]),
        "decode_anchor_ms": decode_ms(n, "anchor", calls),
        "decode_taiji_ms": decode_ms(n, "taiji", calls),
        "floats_received": {"anchor": ControlRow.WIDTH * n, "taiji": compact_width(n)},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2, 8 and 32 workers, fewer repetitions")
    parser.add_argument("--sizes", default=None, help="workers per run (default 2,4,8,16,32)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in (args.sizes or ("2,8,32" if args.quick else "2,4,8,16,32")).split(",")]
    reps, calls = (3, 20) if args.quick else (7, 50)
    results = []
    for n in sizes:
        results.append(measure(n, reps, calls))
        r = results[-1]
        print(
            f"# {n:3d} workers: allgather of rows {r['anchor_ms']:.3f} ms, compact {r['taiji_ms']:.3f} ms "
            f"(decode {r['decode_anchor_ms']:.4f} / {r['decode_taiji_ms']:.4f} ms)",
            file=sys.stderr,
            flush=True,
        )
    rows = [
        contract_row(
            f"control message per step, {r['workers']} workers (ms): compact vs every row allgathered",
            round(r["taiji_ms"], 4),
            round(r["anchor_ms"], 4),
            higher_is_better=False,
        )
        for r in results
    ]
    crossover = next((r["workers"] for r in results if r["taiji_ms"] < r["anchor_ms"]), None)
    print_result(
        "control_message",
        rows,
        quick=args.quick,
        crossover_workers=crossover,
        sizes=results,
        load=os.getloadavg(),
    )


if __name__ == "__main__":
    main()
