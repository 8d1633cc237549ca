"""Worker for tests/integration/test_collectives_procs.py and tests/faults/test_collectives_faults.py.

mode "check": run every collective and write the results to OUT/rank{r}.json.
mode "fault": connect, write OUT/ready{r}, wait for the test's `go` key (set after it killed or
stopped a victim rank), then run one allreduce and record how it failed.
"""

import json
import sys
import time
from pathlib import Path

import torch

import taiji
from taiji.errors import CommError

mode, out = sys.argv[1], Path(sys.argv[2])
peer = taiji.init()
comm, rank, size = peer.comm, peer.rank, peer.size

if mode == "check":
    result = {"rank": rank, "size": size, "version": peer.version}
    for op in ("sum", "avg", "min", "max"):
        t = torch.tensor([rank + 1.0, float(rank)])
        h = comm.allreduce(t, op, async_op=True)
        result[op] = h.wait().tolist()
    b = torch.tensor([float(rank)] * 2)
    comm.broadcast(b, src=size - 1)
    result["bcast"] = b.tolist()
    result["gather"] = [int(x) for x in comm.allgather(torch.tensor([rank]))]
    comm.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
elif mode == "fault":
    comm.connect()
    comm.allreduce(torch.ones(8), "sum")
    (out / f"ready{rank}").write_text("1")
    peer.raw_store.wait(["test/go"])
    started = time.monotonic()
    try:
        comm.allreduce(torch.ones(8), "sum")
        outcome = {"error": None}
    except CommError as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    outcome["elapsed"] = time.monotonic() - started
    (out / f"rank{rank}.json").write_text(json.dumps(outcome))
