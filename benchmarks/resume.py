"""Resume after a whole-job kill: `taiji run --resume auto` vs torchrun restarting the same script.

Both sides train benchmarks/_elastic_train.py (an MLP of 1.05M parameters, SGD with momentum,
global batch 64) on 2 workers until a checkpoint exists, then every process of the job (launcher
and workers) is SIGKILLed at once, as a power cut or a revoked fleet would. The clock starts when
the same command is started again and stops at the first step committed after it:

- taiji: `taiji run -np N --checkpoint-dir D --checkpoint-every 10 --resume auto`; the workers
  load the latest complete checkpoint (each reads the shards it needs) and go on. Steps after
  that checkpoint are retrained (reported as ``steps_redone``).
- torchrun: `torchrun --standalone --nproc-per-node N` of the same script, which saves model,
  optimizer and step with `torch.save` on rank 0 after *every* step and loads it with
  `torch.load` when it starts (what a torchrun user writes; nothing is redone, at the cost of a
  synchronous save per step).

Rows: the same size (2 -> 2) and another size (2 -> 3; taiji reshards the 2-writer checkpoint,
torchrun's single file loads at any size), each with its sides' phases (``phases()``: medians of
the slowest worker's phases, the workers' CPU seconds, and taiji's run-log figures). Each repetition kills and
resumes both sides, in an order alternating between repetitions; the figure is the median.

    .venv/bin/python benchmarks/resume.py --quick     # 2 repetitions
    .venv/bin/python benchmarks/resume.py             # 5 repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from taiji_harness.bench import contract_row, interleaved, median, print_result, reap_on_sigterm, spread  # noqa: E402
from taiji_harness.elastic_runs import LaunchedJob, StepLog, torchrun_cmd, train_args, wait_for  # noqa: E402

SIDES = ("taiji", "torchrun")
CHECKPOINT_EVERY = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions (about 2 min)")
    parser.add_argument(
        "--reps", type=int, default=None, help="kills per side and size (default: 5; quick 2)"
    )
    parser.add_argument(
        "--before-kill",
        type=int,
        default=25,
        help="steps committed before the kill (default: %(default)s; taiji's last checkpoint "
        f"is at a multiple of {CHECKPOINT_EVERY})",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per phase")
    args = parser.parse_args(argv)
    args.reps = args.reps or (2 if args.quick else 5)
    args.collective_timeout = 30.0
    return args


def command(args: argparse.Namespace, side: str, out: Path, ck: Path, size: int, resume: bool) -> list[str]:
    if side == "taiji":
        launcher = [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "run",
            "-np",
            str(size),
            "--max-np",
            str(size),
            "--checkpoint-dir",
            str(ck),
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--run-dir",
            str(out / "run"),
            *(["--resume", "auto"] if resume else []),
            "--",
        ]
        return launcher + train_args(args, out)
    return torchrun_cmd(
        args,
        out,
        size,
        ["--standalone", "--max-restarts", "0"],
        "--checkpoint",
        str(ck / "ckpt.pt"),
        "--timeout",
        str(args.collective_timeout),
    )


def one(args: argparse.Namespace, side: str, size: int, root: Path, env: dict) -> dict:
    """Train at 2 until a checkpoint is there, kill everything, restart at ``size``: seconds from
    the restart to its first committed step, and the steps it redoes."""
    out, ck = root / f"{side}-{size}", root / f"{side}-{size}-ck"
    out.mkdir()
    ck.mkdir()
    log = StepLog(out, side)
    first = LaunchedJob(f"{side}-first", command(args, side, out, ck, 2, False), out, env, log)
    try:
        deadline = time.monotonic() + args.timeout
        wait_for(
            lambda: len(log.select("commit", rank=0)) >= args.before_kill,
            log,
            [first],
            deadline,
            f"{args.before_kill} steps",
        )
        if side == "taiji":
            wait_for(
                lambda: any(
                    p.name.startswith("step-") and (p / "manifest.json").exists() for p in ck.iterdir()
                ),
                log,
                [first],
                deadline,
                "a complete checkpoint",
            )
    finally:
        first.close()  # SIGKILL: the launcher's session and every worker
    log.poll()
    last = max(r["step"] for r in log.select("commit", rank=0))
    before = len(log.records)
    restarted = time.time()
    second = LaunchedJob(f"{side}-resumed", command(args, side, out, ck, size, True), out, env, log)
    try:
        deadline = time.monotonic() + args.timeout

        def resumed() -> list[dict]:
            return [r for r in log.records[before:] if r.get("event") == "commit" and r.get("rank") == 0]

        commits = wait_for(resumed, log, [second], deadline, "the first step after the restart")
    finally:
        second.close()
    # torchrun's side saves a step before it logs it: killed between the two, the saved step is
    # missing from the log and the restart begins one past the last logged step (nothing redone)
    return {
        "seconds": commits[0]["time"] - restarted,
        "redone": max(0, last - commits[0]["step"] + 1),
        "size": commits[0]["size"],
        **phases(log.records[before:], restarted),
        **(run_log_phases(out / "run") if side == "taiji" else {}),
    }


PHASES = ("to_exec", "import_torch", "join", "build", "load", "to_first_step")


def phases(records: list[dict], restarted: float) -> dict:
    """Where the restart's time went, for its slowest worker (the last to begin its first step):
    the launcher until the worker's Python runs (``to_exec``), ``import torch``, joining (taiji:
    ``import taiji`` and ``taiji.init()``; torchrun: ``init_process_group`` and a group), the
    script building its model and optimizer (``build``: the same code on both sides), loading the
    state (taiji: building the Job, which loads the checkpoint; torchrun: ``torch.load`` and
    ``load_state_dict``), then until the first step begins (taiji: the groups and the state's
    sync; torchrun: DDP's construction). Also every worker's CPU seconds by its first step, summed
    (``worker_cpu_s``: what 3 workers on 2 cores share)."""
    boots = [r for r in records if r.get("event") == "boot"]
    if not boots:
        return {}
    last = max(boots, key=lambda r: r["ready"])
    marks = [restarted] + [last[k] for k in ("exec", "imported", "joined", "built", "loaded", "ready")]
    return {
        **{phase: b - a for phase, a, b in zip(PHASES, marks, marks[1:])},
        "worker_cpu_s": sum(r["cpu"] for r in boots),
    }


def run_log_phases(run_dir: Path) -> dict:
    """From taiji's run log (rank 0's view): the last start's ``groups`` and ``sync`` seconds and
    its resume's ``load_s`` (finding, reading and checking the checkpoint)."""
    events = [
        json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()
    ]
    start = [e for e in events if e.get("kind") == "start"][-1]
    resumed = [e for e in events if e.get("kind") == "resume"]
    return {
        **{f"run_log_{k}": v for k, v in start.get("phases", {}).items()},
        **({"run_log_load": resumed[-1]["load_s"]} if resumed and "load_s" in resumed[-1] else {}),
    }


def medians(runs: list[dict]) -> dict:
    """Each phase's median over the repetitions (s)."""
    keys = [k for k in runs[0] if k not in ("seconds", "redone", "size") and all(k in r for r in runs)]
    return {k: round(median(r[k] for r in runs), 3) for k in keys}


def main(argv=None) -> None:
    args = parse_args(argv)
    reap_on_sigterm()
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR")
    root = Path(tempfile.mkdtemp(prefix="taiji-bench-resume-"))
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        for rep in range(args.reps):
            for size in (2, 3):
                for side in interleaved(SIDES, rep):
                    where = root / f"r{rep}"
                    where.mkdir(exist_ok=True)
                    got = one(args, side, size, where, env)
                    assert got["size"] == size, got
                    results.setdefault((side, size), []).append(got)
                    where_to = ", ".join(f"{k} {got[k]:.2f}s" for k in (*PHASES, "worker_cpu_s") if k in got)
                    print(
                        f"rep {rep}: {side} 2 -> {size}: first step {got['seconds']:.2f}s after the restart, "
                        f"{got['redone']} step(s) redone ({where_to})",
                        flush=True,
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def seconds(side: str, size: int) -> list[float]:
        return [r["seconds"] for r in results[(side, size)]]

    rows = []
    for size, case in (
        (2, "resume after a whole-job kill vs torchrun restart (2 -> 2 workers)"),
        (3, "resume after a whole-job kill vs torchrun restart (2 -> 3 workers)"),
    ):
        rows.append(
            contract_row(
                case,
                round(median(seconds("taiji", size)), 3),
                round(median(seconds("torchrun", size)), 3),
                higher_is_better=False,
                unit="s to the first step after the restart",
                taiji_spread=spread(seconds("taiji", size)),
                anchor_spread=spread(seconds("torchrun", size)),
                target=">= 1.0",
                steps_redone=[r["redone"] for r in results[("taiji", size)]],
                taiji_phases=medians(results[("taiji", size)]),
                anchor_phases=medians(results[("torchrun", size)]),
            )
        )
    print_result(
        "resume",
        rows,
        reps=args.reps,
        checkpoint_every=CHECKPOINT_EVERY,
        before_kill=args.before_kill,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
