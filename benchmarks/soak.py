"""Randomized elastic fault soak: random resize/fault schedules, every invariant audited.

    .venv/bin/python benchmarks/soak.py --runs 3 --seed 1        # a short soak (CI runs --runs 2)
    .venv/bin/python benchmarks/soak.py --runs 1000 --seed 7     # a long one
    .venv/bin/python benchmarks/soak.py --replay '<schedule JSON>' # one schedule again

Each run starts `taiji run` on tests/scripts/elastic_train.py with a random initial size,
a random chain of resizes and up to two random faults (kill or hang a rank >= 1 at a random
step and phase; a hang is a SIGSTOP, found by the heartbeat; sometimes with --replace), and in a
quarter of the runs one rank busy in user code (an evaluation) for longer than the collective
timeout, which must be waited for, not killed. In a third of the runs the whole job is lost (the
launcher and every worker SIGKILLed at once at a random step; the job checkpoints every few
steps) and resumed with ``--resume auto`` at a random size to the end: the steps after its last
checkpoint are trained again and the audit reads the two runs merged at that checkpoint. After
the run, the per-step logs are audited
(docs/design.md#invariants): replicas bitwise identical after every committed step, every sample of an epoch
consumed exactly once, final parameters equal to an uninterrupted 1-worker run, the job
ended (no hang) and no process of the run is left (no orphan). The last line is the result
line of docs/design.md#performance-targets: one row per invariant, ``taiji`` = violations counted over all
runs (target 0; there is no anchor), plus the totals and the schedule of every run that broke an invariant.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from taiji.checkpoint.storage import Storage
from taiji_harness.bench import (
    Session,
    contract_row,
    print_result,
    processes_mentioning,
    reap_on_sigterm,
    run_to_end,
    signal_if_ours,
)
from taiji_harness.testing import committed_steps, kill_job, load_script, merge_runs, wait_for

REPO = Path(__file__).resolve().parents[1]
BATCH = 16
COLLECTIVE_TIMEOUT = 2.0
CHECKPOINT_EVERY = 7  # steps, in runs with a whole-job kill


def random_schedule(rng: random.Random, max_np: int = 4) -> dict:
    """A schedule as plain data, so a failing run can be replayed exactly."""
    faults = []
    for _ in range(rng.choice([0, 1, 1, 2])):
        faults.append(
            {
                "action": rng.choice(["kill", "kill", "kill", "hang"]),
                "rank": rng.randint(1, max_np - 1),
                "step": rng.randint(3, 40),
                "phase": rng.choice(["compute", "allreduce", "allreduce", "sync"]),
            }
        )
    schedule = {
        "np": rng.randint(1, 3),
        "max_np": max_np,
        "replace": rng.random() < 0.3,
        "sizes": [rng.randint(1, max_np) for _ in range(rng.randint(1, 3))],
        "every": rng.randint(3, 12),
        "steps": 400,
        "faults": faults,
    }
    if rng.random() < 0.25:  # a rank busy in user code for longer than the collective timeout
        schedule["pause"] = [rng.randint(0, max_np - 1), rng.randint(3, 60), round(rng.uniform(2.5, 5.0), 1)]
    if rng.random() < 1 / 3:  # the whole job lost after this many committed steps, resumed at this size
        schedule["whole_kill"] = {"after": rng.randint(5, 300), "np": rng.randint(1, 3)}
    return schedule


def launcher_args(schedule: dict, out: Path, np: int, *extra: str) -> list[str]:
    return (
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "run",
            "-np",
            str(np),
            "--max-np",
            str(schedule["max_np"]),
            "--timeout",
            str(COLLECTIVE_TIMEOUT),
            "--join-timeout",
            "60",
            "--max-failures",
            "10",
            *extra,
        ]
        + (["--replace"] if schedule["replace"] else [])
        + [
            "--",
            sys.executable,
            str(REPO / "tests" / "scripts" / "elastic_train.py"),
            str(out),
            "--batch",
            str(BATCH),
            "--steps",
            str(schedule["steps"]),
            "--step-delay",
            "0.005",
            "--every",
            str(schedule["every"]),
            "--sizes",
            *map(str, schedule["sizes"]),
        ]
        + (["--pause", *map(str, schedule["pause"])] if schedule.get("pause") else [])
    )


def lose_whole_job(schedule: dict, out: Path, env: dict, timeout: float) -> tuple[int, bool]:
    """Run until ``whole_kill.after`` committed steps, then SIGKILL the launcher and every worker
    at once. Returns (the step of the last complete checkpoint, 0 if none; whether it hung)."""
    lost = out / "lost"
    lost.mkdir()
    args = launcher_args(
        schedule,
        lost,
        schedule["np"],
        "--checkpoint-dir",
        str(out / "ck"),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--run-dir",
        str(out / "run"),
    )
    with Session(args, env=env, cwd=REPO, name="soak run (lost)") as session:
        try:
            wait_for(
                lambda: committed_steps(lost) >= schedule["whole_kill"]["after"] or not session.running(),
                timeout,
                "the steps before the whole-job kill",
            )
            hung = False
        except AssertionError:
            hung = True
        kill_job(session.pid)
    return Storage(str(out / "ck")).listing().latest or 0, hung


def run_one(schedule: dict, timeout: float) -> dict:
    out = Path(tempfile.mkdtemp(prefix="taiji-soak-"))
    env = dict(
        os.environ,
        TAIJI_FAULTS=json.dumps(schedule["faults"]),
        TAIJI_HOME=str(out / "home"),
        PYTHONUNBUFFERED="1",
    )
    kill = schedule.get("whole_kill")
    checkpoint, hung_before = lose_whole_job(schedule, out, env, timeout) if kill else (0, False)
    resume = (
        [
            "--checkpoint-dir",
            str(out / "ck"),
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--resume",
            "auto",
            "--run-dir",
            str(out / "run"),
        ]
        if kill
        else []
    )
    run = out / "resumed" if kill else out
    run.mkdir(exist_ok=True)
    finished = run_to_end(
        launcher_args(schedule, run, kill["np"] if kill else schedule["np"], *resume),
        timeout,
        name="soak run",
        env=env,
        cwd=REPO,
    )
    # the launcher reaped its workers before exiting; anything still alive is an orphan
    orphans = processes_mentioning(str(out))
    for pid in orphans:
        signal_if_ours(pid, signal.SIGKILL, str(out))
    hung = hung_before or finished.timed_out
    audit = {}
    if not hung:
        if kill:  # what counts: the lost run's steps before the checkpoint, the resumed run's from it
            merge_runs([(out / "lost", 0, checkpoint), (run, checkpoint, schedule["steps"])], out / "merged")
        audit = load_script("elastic_train").audit(out / "merged" if kill else out, BATCH)
    shutil.rmtree(out, ignore_errors=True)
    trajectory_ok = audit.get("trajectory_error") is not None and audit["trajectory_error"] < 1e-9
    return {
        "returncode": finished.returncode,
        "hung": hung,
        "orphans": len(orphans),
        "seconds": finished.seconds,
        "audit": audit,
        "trajectory_ok": trajectory_ok,
        "resumed_at": checkpoint,
        "tail": finished.output.splitlines()[-15:],
    }


INVARIANTS = {
    "failed_runs": "runs that broke an invariant",
    "divergences": "steps after which replicas differed",
    "lost_samples": "samples lost",
    "duplicated_samples": "samples trained twice in an epoch",
    "hangs": "runs that hung",
    "orphans": "processes left behind",
    "trajectory_mismatches": "runs whose final parameters differ from a 1-worker run",
}


def invariant_rows(totals: dict) -> list[dict]:
    """One row per invariant: violations over all runs. No anchor: nothing to compare with."""
    return [
        contract_row(
            f"{label} ({totals['runs']} runs, {totals['steps']} steps)",
            totals[key],
            None,
            higher_is_better=False,
            target=0,
            target_met=totals[key] == 0,
        )
        for key, label in INVARIANTS.items()
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 runs")
    parser.add_argument("--replay", default="", help="a schedule (JSON) printed by a failed run")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds one run may take (a hang beyond)"
    )
    args = parser.parse_args(argv)
    reap_on_sigterm()
    rng = random.Random(args.seed)
    schedules = (
        [json.loads(args.replay)]
        if args.replay
        else [random_schedule(rng) for _ in range(2 if args.quick else args.runs)]
    )
    totals = {
        "runs": 0,
        "whole_job_kills": 0,
        "failed_runs": 0,
        "divergences": 0,
        "lost_samples": 0,
        "duplicated_samples": 0,
        "hangs": 0,
        "orphans": 0,
        "trajectory_mismatches": 0,
        "steps": 0,
    }
    broken = []
    for i, schedule in enumerate(schedules):
        result = run_one(schedule, args.timeout)
        audit = result["audit"]
        totals["runs"] += 1
        totals["whole_job_kills"] += int("whole_kill" in schedule)
        totals["hangs"] += int(result["hung"])
        totals["orphans"] += result["orphans"]
        totals["divergences"] += len(audit.get("divergences", []))
        totals["lost_samples"] += audit.get("lost_samples", 0)
        totals["duplicated_samples"] += audit.get("duplicated_samples", 0)
        totals["steps"] += audit.get("steps", 0)
        mismatch = not result["hung"] and not result["trajectory_ok"]
        totals["trajectory_mismatches"] += int(mismatch)
        bad = (
            result["returncode"] != 0
            or result["hung"]
            or result["orphans"]
            or mismatch
            or audit.get("divergences")
            or audit.get("lost_samples")
            or audit.get("duplicated_samples")
        )
        if bad:
            totals["failed_runs"] += 1
            broken.append(
                {
                    "schedule": schedule,
                    "returncode": result["returncode"],
                    "audit": audit,
                    "tail": result["tail"],
                }
            )
        resumed = (
            ", whole job killed, resumed at step " + str(result["resumed_at"])
            if schedule.get("whole_kill")
            else ""
        )
        print(
            f"run {i + 1}/{len(schedules)}: {'BROKEN' if bad else 'ok'} in {result['seconds']:.1f}s, "
            f"sizes {audit.get('sizes')}, {audit.get('steps')} steps, faults {schedule['faults']}"
            f"{', pause ' + str(schedule['pause']) if schedule.get('pause') else ''}"
            f"{resumed}",
            flush=True,
        )
    print_result("soak", invariant_rows(totals), seed=args.seed, **totals, broken=broken)


if __name__ == "__main__":
    main()
