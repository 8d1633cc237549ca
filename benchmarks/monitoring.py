"""Cost of monitoring inside the step: GNS + gradient variance on every step vs off.

    .venv/bin/python benchmarks/monitoring.py --quick      # <= 90 s
    .venv/bin/python benchmarks/monitoring.py              # more repetitions

Runs one 2-worker `taiji run` job per model. Inside it the training loop alternates timed
blocks of K steps with the monitors on (squared norms per bucket before the allreduce and of
the reduced gradient, the GNS/variance update) and off (``job.monitors.every = 0``); the
per-step control message is sent in both, since an elastic job needs it anyway. Both models:
a compute-bound CNN and a communication-bound 6.3M-parameter MLP. ``ratio`` = median over
adjacent block pairs of time_off / time_on (target >= 0.99; KungFu's GNS costs ~4.6%), with
``ratio_quartiles`` (where the middle half of the pairs lies: how far one run can be trusted; many
short blocks, tried as 24 x 2 steps quick and 60 x 3 full, were no steadier than these defaults on
this machine). ``--nproc 4`` measures at 4 workers. ``--auto``: the on-blocks run with
``monitor_every="auto"`` (the interval chosen from the measured norm time, to keep the norms
within 1% of the step time); the row then also says the interval chosen and the norms' own
measured share of the on-blocks' time (``norm_share_pct``: what the A/B ratio cannot resolve here).
The last line is the JSON result.
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

from taiji_harness.bench import (
    contract_row,
    median,
    paired_ratio,
    print_result,
    quartiles,
    reap_on_sigterm,  # noqa: E402
    run_launcher,
)


def build(name: str):
    import torch
    from torch import nn

    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
        )
        shape, batch = (1024,), 128
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )
        shape, batch = (3, 32, 32), 64
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(4096, *shape, generator=g), torch.randint(0, 10, (4096,), generator=g)
    )
    return model, data, batch


def worker(args) -> None:
    import torch
    import torch.nn.functional as F

    import taiji

    torch.set_num_threads(1)
    torch.manual_seed(0)
    taiji.init()
    model, data, batch = build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    block = args.steps
    warmup = 2 * block
    total = warmup + 2 * args.reps * block
    job = taiji.Job(
        model,
        opt,
        data,
        batch,
        max_steps=total,
        epochs=10**6,
        monitoring=taiji.MonitorOptions(log_every=0, run_dir=""),
    )

    def monitored(i: int) -> bool:  # blocks pair up on/off, then off/on, ...
        k = (i - warmup) // block
        return i < warmup or k % 2 == (k // 2) % 2

    marks, norm_seconds, auto_every = [], 0.0, 1
    for step in job:
        if step.index >= warmup and (step.index - warmup) % block == 0:
            marks.append(time.perf_counter())
        # a step's mode is fixed when it is made: set the next one's (same on every worker, as the
        # interval "auto" chose is: it comes from agreed figures)
        if job.monitors.auto:
            auto_every = job.monitors.every
        on = monitored(step.index + 1)
        job.monitors.auto = on and args.auto
        job.monitors.every = (auto_every if args.auto else 1) if on else 0
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        if step.index >= warmup:
            norm_seconds += job.strategy.norm_seconds if monitored(step.index) else 0.0
    marks.append(time.perf_counter())
    durations = [b - a for a, b in zip(marks, marks[1:])]
    on_times, off_times = [], []
    for i, d in enumerate(durations):  # pairs alternate on/off, then off/on
        on = (i % 2) == ((i // 2) % 2)
        (on_times if on else off_times).append(d)
    if taiji.rank() == 0:
        params = sum(p.numel() for p in model.parameters())
        ratio = paired_ratio(on_times, off_times)
        pairs = [off / on for on, off in zip(on_times, off_times)]
        row = contract_row(
            f"{args.model} {params / 1e6:.1f}M params, batch {batch} on {taiji.size()} workers, ms/step",
            round(median(on_times) / block * 1e3, 3),
            round(median(off_times) / block * 1e3, 3),
            higher_is_better=False,
            ratio=ratio,
            digits=4,
            overhead_pct=round((1 / ratio - 1) * 100, 2),
            ratio_quartiles=quartiles(pairs),
            blocks=len(on_times),
            steps_per_block=block,
            gns=job.gns.b_noise,
            taiji_is="monitors auto" if args.auto else "monitors on",
            anchor_is="monitors off",
            auto_every=auto_every if args.auto else None,
            norm_share_pct=round(100 * norm_seconds / sum(on_times), 3),
        )
        print(json.dumps(row), flush=True)


def run_model(model: str, reps: int, steps: int, timeout: float, nproc: int, auto: bool = False) -> dict:
    out_dir = Path(tempfile.mkdtemp(prefix="taiji-monitoring-"))
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(nproc),
        "--run-dir",
        str(out_dir),
        "--",
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--model",
        model,
        "--reps",
        str(reps),
        "--steps",
        str(steps),
        *(["--auto"] if auto else []),
    ]
    try:
        finished = run_launcher(cmd, out_dir / "launcher.out", timeout, name=f"monitoring {model}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    for line in finished.output.splitlines():
        if line.startswith("rank 0 | {"):
            return json.loads(line.split("| ", 1)[1])
    raise RuntimeError(f"the {model} run printed no result:\n{finished.tail()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=["mlp", "cnn"])
    parser.add_argument(
        "--reps", type=int, default=None, help="on/off block pairs (default 8 quick, 20 full)"
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per block (default 5 quick, 10 full)")
    parser.add_argument("--nproc", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--auto", action="store_true", help='on-blocks use monitor_every="auto"')
    args = parser.parse_args(argv)
    args.reps = args.reps or (8 if args.quick else 20)
    args.steps = args.steps or (5 if args.quick else 10)
    if args.worker:
        worker(args)
        return
    reap_on_sigterm()
    started = time.monotonic()
    rows = [
        run_model(
            m, args.reps, args.steps, timeout=120.0 if args.quick else 600.0, nproc=args.nproc, auto=args.auto
        )
        for m in args.models
    ]
    print(f"# {time.monotonic() - started:.1f}s", file=sys.stderr)
    print_result("monitoring", rows, nproc=args.nproc, quick=args.quick, auto=args.auto)


if __name__ == "__main__":
    main()
