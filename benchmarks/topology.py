"""Allreduce topologies side by side: tree, star and host-aware hierarchical vs gloo's flat ring.

On emulated hosts (network namespaces behind a bridge, taiji_harness/netns.py; needs root), with each
host's link shaped by a token bucket (``--rate``, default 400 Mbit/s; inside a host, ranks talk
over loopback): 2 hosts x 2 ranks, one process per rank, each a plain taiji ``Communicator``
(benchmarks/_topology_worker.py). For each size, every topology's allreduce time (the slowest
rank's mean over ``--reps`` back-to-back allreduces, after a warm-up that builds its groups) and
the bytes that crossed hosts meanwhile (the sum over hosts of ``eth0``'s tx counter, per
allreduce). Then SyncSGD's samples/s on a comm-bound MLP under `taiji run --nnodes 2:2
--topology ring|hierarchical` across the same hosts, and under the AdaptiveTopology policy after
its trials (is it within a few % of the best fixed plan?), and over a run in which a third host
joins (the policy tries the plans again at 6 workers; is it still within a few %?). Then one host, unshaped, 2
ranks: no plan should cost more than the ring there.

Rows compare each topology with the ring in the same run: time ratio = ring time / plan time,
bytes ratio = ring bytes / plan bytes (both: > 1 means the plan is ahead).

    .venv/bin/python benchmarks/topology.py --quick     # 1 and 10 MB, ~4 min
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

from multihost import CLI, in_host, skipped_without_hosts  # noqa: E402
from taiji_harness.bench import contract_row, median, print_result, reap_on_sigterm  # noqa: E402
from taiji_harness.elastic_runs import LaunchedJob, StepLog, wait_for  # noqa: E402
from taiji_harness.netns import EmulatedHosts  # noqa: E402

WORKER = str(Path(__file__).with_name("_topology_worker.py"))
TRAIN = str(Path(__file__).with_name("_elastic_train.py"))
PORT = 29500
TRIALS = 3 * 8  # AdaptiveTopology's trials: 3 plans x (2 settling + 1 report lag + 5 timed) steps


def measure(
    hosts: EmulatedHosts, placement: list[int], args: argparse.Namespace, out: Path, reps: int | None = None
) -> dict:
    """Run one worker per entry of ``placement`` (the emulated host of each rank); return
    {(size, topology): {"seconds": slowest rank, "bytes": summed over hosts}}."""
    out.mkdir(parents=True, exist_ok=True)
    addresses = [hosts.address(i) for i in placement]
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    for rank, host in enumerate(placement):
        argv = [
            sys.executable,
            WORKER,
            str(out),
            str(rank),
            addresses[0],
            str(PORT),
            ",".join(addresses),
            "--sizes-mb",
            *[str(s) for s in args.sizes_mb],
            "--reps",
            str(reps or args.reps),
        ]
        procs.append(
            hosts.popen(
                host, argv, env=env, stdout=open(out / f"rank{rank}.log", "w"), stderr=subprocess.STDOUT
            )
        )
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


def train(
    hosts: EmulatedHosts,
    topology: str,
    args: argparse.Namespace,
    out: Path,
    *,
    steps: int,
    join_at: int | None = None,
) -> list[dict]:
    """Run `taiji run --nnodes 2:3 --nproc-per-node 2 --topology T` on hosts 0 and 1 (two shaped
    hosts) on benchmarks/_elastic_train.py's MLP (1.05M parameters: comm-bound there) for
    ``steps`` steps; with ``join_at``, host 2's agent joins once worker w0 has committed that many
    (the job grows to 6 workers). Returns w0's commit records. ``adaptive``: the job starts on
    the ring under the AdaptiveTopology policy, which tries ring, hierarchical and tree for 8
    steps each (2 settling, 1 for its figure to arrive, 5 timed), and again when the cluster's
    size changes."""
    adaptive = topology == "adaptive"
    out.mkdir(parents=True, exist_ok=True)
    log, job_id = StepLog(out, "taiji"), f"jt{topology[:4]}{'j' if join_at else ''}"
    env = dict(os.environ, TAIJI_HOME=str(out / "home"), PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    head = LaunchedJob(
        "head",
        in_host(
            hosts,
            0,
            [
                *CLI,
                "run",
                "--nnodes",
                "2:3",
                "--nproc-per-node",
                "2",
                "--topology",
                "ring" if adaptive else topology,
                "--host",
                hosts.address(0),
                "--port",
                str(PORT + 1),
                "--job-id",
                job_id,
                "--run-dir",
                str(out / "run"),
                "--",
                sys.executable,
                TRAIN,
                str(out),
                "--batch",
                str(args.batch),
                "--max-steps",
                str(steps),
                *(["--adaptive-topology"] if adaptive else []),
            ],
        ),
        out,
        env,
        log,
    )
    jobs = [head]
    try:
        secret = out / "home" / "jobs" / f"{job_id}.secret"
        deadline = time.monotonic() + args.timeout
        while not secret.exists():
            if time.monotonic() > deadline or not head.session.running():
                raise RuntimeError(f"the launcher did not start:\n{head.session.tail()}")
            time.sleep(0.1)

        def join(host: int) -> None:
            jobs.append(
                LaunchedJob(
                    f"agent{host}",
                    in_host(
                        hosts,
                        host,
                        [
                            *CLI,
                            "join",
                            f"{job_id}@{hosts.address(0)}:{PORT + 1}",
                            "--secret-file",
                            str(secret),
                            "--nproc-per-node",
                            "2",
                            "--host",
                            hosts.address(host),
                            "--timeout",
                            "10",
                        ],
                    ),
                    out,
                    env,
                    log,
                )
            )

        join(1)
        if join_at is not None:
            wait_for(
                lambda: len(log.select("commit", worker="w0")) >= join_at or None,
                log,
                jobs,
                deadline,
                f"{join_at} steps before host 2 joins",
            )
            join(2)
        commits = wait_for(
            lambda: (lambda c: c if len(c) >= steps else None)(log.select("commit", worker="w0")),
            log,
            jobs,
            deadline,
            f"{steps} steps",
        )
        head.session.wait(max(deadline - time.monotonic(), 1.0))
        return commits[:steps]
    finally:
        for job in jobs:
            job.close()


def step_seconds(commits: list[dict]) -> float:
    return median(b["time"] - a["time"] for a, b in zip(commits, commits[1:]))


def training_speed(hosts: EmulatedHosts, topology: str, args: argparse.Namespace, out: Path) -> float:
    """SyncSGD samples/s on 2 shaped hosts x 2: the global batch over w0's median step time after
    the warm-up (and, for ``adaptive``, after its trials)."""
    warm = args.warm + (TRIALS if topology == "adaptive" else 0)
    commits = train(hosts, topology, args, out, steps=warm + args.train_steps)
    return args.batch / step_seconds(commits[warm:])


def speeds_with_a_join(hosts: EmulatedHosts, topology: str, args: argparse.Namespace, out: Path) -> dict:
    """A run in which a third host joins (4 -> 6 workers) after the warm-up, the adaptive
    policy's first trials and 20 more steps: samples/s over the whole run from the warm-up on
    (the join, its stall and every trial included), and over its last ``--train-steps`` steps
    (after the policy's second trials) — all at 6 workers, or the run is an error."""
    join_at, tail = args.warm + TRIALS + 20, args.train_steps
    commits = train(
        hosts, topology, args, out, steps=join_at + args.join_steps + TRIALS + tail, join_at=join_at
    )
    last = commits[-tail:]
    if any(c["size"] != 6 for c in last):
        raise RuntimeError(
            f"{topology}: the third host had not joined {tail} steps before the end "
            f"(sizes {sorted({c['size'] for c in last})}); raise --join-steps"
        )
    run = commits[args.warm :]
    return {
        "run": args.batch * (len(run) - 1) / (run[-1]["time"] - run[0]["time"]),
        "end": args.batch / step_seconds(last),
    }


def rows_for(merged: dict, where: str, sizes: list[float], with_bytes: bool) -> list[dict]:
    rows = []
    for size in sizes:
        ring = merged[(size, "ring")]
        for topology in ("hierarchical", "tree", "star"):
            mine = merged[(size, topology)]
            label = f"{topology} vs ring, {size:g} MB, {where}"
            rows.append(
                contract_row(
                    f"{label}: allreduce time (s)",
                    round(mine["seconds"], 4),
                    round(ring["seconds"], 4),
                    higher_is_better=False,
                )
            )
            if with_bytes:
                rows.append(
                    contract_row(
                        f"{label}: cross-host bytes (MB)",
                        round(mine["bytes"] / 1e6, 3),
                        round(ring["bytes"] / 1e6, 3),
                        higher_is_better=False,
                    )
                )
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
    parser.add_argument(
        "--join-steps",
        type=int,
        default=80,
        help="steps the joining host's workers are given to boot and be admitted",
    )
    args = parser.parse_args(argv)
    args.sizes_mb = args.sizes_mb or ([1.0, 10.0] if args.quick else [1.0, 10.0, 100.0])
    args.reps = args.reps or (3 if args.quick else 5)
    args.train_steps = args.train_steps or (30 if args.quick else 80)
    reap_on_sigterm()
    if skipped_without_hosts("topology"):
        return
    base = Path(tempfile.mkdtemp(prefix="taiji-topology-"))
    rows: list[dict] = []
    with EmulatedHosts(3) as hosts:
        for i in range(3):
            hosts.shape(i, args.rate)
        shaped = measure(hosts, [0, 0, 1, 1], args, base / "shaped")
        rows += rows_for(shaped, f"2 hosts x 2, {args.rate}", args.sizes_mb, with_bytes=True)
        # 2 x 2 cannot go below 2/3 of the ring's cross-host bytes (the ring crosses on 2 of its 4
        # links, 3 tensors' worth; each host must receive the other's partial sum, 2); with more
        # ranks per host the bound falls: (k)/(2k - 1), 4/7 at k = 4
        wide = measure(
            hosts,
            [0] * 4 + [1] * 4,
            argparse.Namespace(**{**vars(args), "sizes_mb": [1.0]}),
            base / "wide",
            reps=3,
        )
        ring, mine = wide[(1.0, "ring")]["bytes"], wide[(1.0, "hierarchical")]["bytes"]
        rows.append(
            contract_row(
                f"hierarchical vs ring, 1 MB, 2 hosts x 4, {args.rate}: cross-host bytes (MB)",
                round(mine / 1e6, 3),
                round(ring / 1e6, 3),
                higher_is_better=False,
            )
        )
        speed = {
            t: training_speed(hosts, t, args, base / f"train-{t}")
            for t in ("ring", "hierarchical", "adaptive")
        }
        model = f"SyncSGD MLP (1.05M params), 2 hosts x 2, {args.rate}: samples/s"
        rows.append(
            contract_row(
                f"hierarchical vs ring, {model}",
                round(speed["hierarchical"], 1),
                round(speed["ring"], 1),
                higher_is_better=True,
            )
        )
        best = max(("ring", "hierarchical"), key=lambda t: speed[t])
        rows.append(
            contract_row(
                f"AdaptiveTopology (after its trials) vs the best fixed plan ({best}), {model}",
                round(speed["adaptive"], 1),
                round(speed[best], 1),
                higher_is_better=True,
            )
        )
        joined = {
            t: speeds_with_a_join(hosts, t, args, base / f"join-{t}")
            for t in ("ring", "hierarchical", "adaptive")
        }
        model = f"SyncSGD MLP, 2 -> 3 hosts x 2 (a host joins mid-run), {args.rate}: samples/s"
        for phase, what in (
            ("end", "over the last steps, after its second trials"),
            ("run", "over the whole run, the join and every trial included"),
        ):
            best = max(("ring", "hierarchical"), key=lambda t: joined[t][phase])
            rows.append(
                contract_row(
                    f"AdaptiveTopology vs the best fixed plan ({best}) {what}, {model}",
                    round(joined["adaptive"][phase], 1),
                    round(joined[best][phase], 1),
                    higher_is_better=True,
                )
            )
            rows.append(
                contract_row(
                    f"AdaptiveTopology vs ring {what}, {model}",
                    round(joined["adaptive"][phase], 1),
                    round(joined["ring"][phase], 1),
                    higher_is_better=True,
                )
            )
    with EmulatedHosts(1) as hosts:
        # milliseconds each on one host, where this box's noise is ±25% over a few reps: many more
        one = measure(hosts, [0, 0], args, base / "one-host", reps=max(args.reps, 40))
        rows += rows_for(one, "one host x 2, unshaped", args.sizes_mb, with_bytes=False)
    for row in rows:
        print(f"# {row['case']}: {row['taiji']} vs ring {row['anchor']} -> {row['ratio']}x", file=sys.stderr)
    print_result("topology", rows, sizes_mb=args.sizes_mb, reps=args.reps, rate=args.rate, quick=args.quick)


if __name__ == "__main__":
    main()
