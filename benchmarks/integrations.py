"""The framework entry points vs each framework's own DDP: training samples/s, side by side.

Lightning: ``L.Trainer(strategy=TaijiStrategy())`` under ``taiji run -np 2`` against
``L.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), devices=2)`` under ``torchrun
--nproc-per-node 2`` (Lightning's launcher for processes started outside it), on the examples'
Fashion-MNIST CNN, global batch 128. Hugging Face: ``TaijiTrainer`` under ``taiji run -np 2`` against the
``Trainer`` under ``torchrun --nproc-per-node 2`` (``ddp_backend="gloo"``,
``ddp_find_unused_parameters=False``), on a 2-layer GPT-2 built from a config in code on 64-character
Shakespeare windows, global batch 32. Same module, data, optimizer, global batch and number of steps
on both sides; 2 processes of one compute thread each, gloo over loopback, CPU
(benchmarks/_integrations_train.py). Every worker process runs in a session of its own on both sides
(taiji's launcher and torchrun both start them so): with the kernel's autogroup scheduling a
shared machine's CPU is divided between sessions, so a side whose processes shared one session
(Lightning's own launcher: ``python script.py`` forks its second process) would get half the CPU
of the other under load.

Steady state only: each run's steps are timed by a callback both sides share (the end of every
step, after the update); the first ``--warmup`` steps (boot, first allocations, gloo's first
buffers) are left out and samples/s is taken over the next ones, on rank 0. The sides of one
framework alternate within a repetition (taiji first on even repetitions, the anchor first on odd
ones); ``ratio`` is the median over repetitions of taiji's samples/s over the anchor's of the same
repetition (> 1: taiji ahead; target >= 0.97); ``taiji``/``anchor`` are the medians. Beside it,
``cpu_ratio``: the same pairing of the CPU seconds both processes spent per sample over those steps
(every thread's: a clock that other work on a shared machine disturbs far less than the wall's).

    .venv/bin/python benchmarks/integrations.py --quick     # 2 repetitions
    .venv/bin/python benchmarks/integrations.py             # 5 repetitions, more steps
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from taiji_harness.bench import (
    contract_row,
    interleaved,
    median,
    print_result,
    reap_on_sigterm,
    run_launcher,
    run_to_end,
    spread,
)

HELPER = str(Path(__file__).with_name("_integrations_train.py"))
NPROC = 2
TARGET = 0.97
CASES = {  # framework: (row name, global batch)
    "lightning": ("Lightning: samples/s TaijiStrategy vs Lightning DDP", 128),
    "hf": ("HF Trainer: samples/s TaijiTrainer vs Trainer DDP", 32),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 60 steps")
    parser.add_argument("--frameworks", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument(
        "--reps", type=int, default=None, help="repetitions per side (default: 2 quick, 5 full)"
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 60 quick, 100 full)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="first steps left out (default: 10 quick, 20 full)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="hard limit for one run, seconds")
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's output in this directory")
    args = parser.parse_args(argv)
    args.reps = args.reps or (2 if args.quick else 5)
    args.steps = args.steps or (60 if args.quick else 100)
    args.warmup = args.warmup or (10 if args.quick else 20)
    if not 0 < args.warmup < args.steps - 1:
        parser.error("need 0 < --warmup < --steps - 1")
    return args


def steady_rate(times: list[float], warmup: int, batch: int) -> float:
    """Global samples/s from the end of step ``warmup`` to the end of the last step."""
    measured = len(times) - warmup
    return measured * batch / (times[-1] - times[warmup - 1])


def run_side(framework: str, side: str, args: argparse.Namespace, out: Path) -> dict:
    """One run of one side; its steady-state samples/s (rank 0) and where its time went."""
    batch = CASES[framework][1]
    worker = [HELPER, framework, side, str(out), "--steps", str(args.steps), "--batch", str(batch)]
    started = time.monotonic()
    if side == "taiji":
        run_launcher(
            [
                sys.executable,
                "-m",
                "taiji.launch.cli",
                "run",
                "-np",
                str(NPROC),
                "--",
                sys.executable,
                *worker,
            ],
            out.with_suffix(".log"),
            args.timeout,
            name=f"{framework} taiji",
        )
    else:
        launch = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(NPROC),
        ]
        finished = run_to_end(
            [*launch, *worker],
            args.timeout,
            name=f"{framework} ddp",
            output=out.with_suffix(".log"),
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        if finished.timed_out or finished.returncode != 0:
            raise RuntimeError(
                f"{framework} ddp: exit {finished.returncode}. Output tail:\n{finished.tail()}"
            )
    wall = time.monotonic() - started
    ranks = [json.loads((out / f"times-{r}.json").read_text()) for r in range(NPROC)]
    times = ranks[0]["times"]
    if len(times) != args.steps:
        raise RuntimeError(f"{framework} {side}: rank 0 timed {len(times)} steps, not {args.steps}")
    rate = steady_rate(times, args.warmup, batch)
    steps = [b - a for a, b in zip(times[args.warmup - 1 :], times[args.warmup :])]
    measured = (args.steps - args.warmup) * batch
    cpu = (
        sum(r["cpu"][-1] - r["cpu"][args.warmup - 1] for r in ranks) / measured
    )  # both processes, per sample
    return {
        "samples_per_s": rate,
        "step_ms": 1e3 * median(steps),
        "wall_s": wall,
        "loss": ranks[0]["loss"],
        "cpu_ms_per_sample": 1e3 * cpu,
        "rank1_samples_per_s": steady_rate(ranks[1]["times"], args.warmup, batch),
    }


def contract_rows(runs: dict[str, list[dict[str, dict]]], args: argparse.Namespace) -> list[dict]:
    """One row per framework from ``runs[framework][rep][side]`` (side: taiji, ddp)."""
    rows = []
    for framework, reps in runs.items():
        name, batch = CASES[framework]
        taiji = [rep["taiji"]["samples_per_s"] for rep in reps]
        anchor = [rep["ddp"]["samples_per_s"] for rep in reps]
        paired = [t / a for t, a in zip(taiji, anchor)]
        ratio = median(paired)
        cpu = {side: [rep[side]["cpu_ms_per_sample"] for rep in reps] for side in ("taiji", "ddp")}
        cpu_paired = [a / t for t, a in zip(cpu["taiji"], cpu["ddp"])]
        rows.append(
            contract_row(
                name,
                round(median(taiji), 1),
                round(median(anchor), 1),
                higher_is_better=True,
                ratio=ratio,
                target=f">= {TARGET}",
                target_met=ratio >= TARGET,
                paired_ratios=[round(r, 3) for r in paired],
                cpu_ratio=round(median(cpu_paired), 3),
                cpu_paired_ratios=[round(r, 3) for r in cpu_paired],
                cpu_ms_per_sample={
                    "taiji": round(median(cpu["taiji"]), 3),
                    "anchor": round(median(cpu["ddp"]), 3),
                },
                samples_per_s_spread={"taiji": spread(taiji, 1), "anchor": spread(anchor, 1)},
                step_ms={
                    "taiji": round(median(rep["taiji"]["step_ms"] for rep in reps), 2),
                    "anchor": round(median(rep["ddp"]["step_ms"] for rep in reps), 2),
                },
                run_wall_s={
                    "taiji": round(median(rep["taiji"]["wall_s"] for rep in reps), 1),
                    "anchor": round(median(rep["ddp"]["wall_s"] for rep in reps), 1),
                },
                final_loss={"taiji": reps[-1]["taiji"]["loss"], "anchor": reps[-1]["ddp"]["loss"]},
                global_batch=batch,
                nproc=NPROC,
                reps=len(reps),
                steps=args.steps,
                warmup_steps=args.warmup,
            )
        )
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    reap_on_sigterm()
    os.environ["OMP_NUM_THREADS"] = "1"  # one compute thread per process, both sides
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    load_before = os.getloadavg()
    started = time.monotonic()
    runs: dict[str, list[dict[str, dict]]] = {framework: [] for framework in args.frameworks}
    with tempfile.TemporaryDirectory(prefix="taiji-bench-integrations-") as scratch:
        root = args.keep or Path(scratch)
        for rep in range(args.reps):
            for framework in args.frameworks:
                result = {}
                for side in interleaved(["taiji", "ddp"], rep):
                    result[side] = run_side(framework, side, args, root / f"{framework}-{side}-{rep}")
                    print(
                        f"# rep {rep} {framework:9s} {side:5s} "
                        f"{result[side]['samples_per_s']:8.1f} samples/s "
                        f"({result[side]['step_ms']:.1f} ms/step, "
                        f"{result[side]['cpu_ms_per_sample']:.2f} CPU ms per sample, "
                        f"run {result[side]['wall_s']:.0f} s, "
                        f"load {os.getloadavg()[0]:.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
                runs[framework].append(result)
    rows = contract_rows(runs, args)
    for row in rows:
        print(
            f"{row['case']}: taiji {row['taiji']} vs {row['anchor']} samples/s, ratio {row['ratio']} "
            f"(per repetition {row['paired_ratios']})"
        )
    print_result(
        "integrations",
        rows,
        backend="gloo",
        cpus=os.cpu_count(),
        quick=args.quick,
        load_average={
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        seconds=round(time.monotonic() - started, 1),
    )


if __name__ == "__main__":
    main()
