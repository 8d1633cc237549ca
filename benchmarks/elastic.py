"""Membership changes: taiji's elastic transitions vs torchrun's restart path and torchft, side by side.

One training script (``_elastic_train.py``: an MLP of 1.05M parameters, SGD with momentum,
global batch 64) runs under ``taiji run`` as a ``taiji.Job`` and under torchrun as plain
DDP that checkpoints after every step and resumes from the checkpoint when it starts. Every
process logs each committed step with its wall-clock time; all figures come from those logs.

- **grow 1->2, grow 2->4, shrink 4->2**: the stall of the workers that keep running, i.e.
  (first commit at the new size - last commit at the old size) - one normal step at the new
  size. taiji: one job; the parent asks its store for a new size (what ``taiji resize`` does);
  joiners boot while the others keep training, so their boot is not a stall. torchrun: the
  measured anchor is its restart path: stop the job (SIGTERM to torchrun) and start it again
  with the new size from the last checkpoint. Its own elastic scale-up (two agents, c10d
  rendezvous) is tried once in full mode and reported as what happened.
- **crash**: SIGKILL one of 2 workers; seconds from the kill to the next committed step of
  a survivor. taiji: the survivor retries the failed step alone (full mode also kills one of
  3). torchrun: ``--max-restarts 1`` restarts both workers from the checkpoint.
- **hang**: SIGSTOP one of 2 workers, collective timeout 2 s; seconds from the SIGSTOP to the
  next committed step. torchrun (full mode): the survivor's gloo timeout fails it, the agent
  stops the group (the stopped worker gets SIGKILL only after torchrun's shutdown timeout,
  30 s by default) and restarts. Quick mode reports a lower bound instead: timeout + the
  measured crash restart.

- **beside torchft** (a lighthouse and two replica groups of one worker, each under torchrun, set
  up as torchft's README and ``train_ddp.py`` do): one run per side trains at 2 workers
  (steady-state samples/s), SIGKILLs one worker (replica group), then brings one back: the
  survivors' next committed step, their stall when it joins, the joiner's time to its first
  committed step, and exactly-once (every step's sample indices logged: samples lost or trained
  on twice). torchrun runs plain DDP (no checkpoint) for the steady state; its crash and grow
  1->2 figures stand beside each row. Without torchft installed those rows say so
  (``pip install -e '.[bench]'``).

Repetitions alternate which side runs first; each row gives medians, every repetition's value
(``*_all``) and the parts the anchor's time is made of. Every launched job has a hard timeout
and is killed with its session (and any worker torchrun started) and reaped in ``finally``.

The pieces: ``_elastic_taiji.py``, ``_elastic_torchrun.py`` and ``_elastic_torchft.py`` run the sides,
the harness's ``taiji_harness/elastic_runs.py`` holds what they share (the step logs, a launched job),
``elastic_analysis.py`` turns step-log records into figures (pure functions, unit-tested),
``elastic_report.py`` turns the repetitions' figures into the table and the result line. This file is the
command line and the order of the runs.

    .venv/bin/python benchmarks/elastic.py --quick      # one repetition: 4-5 min on 2 busy cores
    .venv/bin/python benchmarks/elastic.py              # 3 repetitions + extras: about 28 min on 2 busy cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from _elastic_taiji import taiji_fault, taiji_kill_join, taiji_resize  # noqa: E402
from _elastic_torchft import torchft_kill_join, torchft_missing, torchft_version  # noqa: E402
from _elastic_torchrun import torchrun_elastic, torchrun_fault, torchrun_resize, torchrun_steady  # noqa: E402
from taiji_harness.bench import interleaved, reap_on_sigterm  # noqa: E402
from taiji_harness.elastic_analysis import model_figures  # noqa: E402
from taiji_harness.elastic_report import build_rows, report  # noqa: E402
from taiji_harness.elastic_runs import StepLog  # noqa: E402

MEASURED_SETS = {
    "resize": ("taiji_resize", "torchrun_resize"),
    "crash": ("taiji_crash", "torchrun_crash"),
    "hang": ("taiji_hang", "torchrun_hang"),
    "kill-join": ("taiji_kill_join", "torchft_kill_join", "torchrun_steady"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, fewer extras (<= 90 s)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default: 1 quick, 3 full)")
    parser.add_argument(
        "--warm", type=int, default=None, help="steps before the first change (default: 10 quick, 20 full)"
    )
    parser.add_argument(
        "--settle",
        type=int,
        default=None,
        help="steps at a new size before the next change; their median is 'one normal step' "
        "(default: 8 quick, 15 full)",
    )
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--step-delay", type=float, default=0.01, help="simulated compute per step, seconds")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=30.0,
        help="collective timeout of the resize and crash runs, both sides",
    )
    parser.add_argument("--hang-timeout", type=float, default=2.0, help="collective timeout of the hang runs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="hard limit per launched job, seconds (default: 45 quick, 150 full)",
    )
    parser.add_argument(
        "--elastic-wait",
        type=float,
        default=None,
        help="how long to wait for torchrun's own elastic scale-up (default: 0 = not tried "
        "in --quick, 75 in full mode, enough for its 60 s store timeout to fire)",
    )
    parser.add_argument(
        "--torchrun-hang",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure torchrun's hang recovery (default: full mode only)",
    )
    parser.add_argument(
        "--crash3",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also kill one of 3 taiji workers (default: full mode only)",
    )
    parser.add_argument(
        "--steady",
        type=int,
        default=None,
        help="steps at 2 workers before the kill of the runs beside torchft; their median "
        "interval gives the steady-state samples/s (default: 30 quick, 60 full)",
    )
    parser.add_argument(
        "--torchft",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the torchft side (needs torchft: pip install -e '.[bench]')",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(MEASURED_SETS),
        default=list(MEASURED_SETS),
        help="run only these measurements (default: all); the other rows come out empty",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the run directories (step logs, launcher output)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.reps = args.reps or (1 if quick else 3)
    args.warm = args.warm or (10 if quick else 20)
    args.settle = args.settle or (8 if quick else 15)
    args.steady = args.steady or (30 if quick else 60)
    args.timeout = args.timeout or (45.0 if quick else 150.0)
    args.elastic_wait = (0.0 if quick else 75.0) if args.elastic_wait is None else args.elastic_wait
    args.torchrun_hang = (not quick) if args.torchrun_hang is None else args.torchrun_hang
    args.crash3 = (not quick) if args.crash3 is None else args.crash3
    if args.batch % 4 or args.settle < 3 or args.warm < 3:
        parser.error("--batch must divide by 4 (sizes 1, 2, 4); --settle and --warm at least 3")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    reap_on_sigterm()
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAIJI_", "TORCHELASTIC_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    base = Path(tempfile.mkdtemp(prefix="taiji-bench-elastic-"))
    runners: dict[str, Callable[[Path], dict]] = {
        "taiji_resize": lambda out: taiji_resize(args, out, env),
        "torchrun_resize": lambda out: torchrun_resize(args, out, env),
        "taiji_crash": lambda out: taiji_fault(args, out, env, 2, "crash"),
        "torchrun_crash": lambda out: torchrun_fault(args, out, env, "crash"),
        "taiji_hang": lambda out: taiji_fault(args, out, env, 2, "hang"),
        "torchrun_hang": lambda out: torchrun_fault(args, out, env, "hang"),
        "taiji_crash3": lambda out: taiji_fault(args, out, env, 3, "crash"),
        "taiji_kill_join": lambda out: taiji_kill_join(args, out, env),
        "torchft_kill_join": lambda out: torchft_kill_join(args, out, env),
        "torchrun_steady": lambda out: torchrun_steady(args, out, env),
    }
    skipped = set() if args.torchrun_hang else {"torchrun_hang"}
    missing = (
        (torchft_missing() if args.torchft else "not run (--no-torchft)")
        if "kill-join" in args.only
        else "not run (--only)"
    )
    if missing:
        skipped.add("torchft_kill_join")
        print(f"# torchft side skipped: {missing}", file=sys.stderr, flush=True)
    results: dict[str, list[dict]] = {name: [] for name in runners}
    errors: list[str] = []
    model: dict = {}

    def run(name: str, rep: int) -> None:
        out = base / f"{name}-{rep}"
        out.mkdir()
        t0 = time.monotonic()
        try:
            results[name].append(runners[name](out))
            failed = results[name][-1].get("error")  # a side that reports what it could not complete
            print(
                f"# {name} rep {rep}: {time.monotonic() - t0:.1f}s"
                + (f", failed: {failed}" if failed else ""),
                file=sys.stderr,
                flush=True,
            )
        except Exception as exc:  # one bad run must not hide the others: reported in the JSON
            errors.append(f"{name} rep {rep}: {type(exc).__name__}: {str(exc)[:1500]}")
            print(
                f"# {name} rep {rep} FAILED after {time.monotonic() - t0:.1f}s:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
        if not model:
            every_log = StepLog(out, "*")
            every_log.poll()
            model.update(model_figures(every_log.records))

    elastic = None
    try:
        for rep in range(args.reps):
            for sides in (MEASURED_SETS[key] for key in args.only):  # taiji first on even repetitions,
                for name in interleaved(sides, rep):  # the anchors first on odd ones
                    if name not in skipped:
                        run(name, rep)
            if args.crash3 and "crash" in args.only:
                run("taiji_crash3", rep)
        if args.elastic_wait > 0 and "resize" in args.only:
            out = base / "torchrun_elastic"
            out.mkdir()
            t0 = time.monotonic()
            try:
                elastic = torchrun_elastic(args, out, env)
            except Exception as exc:
                elastic = {"outcome": f"attempt failed: {type(exc).__name__}: {str(exc)[:500]}"}
            print(
                f"# torchrun elastic scale-up attempt: {time.monotonic() - t0:.1f}s",
                file=sys.stderr,
                flush=True,
            )
        rows = build_rows(results, elastic, model, args.hang_timeout, missing)
    finally:
        if args.keep:
            print(f"# run directories kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(f"# total {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    report(
        rows,
        model={
            "mlp": "512-1024-512-10",
            **model,
            "global_batch": args.batch,
            "step_delay_s": args.step_delay,
        },
        torchrun_elastic_scale_up=elastic,
        torchft=missing or torchft_version(),
        errors=errors,
        reps=args.reps,
        quick=args.quick,
        only=args.only,
        cpus=os.cpu_count(),
        raw=results if not args.quick else None,
        # a run of some measurements is recorded beside the whole run's (elastic.<those>.json), not over it
        **({"variant": "+".join(args.only)} if set(args.only) != set(MEASURED_SETS) else {}),
    )


if __name__ == "__main__":
    main()
