"""SyncSGD vs ModelAveraging vs PairAveraging vs LocalSGD on 4 workers, with and without one worker slowed 2x.

    .venv/bin/python benchmarks/strategies.py --quick   # 15k-sample subset, 1 epoch: ~5 min here
    .venv/bin/python benchmarks/strategies.py           # all 60k samples, 2 epochs: ~12 min here
    .venv/bin/python benchmarks/strategies.py --reps 2  # twice, the second time in reverse order

Eight `taiji run -np 4` jobs (4 strategies x {no straggler, rank 3 slowed 2x}; with ``--reps`` > 1
the order alternates) train the CNN of examples/fashion_mnist.py on the real Fashion-MNIST with
the same seed, global batch (128: 32 per worker), optimizer (SGD lr 0.05, momentum 0.9) and
epoch budget. Strategies: ``SyncSGD()`` (the anchor: exact, equivalent to DDP),
``ModelAveraging(alpha=1.0, every=4)`` (periodic full averaging; ``--ma-alpha``, ``--ma-every``),
``PairAveraging()`` (decoupled: each worker claims batches and trains at its own pace; sync
point once per epoch by default) and ``LocalSGD(every=8)`` (decoupled like PairAveraging; all
workers average their models, weighted by local steps, every 8 global batches' worth of samples;
``--local-every``, ``--outer-lr``, ``--outer-momentum``). See ``_strategies_train.py``
for how the straggler is slowed and what each rank measures.

samples/s = samples trained by all workers / (last rank's loop end - first rank's loop start):
process start, join and the test evaluation are excluded; the final sync point and the end-of-
training averaging of non-exact strategies are included. Accuracy: the final (averaged) model on
the 10k test set, on rank 0. Goal (the issue): with the straggler, a decoupled strategy
(PairAveraging, LocalSGD) >= 1.5x SyncSGD samples/s at <= 1 point accuracy loss. The ceiling on
these cores: 3 workers at full pace and one at half give 3.5 / 2 = 1.75x SyncSGD's straggler pace.

The last line of stdout is the result line of docs/design.md#performance-targets. Per strategy other than
SyncSGD and per setting, two rows: ``pair_averaging_straggler`` (taiji = PairAveraging samples/s, anchor =
SyncSGD samples/s, ratio = taiji / anchor) and ``pair_averaging_straggler_accuracy`` (final test accuracy;
``accuracy_points`` = taiji - anchor), likewise ``..._no_straggler``, ``model_averaging_...`` and
``local_sgd_...``. With ``--reps`` > 1, taiji and anchor are medians and the ratio is the median of the
repetitions' own ratios (each repetition's jobs ran back to back). Every job's figures are under ``runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from taiji_harness.bench import contract_row, interleaved, median, print_result, reap_on_sigterm, run_launcher

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_strategies_train.py"
NPROC = 4
STRAGGLER_RANK = 3
STRATEGIES = ("sync", "avg", "pair", "local")  # the default set; pair_equal on request
LABEL = {
    "sync": "SyncSGD",
    "avg": "ModelAveraging",
    "pair": "PairAveraging",
    "local": "LocalSGD",
    "pair_equal": "PairAveraging-equal-weights",
}
CASE = {
    "avg": "model_averaging",
    "pair": "pair_averaging",
    "local": "local_sgd",
    "pair_equal": "pair_averaging_equal_weights",
}  # the result rows' names, against SyncSGD
STRAGGLER_PROOF = ("pair", "local", "pair_equal")  # the decoupled strategies the straggler goal is for
SETTINGS = {"both": (False, True), "straggler": (True,), "none": (False,)}
GOAL_SPEEDUP, GOAL_ACC_POINTS = 1.5, 1.0
OTHERS = ("adaptive_batch.py", "pytest")  # other jobs on this box that would pollute the timings


def others_running() -> list[str]:
    """Command lines of other benchmark / test processes on the machine (not ours)."""
    found = []
    for pattern in OTHERS:
        out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
        found += [ln for ln in out.splitlines() if ln.strip() and "pgrep" not in ln]
    return found


def wait_for_idle(limit_s: float) -> bool:
    """Wait (up to ``limit_s``) until no other benchmark or test run is on the machine."""
    deadline = time.monotonic() + limit_s
    while others_running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(10)
    return True


def run_job(name: str, worker_args: list[str], out: Path, timeout: float) -> list[dict[str, Any]]:
    """One `taiji run -np 4` job under a hard timeout; its session is killed and reaped on the way out."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(NPROC),
        "--",
        sys.executable,
        str(WORKER),
        *worker_args,
        "--out",
        str(out),
    ]
    # without OMP_NUM_THREADS the launcher picks cpu_count // 4 = 1 thread per worker
    finished = run_launcher(cmd, out / "launcher.log", timeout, name=name, env_drop=["OMP_NUM_THREADS"])
    files = sorted(out.glob("rank*.json"))
    if len(files) != NPROC:
        raise RuntimeError(f"{name}: `taiji run` left {len(files)} results. Output tail:\n{finished.tail()}")
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])


def summarise(strategy: str, slowed: bool, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    wall = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
    samples = sum(r["samples"] for r in ranks)
    expected = ranks[0]["train_samples"] * ranks[0]["epochs"]
    row = {
        "strategy": LABEL[strategy],
        "straggler": slowed,
        "samples_per_s": round(samples / wall, 1),
        "accuracy": ranks[0]["accuracy"],
        "train_wall_s": round(wall, 2),
        "samples": samples,
        "samples_expected": expected,
        "eval_s": ranks[0]["eval_s"],
        "replicas_identical": len({r["checksum"] for r in ranks}) == 1,
        "per_rank_samples": [r["samples"] for r in ranks],
        "per_rank_steps": [r["steps"] for r in ranks],
        "compute_ms": [round(r["compute_ms_median"], 1) for r in ranks],
        "step_ms": [round(r["step_ms_median"], 1) for r in ranks],
        "between_steps_ms": [round(r["between_ms_median"] or 0.0, 1) for r in ranks],
        "straggler_slept_s": sum(r["slept_s"] for r in ranks),
    }
    if "pair_averaged" in ranks[0]:
        row["pair_averaged"] = [r["pair_averaged"] for r in ranks]
        row["pair_skipped"] = [r["pair_skipped"] for r in ranks]
    if "sync_points" in ranks[0]:
        row["sync_points"] = ranks[0]["sync_points"]
    if samples != expected:
        raise RuntimeError(
            f"{LABEL[strategy]}: trained {samples} samples, expected {expected} (lost/duplicated)"
        )
    return row


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per straggler setting: X/SyncSGD samples/s and X - SyncSGD accuracy (points)."""
    by = {(r["strategy"], r["straggler"]): r for r in rows}
    settings = sorted({slowed for _, slowed in by})
    present = [s for s in LABEL.values() if any((s, slowed) in by for slowed in settings)]
    out: dict[str, Any] = {}
    for slowed in settings:
        tag = "straggler" if slowed else "no_straggler"
        anchor = by[("SyncSGD", slowed)]
        for s in present[1:]:
            row = by[(s, slowed)]
            out[f"{s}/SyncSGD samples/s, {tag}"] = round(row["samples_per_s"] / anchor["samples_per_s"], 3)
            out[f"{s}-SyncSGD accuracy points, {tag}"] = round(
                100 * (row["accuracy"] - anchor["accuracy"]), 2
            )
    for s in present if len(settings) == 2 else []:
        out[f"{s} straggler/no-straggler samples/s"] = round(
            by[(s, True)]["samples_per_s"] / by[(s, False)]["samples_per_s"], 3
        )
    return out


def median_rows(reps: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per configuration: the median samples/s and accuracy over repetitions (other keys: rep 0)."""
    rows = []
    for first in reps[0]:
        key = (first["strategy"], first["straggler"])
        same = [r for rep in reps for r in rep if (r["strategy"], r["straggler"]) == key]
        rows.append(
            {
                **first,
                "samples_per_s": median(r["samples_per_s"] for r in same),
                "accuracy": median(r["accuracy"] for r in same),
                "all_samples_per_s": [r["samples_per_s"] for r in same],
                "all_accuracy": [r["accuracy"] for r in same],
            }
        )
    return rows


def contract_rows(reps: list[list[dict[str, Any]]], strategies: list[str]) -> list[dict[str, Any]]:
    """Samples/s and final accuracy of each strategy against SyncSGD in the same repetition."""
    rows = []
    for slowed in sorted({r["straggler"] for r in reps[0]}, reverse=True):
        setting = "straggler" if slowed else "no_straggler"
        for strategy in [s for s in strategies if s in CASE]:
            pairs = []
            for rep in reps:
                by = {(r["strategy"], r["straggler"]): r for r in rep}
                pairs.append((by[(LABEL[strategy], slowed)], by[("SyncSGD", slowed)]))
            speed_goal, accuracy_goal = {}, {}
            if strategy in STRAGGLER_PROOF and slowed:
                speed_goal = {"target": f">= {GOAL_SPEEDUP}"}
                accuracy_goal = {"target": f"accuracy_points >= -{GOAL_ACC_POINTS}"}
            rows.append(
                contract_row(
                    f"{CASE[strategy]}_{setting}",
                    median(x["samples_per_s"] for x, _ in pairs),
                    median(a["samples_per_s"] for _, a in pairs),
                    higher_is_better=True,
                    ratio=median(x["samples_per_s"] / a["samples_per_s"] for x, a in pairs),
                    unit="samples/s",
                    taiji_is=LABEL[strategy],
                    anchor_is="SyncSGD",
                    **speed_goal,
                )
            )
            rows.append(
                contract_row(
                    f"{CASE[strategy]}_{setting}_accuracy",
                    median(x["accuracy"] for x, _ in pairs),
                    median(a["accuracy"] for _, a in pairs),
                    higher_is_better=True,
                    ratio=median(x["accuracy"] / a["accuracy"] for x, a in pairs),
                    digits=4,
                    accuracy_points=round(median(100 * (x["accuracy"] - a["accuracy"]) for x, a in pairs), 2),
                    unit="final test accuracy",
                    taiji_is=LABEL[strategy],
                    anchor_is="SyncSGD",
                    **accuracy_goal,
                )
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15k-sample subset, 1 epoch")
    parser.add_argument("--epochs", type=int, default=None, help="epoch budget (default 2; quick 1)")
    parser.add_argument(
        "--train-subset", type=int, default=None, help="training samples (default all; quick 15000)"
    )
    parser.add_argument("--reps", type=int, default=1, help="repetitions of the jobs, order alternating")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(LABEL))
    parser.add_argument(
        "--settings",
        default="both",
        choices=list(SETTINGS),
        help="with and without the straggler (both), or only one",
    )
    parser.add_argument("--ma-alpha", type=float, default=1.0, help="ModelAveraging alpha")
    parser.add_argument("--ma-every", type=int, default=4, help="ModelAveraging: average every N steps")
    parser.add_argument(
        "--sync-every", type=int, default=0, help="PairAveraging sync point (samples; 0 = one epoch)"
    )
    parser.add_argument("--local-every", type=int, default=8, help="LocalSGD: average every H global batches")
    parser.add_argument(
        "--outer-lr", type=float, default=1.0, help="LocalSGD outer learning rate (1: plain average)"
    )
    parser.add_argument("--outer-momentum", type=float, default=0.0, help="LocalSGD outer Nesterov momentum")
    parser.add_argument(
        "--timeout", type=float, default=None, help="per job, seconds (default 900; quick 180)"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=None,
        help="before each job, wait for other benchmarks/tests to end; at most this many seconds "
        "over the whole run (default 600; quick 0)",
    )
    parser.add_argument("--out", default="runs/strategies", help="per-job directories (git-ignored runs/)")
    args = parser.parse_args(argv)
    epochs = args.epochs or (1 if args.quick else 2)
    subset = args.train_subset if args.train_subset is not None else (15000 if args.quick else 0)
    timeout = args.timeout or (180.0 if args.quick else 900.0)
    if "sync" not in args.strategies or len(set(args.strategies)) < 2:
        parser.error("SyncSGD is the anchor: keep `sync` and at least one other strategy in --strategies")
    reap_on_sigterm()
    wait_until = time.monotonic() + (
        args.wait_idle if args.wait_idle is not None else (0.0 if args.quick else 600.0)
    )
    common = [
        "--epochs",
        str(epochs),
        "--train-subset",
        str(subset),
        "--ma-alpha",
        str(args.ma_alpha),
        "--ma-every",
        str(args.ma_every),
        "--sync-every",
        str(args.sync_every),
        "--local-every",
        str(args.local_every),
        "--outer-lr",
        str(args.outer_lr),
        "--outer-momentum",
        str(args.outer_momentum),
    ]
    started = time.monotonic()
    reps, polluted = [], []
    for rep in range(args.reps):
        order = [(s, slowed) for slowed in SETTINGS[args.settings] for s in args.strategies]
        rows = []
        for strategy, slowed in interleaved(order, rep):
            name = f"{strategy}{'-straggler' if slowed else ''}"
            wait_for_idle(max(0.0, wait_until - time.monotonic()))  # the budget is shared by all jobs
            others = others_running()
            polluted += [f"{name}: {o}" for o in others]
            load = os.getloadavg()[0]
            worker = ["--strategy", strategy, "--straggler", str(STRAGGLER_RANK if slowed else -1), *common]
            row = summarise(
                strategy, slowed, run_job(name, worker, Path(args.out, f"rep{rep}", name), timeout)
            )
            row.update(rep=rep, loadavg_before=round(load, 2), others_running=len(others))
            rows.append(row)
            print(
                f"# rep {rep} {name:20s} {row['samples_per_s']:8.1f} samples/s  acc {row['accuracy']:.4f}  "
                f"wall {row['train_wall_s']:.1f}s  per-rank samples {row['per_rank_samples']}  "
                f"between-steps ms {row['between_steps_ms']}",
                file=sys.stderr,
                flush=True,
            )
        labels = [LABEL[s] for s in args.strategies]
        reps.append(sorted(rows, key=lambda r: (r["straggler"], labels.index(r["strategy"]))))
    rows = median_rows(reps) if args.reps > 1 else reps[0]
    result: dict[str, Any] = {
        "runs": rows,
        "nproc": NPROC,
        "quick": args.quick,
        "epochs": epochs,
        "train_samples": rows[0]["samples_expected"] // epochs,
        "global_batch": 128,
        "lr": 0.05,
        "momentum": 0.9,
        "model_averaging": {"alpha": args.ma_alpha, "every": args.ma_every},
        "pair_sync_every": args.sync_every or "one epoch",
        "straggler_rank": STRAGGLER_RANK,
        "local_sgd": {
            "every": args.local_every,
            "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum,
        },
        "reps": args.reps,
        "polluted_by": polluted,
        "total_s": round(time.monotonic() - started, 1),
    }
    per_rep = [ratios(rep) for rep in reps]  # each rep's jobs ran back to back: paired ratios
    result["ratios"] = {k: round(median(r[k] for r in per_rep), 3) for k in per_rep[0]}
    if args.reps > 1:
        result["ratios_per_rep"], result["ratios_of_medians"] = per_rep, ratios(rows)
    result["goal"] = {}
    for strategy in [s for s in STRAGGLER_PROOF if s in args.strategies and args.settings != "none"]:
        speedup = result["ratios"][f"{LABEL[strategy]}/SyncSGD samples/s, straggler"]
        loss = -result["ratios"][f"{LABEL[strategy]}-SyncSGD accuracy points, straggler"]
        result["goal"][LABEL[strategy]] = {
            "speedup_with_straggler": speedup,
            "target_speedup": GOAL_SPEEDUP,
            "accuracy_loss_points": loss,
            "target_max_loss_points": GOAL_ACC_POINTS,
            "met": speedup >= GOAL_SPEEDUP and loss <= GOAL_ACC_POINTS,
        }
    print_result("strategies", contract_rows(reps, args.strategies), **result)


if __name__ == "__main__":
    main()
