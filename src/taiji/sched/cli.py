"""``taiji sched``: run scheduling policies on a workload in the simulator and compare them.

    taiji sched simulate --workload pollux:6 --policy tiresias,optimus,pollux --out runs/sched
    taiji sched simulate --workload pollux:6@2.0 --policy pcrr,tiresias    # 320 jobs, reconstructed 2.0x load
    taiji sched simulate --workload synthetic --jobs 40 --cluster 4x4 --policy fifo,srtf --cost taiji
    taiji sched simulate --workload my-jobs.csv --policy pcrr --cost 2 --seed 3
    taiji sched simulate --workload synthetic --ps-fraction 0.5 --policy pcrr,optimus --estimation-error 0.1

Every policy runs on the same workload, cluster and resize cost (``--cost``: ``restart`` = 30 s per
change as in Pollux's simulator, ``taiji`` = taiji's measured in-place resize, or a number of
seconds for every change). The command prints one summary line per policy and writes, under
``--out``: ``<policy>.jobs.jsonl`` (one line per job), ``<policy>.summary.json`` (metrics, decision
times, the utilisation and allocation timelines), ``summary.json`` (all policies and the settings)
and three PNGs (:mod:`taiji.sched.plots`).

Bad input (an unknown policy, an unreadable or malformed workload, a bad ``--cluster``) ends with
one line on stderr and exit code 2; a policy that breaks the simulator's rules (e.g. oversubscribes a
host) ends with exit code 1.

Each policy runs instrumented (:func:`~taiji.sched.policyrun.run_policy`, shared with
``benchmarks/scheduler.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from taiji.errors import ConfigError, TaijiError
from taiji.sched.cluster import Cluster
from taiji.sched.costs import SYSTEMS, ResizeCost
from taiji.sched.policies import FIDELITY_MODES, make_policy
from taiji.sched.policyrun import PolicyRun, run_policy
from taiji.sched.ps import PsSettings
from taiji.sched.sim import SimConfig
from taiji.sched.workload import JobSpec, load_workload, mixed_workload, synthetic_workload

PROG = "taiji sched"
SYNTHETIC = "synthetic"


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line and exits 2 (as the ``taiji`` command does)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{PROG}: error: {message} (see `{self.prog} --help`)\n")


# -- building a run from the command line ------------------------------------------------------


def parse_cost(text: str) -> ResizeCost:
    """``restart`` / ``taiji`` (:data:`~taiji.sched.costs.SYSTEMS`), or seconds paused by every
    change, e.g. ``2``."""
    if text in SYSTEMS:
        return SYSTEMS[text]
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(f"--cost {text!r}: expected {' or '.join(SYSTEMS)} or seconds per change") from None
    if not seconds >= 0 or math.isinf(seconds):
        raise ConfigError(f"--cost {text!r}: seconds per change must be finite and >= 0")
    return uniform_cost(seconds)


def uniform_cost(seconds: float) -> ResizeCost:
    """The same pause for a start, grow, shrink or move: what a resize-cost sweep varies."""
    return ResizeCost(start=seconds, grow=seconds, shrink=seconds, move=seconds)


def parse_policies(text: str) -> list[str]:
    """Comma-separated policy names, each checked with ``make_policy`` before anything runs."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ConfigError("--policy: name at least one policy, e.g. --policy tiresias,pollux")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--policy names {', '.join(repeated)} more than once")
    for name in names:
        make_policy(name)  # ConfigError naming the known policies
    return names


def workload_from(
    spec: str, *, seed: int, jobs: int, duration_s: float, ps_fraction: float = 0.0
) -> tuple[JobSpec, ...]:
    """``synthetic`` (seeded Philly-shaped; with ``ps_fraction`` > 0 mixed with DL2's PS jobs),
    ``pollux:N[@LOAD]`` or a CSV path."""
    if spec == SYNTHETIC and ps_fraction > 0:
        return mixed_workload(seed, num_jobs=jobs, duration_s=duration_s, ps_fraction=ps_fraction)
    if spec == SYNTHETIC:
        return synthetic_workload(seed, num_jobs=jobs, duration_s=duration_s)
    return load_workload(spec)


# -- the summary table and the files -----------------------------------------------------------

COLUMNS = (  # header, width, how a run's summary shows in it
    ("policy", 10, lambda s: str(s["policy"])),
    ("done", 9, lambda s: f"{s['completed']}/{s['jobs']}"),
    ("avg JCT s", 10, lambda s: _number(s["avg_jct_s"], 0)),
    ("p99 JCT s", 10, lambda s: _number(s["p99_jct_s"], 0)),
    ("makespan h", 10, lambda s: _number(s["makespan_s"] / 3600, 2)),
    ("GPU-hours", 10, lambda s: _number(s["gpu_hours"], 1)),
    ("restarts", 8, lambda s: str(s["restarts"])),
    (
        "decision ms/round",
        17,
        lambda s: (
            f"{_number(s['decision']['mean_s'] * 1e3, 2)} (max {_number(s['decision']['max_s'] * 1e3, 1)})"
        ),
    ),
)


def _number(value: float, digits: int) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def summary_table(summaries: Sequence[Mapping[str, object]]) -> str:
    lines = ["  ".join(f"{title:>{width}}" for title, width, _ in COLUMNS)]
    lines += ["  ".join(f"{show(summary):>{width}}" for _, width, show in COLUMNS) for summary in summaries]
    return "\n".join(lines)


def outcome_notes(runs: Sequence[PolicyRun], shown: int = 5) -> list[str]:
    """Lines on the jobs that did not complete: rejections (the same under every policy, since
    they depend on the cluster alone) once, unfinished jobs per policy."""

    def names(jobs: Sequence[str]) -> str:
        return ", ".join(jobs[:shown]) + (f", ... ({len(jobs) - shown} more)" if len(jobs) > shown else "")

    notes = []
    rejected = [r.name for r in runs[0].result.records if r.status == "rejected"] if runs else []
    if rejected:
        notes.append(f"{len(rejected)} job(s) rejected, larger than the cluster: {names(rejected)}")
    for run in runs:
        unfinished = [r.name for r in run.result.records if r.status == "unfinished"]
        if unfinished:
            notes.append(
                f"{run.name}: {len(unfinished)} job(s) unfinished (time limit or never "
                f"scheduled): {names(unfinished)}"
            )
    return notes


def write_outputs(out: Path, runs: Sequence[PolicyRun], settings: Mapping[str, object]) -> list[Path]:
    """Per policy its jobs (JSONL) and its summary with timelines (JSON); one summary.json of all."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for run in runs:
        jobs_path = out / f"{run.name}.jobs.jsonl"
        run.result.write_jsonl(jobs_path)
        summary_path = out / f"{run.name}.summary.json"
        summary_path.write_text(
            json.dumps(
                {
                    "settings": settings,
                    "summary": run.summary(),
                    "utilization": [list(point) for point in run.result.utilization],
                    "allocations": {
                        job: [list(step) for step in steps] for job, steps in run.allocations.items()
                    },
                },
                default=_json_default,
            )
            + "\n"
        )
        written += [jobs_path, summary_path]
    total = out / "summary.json"
    total.write_text(
        json.dumps(
            {"settings": settings, "policies": [run.summary() for run in runs]},
            default=_json_default,
            indent=1,
        )
        + "\n"
    )
    return written + [total]


def _json_default(value: object) -> object:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON-serialisable: {value!r}")


def draw_plots(out: Path, runs: Sequence[PolicyRun], cluster: Cluster, allocation_policy: str) -> list[Path]:
    from taiji.sched import plots  # matplotlib is an optional extra (taiji[plot])

    chosen = next(run for run in runs if run.name == allocation_policy)
    return [
        plots.plot_jct_cdf(
            {run.name: [r.jct for r in run.result.records if r.jct is not None] for run in runs},
            out / "jct_cdf.png",
        ),
        plots.plot_utilization(
            {run.name: run.result.utilization for run in runs}, cluster.total_gpus, out / "utilization.png"
        ),
        plots.plot_allocations(
            chosen.allocations,
            {r.name: (r.submit_time, r.end_time) for r in chosen.result.records if r.status != "rejected"},
            out / f"allocations-{chosen.name}.png",
            chosen.name,
        ),
    ]


# -- the command -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Cluster scheduling: simulate policies on workloads (the live "
        "scheduler: taiji sched serve|submit|status|cancel|stop|plot).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    simulate_cmd = sub.add_parser(
        "simulate",
        help="run policies on a workload in the simulator; table, JSON(L) and PNGs",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate_cmd.add_argument(
        "--workload",
        required=True,
        metavar="FILE|pollux:N[@LOAD]|synthetic",
        help="a Pollux-format CSV (name,time,application,num_replicas,batch_size), "
        "a shipped Pollux workload pollux:1..8 (the 1.0x load), pollux:N@LOAD for "
        "workload N at relative job load LOAD (e.g. pollux:6@2.0 = 320 jobs in 8 h; "
        "loads other than 1.0 are reconstructed as seeded synthetic workloads, not "
        "Pollux's files), or a seeded synthetic one",
    )
    simulate_cmd.add_argument(
        "--policy",
        required=True,
        metavar="NAME[,NAME...]",
        help="policies to compare, e.g. pcrr,tiresias,optimus,pollux,fifo,drf,srtf",
    )
    simulate_cmd.add_argument(
        "--cluster",
        default="16x4",
        metavar="HOSTSxGPUS",
        help="identical hosts × GPUs per host (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the synthetic workload and randomized policies (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--cost",
        default="restart",
        metavar="restart|taiji|SECONDS",
        help="pause per allocation change: restart (30 s), taiji (measured ~0.03 s), "
        "or seconds (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--out",
        default="runs/sched",
        metavar="DIR",
        help="where the JSON(L) files and PNGs go (default: %(default)s)",
    )
    simulate_cmd.add_argument("--quiet", action="store_true", help="no progress bars, no list of files")
    simulate_cmd.add_argument(
        "--verbose",
        action="store_true",
        help="log the simulator's warnings as they happen (each rejected job, time limits)",
    )
    simulate_cmd.add_argument(
        "--jobs", type=int, default=160, help="synthetic: number of jobs (default: %(default)s)"
    )
    simulate_cmd.add_argument(
        "--duration-h",
        type=float,
        default=8.0,
        help="synthetic: hours over which jobs arrive (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--fidelity",
        default="taiji",
        choices=FIDELITY_MODES,
        help="pollux: tiresias and optimus place jobs and rank GPUs as Pollux's simulator "
        "does, as the check against its published per-job results runs them "
        "(default: %(default)s, taiji's own choices)",
    )
    simulate_cmd.add_argument(
        "--interval",
        type=float,
        default=60.0,
        help="seconds between scheduling rounds (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--events", action="store_true", help="also schedule right after every arrival and completion"
    )
    simulate_cmd.add_argument(
        "--interference",
        type=float,
        default=0.0,
        help="slowdown of distributed jobs sharing a host, e.g. 0.25 (default: 0)",
    )
    simulate_cmd.add_argument(
        "--estimation-error",
        type=float,
        default=0.0,
        metavar="E",
        help="policies see every job's speeds × a seeded per-job factor in [1-E, 1+E], "
        "e.g. 0.1; progress uses the true speeds (default: 0)",
    )
    simulate_cmd.add_argument(
        "--ps-model",
        default="paper",
        choices=("paper", "dl2"),
        help="speed model of parameter-server jobs (default: %(default)s)",
    )
    simulate_cmd.add_argument(
        "--ps-fraction",
        type=float,
        default=0.0,
        help="synthetic: share of parameter-server jobs (DL2 models), 0..1 (default: 0)",
    )
    simulate_cmd.add_argument(
        "--max-hours",
        type=float,
        default=SimConfig.max_time_s / 3600,
        help="stop simulating after this many hours (default: %(default)g)",
    )
    simulate_cmd.add_argument(
        "--plot-policy",
        default=None,
        metavar="NAME",
        help="whose per-job allocations to draw (default: pcrr if run, else the first)",
    )
    simulate_cmd.add_argument("--no-plots", action="store_true", help="write no PNGs")
    return parser


def simulate_command(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policy)
    cluster = Cluster.parse(args.cluster)
    resize = parse_cost(args.cost)
    config = SimConfig(
        cluster=cluster,
        interval_s=args.interval,
        resize=resize,
        reschedule_on_events=args.events,
        interference=args.interference,
        max_time_s=args.max_hours * 3600,
        ps=PsSettings(model=args.ps_model),
        estimation_error=args.estimation_error,
        error_seed=args.seed,
    )
    plot_policy = args.plot_policy or ("pcrr" if "pcrr" in policies else policies[0])
    if plot_policy not in policies:
        raise ConfigError(f"--plot-policy {plot_policy!r} is not among --policy {','.join(policies)}")
    specs = workload_from(
        args.workload,
        seed=args.seed,
        jobs=args.jobs,
        duration_s=args.duration_h * 3600,
        ps_fraction=args.ps_fraction,
    )
    out = Path(args.out)
    try:  # before simulating: an unwritable --out must not cost a whole run
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create ({exc})") from exc
    settings = {
        "workload": args.workload,
        "jobs": len(specs),
        "cluster": args.cluster,
        "seed": args.seed,
        "cost": args.cost,
        "resize": resize,
        "interval_s": args.interval,
        "events": args.events,
        "interference": args.interference,
        "estimation_error": args.estimation_error,
        "ps_model": args.ps_model,
        "ps_fraction": args.ps_fraction,
        "fidelity": args.fidelity,
    }
    print(
        f"{len(specs)} jobs from {args.workload} on {cluster.num_hosts}x{cluster.gpus_per_host} GPUs, "
        f"resize cost {args.cost}, seed {args.seed}",
        flush=True,
    )
    # the warnings would tear through the progress bars; their gist is summarised below the table
    sched_logger = logging.getLogger("taiji.sched")
    level = sched_logger.level
    sched_logger.setLevel(logging.WARNING if args.verbose else logging.ERROR)
    try:
        runs = [
            run_policy(specs, name, config, seed=args.seed, progress=not args.quiet, fidelity=args.fidelity)
            for name in policies
        ]
    finally:  # in-process callers (tests, notebooks) keep their logging as it was
        sched_logger.setLevel(level)
    print(summary_table([run.summary() for run in runs]), flush=True)
    for note in outcome_notes(runs):
        print(note)
    try:
        written = write_outputs(out, runs, settings)
        if not args.no_plots:
            written += draw_plots(out, runs, cluster, plot_policy)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write ({exc})") from exc
    except ImportError as exc:  # no matplotlib: the numbers are written, only the pictures are missing
        sys.stderr.write(f"{PROG}: no plots ({exc}); install taiji[plot] for them\n")
    if not args.quiet:
        print(f"wrote {len(written)} files to {out}: {', '.join(path.name for path in written)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return simulate_command(args)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except TaijiError as exc:  # e.g. PolicyError: a policy broke the simulator's rules
        sys.stderr.write(f"{PROG}: error: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
