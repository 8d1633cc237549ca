"""Allreduce topologies side by side: tree, star and host-aware hierarchical vs gloo's flat ring.

On emulated hosts (network namespaces behind a bridge, tests/_netns.py; needs root), with each
host's link shaped by a token bucket (``--rate``, default 400 Mbit/s; inside a host, ranks talk
over loopback): 2 hosts x 2 ranks, one process per rank, each a plain taiji ``Communicator``
(benchmarks/_topology_worker.py). For each size, every topology's allreduce time (the slowest
rank's mean over ``--reps`` back-to-back allreduces, after a warm-up that builds its groups) and
the bytes that crossed hosts meanwhile (the sum over hosts of ``eth0``'s tx counter, per
allreduce). Then SyncSGD's samples/s on a comm-bound MLP under `taiji run --nnodes 2:2
--topology ring|hierarchical` across the same hosts, and under the AdaptiveTopology policy after
its trials (is it within a few % of the best fixed plan?). Then one host, unshaped, 2 ranks: no plan
should cost more than the ring there.

Rows compare each topology with the ring in the same run: time ratio = ring time / plan time,
bytes ratio = ring bytes / plan bytes (both: > 1 means the plan is ahead).

    .venv/bin/python benchmarks/topology.py --quick     # 1 and 10 MB, ~1 min
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _common import contract_row, median, print_result, reap_on_sigterm  # noqa: E402
from _elastic_runs import LaunchedJob, StepLog, wait_for  # noqa: E402
from _netns import EmulatedHosts  # noqa: E402
from multihost import CLI, in_host, skipped_without_hosts  # noqa: E402

WORKER = str(Path(__file__).with_name("_topology_worker.py"))
TRAIN = str(Path(__file__).with_name("_elastic_train.py"))
PORT = 29500


def measure(hosts: EmulatedHosts, placement: list[int], args: argparse.Namespace, out: Path,
            reps: int | None = None) -> dict:
    """Run one worker per entry of ``placement`` (the emulated host of each rank); return
    {(size, topology): {"seconds": slowest rank, "bytes": summed over hosts}}."""
    out.mkdir(parents=True, exist_ok=True)
    addresses = [hosts.address(i) for i in placement]
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    for rank, host in enumerate(placement):
        argv = [sys.executable, WORKER, str(out), str(rank), addresses[0], str(PORT), ",".join(addresses),
                "--sizes-mb", *[str(s) for s in args.sizes_mb], "--reps", str(reps or args.reps)]
        procs.append(hosts.popen(host, argv, env=env, stdout=open(out / f"rank{rank}.log", "w"),
                                 stderr=subprocess.STDOUT))
    for rank, proc in enumerate(procs):
        if proc.wait(timeout=args.timeout) != 0:
            raise RuntimeError(f"rank {rank} failed:\n{(out / f'rank{rank}.log').read_text()[-3000:]}")
    merged: dict = {}
    for rank in range(len(placement)):
        for row in json.loads((out / f"rank{rank}.json").read_text())["rows"]:
            cell = merged.setdefault((row["size_mb"], row["topology"]), {"seconds": 0.0, "bytes": 0.0})
            cell["seconds"] = max(cell["seconds"], row["seconds"])
            cell["bytes"] += row["tx_bytes"] or 0.0
    return merged


def training_speed(hosts: EmulatedHosts, topology: str, args: argparse.Namespace, out: Path) -> float:
    """SyncSGD samples/s of `taiji run --nnodes 2:2 --nproc-per-node 2 --topology T` across the
    two shaped hosts, on benchmarks/_elastic_train.py's MLP (1.05M parameters: comm-bound there):
    the global batch over rank 0's median step time after the warm-up. ``adaptive``: the job
    starts on the ring with the AdaptiveTopology policy, which tries ring, hierarchical and tree
    for 7 steps each (2 settling, 5 timed); measured from then on."""
    adaptive = topology == "adaptive"
    out.mkdir(parents=True, exist_ok=True)
    log, job_id = StepLog(out, "taiji"), f"jt{topology[:4]}"
    env = dict(os.environ, TAIJI_HOME=str(out / "home"), PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    warm = args.warm + (21 if adaptive else 0)
    steps = warm + args.train_steps
    head = LaunchedJob("head", in_host(hosts, 0, [
        *CLI, "run", "--nnodes", "2:2", "--nproc-per-node", "2", "--topology", "ring" if adaptive else topology,
        "--host", hosts.address(0),
        "--port", str(PORT + 1), "--job-id", job_id, "--run-dir", str(out / "run"), "--",
        sys.executable, TRAIN, str(out), "--batch", str(args.batch), "--max-steps", str(steps),
        *(["--adaptive-topology"] if adaptive else [])]), out, env, log)
    jobs = [head]
    try:
        secret = out / "home" / "jobs" / f"{job_id}.secret"
        deadline = time.monotonic() + args.timeout
        while not secret.exists():
            if time.monotonic() > deadline or not head.session.running():
                raise RuntimeError(f"the launcher did not start:\n{head.session.tail()}")
            time.sleep(0.1)
        jobs.append(LaunchedJob("agent", in_host(hosts, 1, [
            *CLI, "join", f"{job_id}@{hosts.address(0)}:{PORT + 1}", "--secret-file", str(secret),
            "--nproc-per-node", "2", "--host", hosts.address(1), "--timeout", "10"]), out, env, log))
        def measured() -> list[dict] | None:
            commits = log.select("commit", worker="w0")
            return commits[warm:steps] if len(commits) >= steps else None
        commits = wait_for(measured, log, jobs, deadline, f"{steps} steps")
        step_s = median(b["time"] - a["time"] for a, b in zip(commits, commits[1:]))
        head.session.wait(max(deadline - time.monotonic(), 1.0))
        return args.batch / step_s
    finally:
        for job in jobs:
            job.close()


def rows_for(merged: dict, where: str, sizes: list[float], with_bytes: bool) -> list[dict]:
    rows = []
    for size in sizes:
        ring = merged[(size, "ring")]
        for topology in ("hierarchical", "tree", "star"):
            mine = merged[(size, topology)]
            label = f"{topology} vs ring, {size:g} MB, {where}"
            rows.append(contract_row(f"{label}: allreduce time (s)", round(mine["seconds"], 4),
                                     round(ring["seconds"], 4), higher_is_better=False))
            if with_bytes:
                rows.append(contract_row(f"{label}: cross-host bytes (MB)", round(mine["bytes"] / 1e6, 3),
                                         round(ring["bytes"] / 1e6, 3), higher_is_better=False))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 10 MB, 3 reps")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--rate", default="400mbit", help="each host's shaped link (tc tbf rate)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--batch", type=int, default=64, help="global batch of the training rows")
    parser.add_argument("--warm", type=int, default=10, help="training steps before the measured ones")
    parser.add_argument("--train-steps", type=int, default=None, help="measured training steps")
    args = parser.parse_args(argv)
    args.sizes_mb = args.sizes_mb or ([1.0, 10.0] if args.quick else [1.0, 10.0, 100.0])
    args.reps = args.reps or (3 if args.quick else 5)
    args.train_steps = args.train_steps or (30 if args.quick else 80)
    reap_on_sigterm()
    if skipped_without_hosts("topology"):
        return
    base = Path(tempfile.mkdtemp(prefix="taiji-topology-"))
    rows: list[dict] = []
    with EmulatedHosts(2) as hosts:
        for i in range(2):
            hosts.shape(i, args.rate)
        shaped = measure(hosts, [0, 0, 1, 1], args, base / "shaped")
        rows += rows_for(shaped, f"2 hosts x 2, {args.rate}", args.sizes_mb, with_bytes=True)
        speed = {t: training_speed(hosts, t, args, base / f"train-{t}") for t in ("ring", "hierarchical", "adaptive")}
        model = f"SyncSGD MLP (1.05M params), 2 hosts x 2, {args.rate}: samples/s"
        rows.append(contract_row(f"hierarchical vs ring, {model}", round(speed["hierarchical"], 1),
                                 round(speed["ring"], 1), higher_is_better=True))
        best = max(("ring", "hierarchical"), key=lambda t: speed[t])
        rows.append(contract_row(f"AdaptiveTopology (after its trials) vs the best fixed plan ({best}), {model}",
                                 round(speed["adaptive"], 1), round(speed[best], 1), higher_is_better=True))
    with EmulatedHosts(1) as hosts:
        # milliseconds each on one host, where this box's noise is ±25% over a few reps: many more
        one = measure(hosts, [0, 0], args, base / "one-host", reps=max(args.reps, 40))
        rows += rows_for(one, "one host x 2, unshaped", args.sizes_mb, with_bytes=False)
    for row in rows:
        print(f"# {row['case']}: {row['taiji']} vs ring {row['anchor']} -> {row['ratio']}x", file=sys.stderr)
    print_result("topology", rows, sizes_mb=args.sizes_mb, reps=args.reps, rate=args.rate, quick=args.quick)


if __name__ == "__main__":
    main()
