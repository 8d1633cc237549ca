"""One rank of benchmarks/topology.py: times allreduces of each size under each topology and
reads how many bytes its host sent on ``eth0`` meanwhile (the first rank of each host does).

    python _topology_worker.py OUT RANK STORE_HOST STORE_PORT HOSTS(comma-separated) --sizes-mb 1 10 ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from taiji.cluster.store import connect_store, host_store
from taiji.comm.communicator import CommOptions, Communicator
from taiji.comm.topologies import TOPOLOGIES


def tx_bytes() -> int:
    """Bytes this host (network namespace) sent to the others: its eth0 counter."""
    path = Path("/sys/class/net/eth0/statistics/tx_bytes")
    return int(path.read_text()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("rank", type=int)
    parser.add_argument("store_host")
    parser.add_argument("store_port", type=int)
    parser.add_argument("hosts")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES))
    args = parser.parse_args()
    hosts = tuple(args.hosts.split(","))
    me = hosts[args.rank]
    store = (
        host_store(me, args.store_port, timeout=120)
        if args.rank == 0
        else connect_store(args.store_host, args.store_port, timeout=120)
    )
    comm = Communicator(store, args.rank, len(hosts), 1, CommOptions(timeout=120, host=me, hosts=hosts))
    counts_bytes = hosts.index(me) == args.rank  # the first rank of each host reads its counter
    rows = []
    for size_mb in args.sizes_mb:
        tensor = torch.ones(int(size_mb * 1e6 / 4))
        for topology in args.topologies:
            comm.set_topology(topology)
            comm.allreduce(tensor, "sum")  # warm-up: builds the plan's groups
            comm.barrier()
            sent, start = tx_bytes(), time.perf_counter()
            for _ in range(args.reps):
                comm.allreduce(tensor, "sum")
            seconds = (time.perf_counter() - start) / args.reps
            sent = (tx_bytes() - sent) / args.reps if counts_bytes else None
            comm.barrier()
            tensor.fill_(1.0)
            rows.append({"size_mb": size_mb, "topology": topology, "seconds": seconds, "tx_bytes": sent})
    Path(args.out, f"rank{args.rank}.json").write_text(json.dumps({"host": me, "rows": rows}))
    comm.barrier()
    comm.close()


if __name__ == "__main__":
    main()
