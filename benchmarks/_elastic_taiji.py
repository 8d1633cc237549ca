"""The taiji side of ``benchmarks/elastic.py``: one ``taiji run`` job per measurement, whose
membership changes happen inside the running worker processes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from taiji_harness.elastic_analysis import (
    exactly_once_figures,
    join_figures,
    kill_figures,
    samples_per_s,
    taiji_change_figures,
    taiji_fault_figures,
)
from taiji_harness.elastic_runs import LaunchedJob, StepLog, joiner_steps, train_args, wait_for


def taiji_cmd(
    args: argparse.Namespace, out: Path, nproc: int, timeout: float, job_id: str, *launcher: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(nproc),
        "--timeout",
        str(timeout),
        "--job-id",
        job_id,
        "--run-dir",
        str(out / "run"),
        *launcher,
        "--",
        *train_args(args, out),
    ]


def job_store(home: Path, job_id: str):
    """The job's store, found through the job registry under ``home`` (what ``taiji resize`` does)."""
    from taiji.cluster.auth import Signer, read_secret_file
    from taiji.cluster.store import JobStore, connect_store

    info = json.loads((home / "jobs" / f"{job_id}.json").read_text())
    secret = read_secret_file(str(home / "jobs" / f"{job_id}.secret"))  # proposals are signed records
    return JobStore(connect_store(info["host"], int(info["port"]), timeout=10.0), job_id, Signer(secret))


def finish(job: LaunchedJob, out: Path, deadline: float) -> int:
    (out / "stop").touch()  # rank 0 asks the Job to stop; every worker stops at the same step
    try:
        return job.session.wait(deadline - time.monotonic())
    except subprocess.TimeoutExpired:
        raise TimeoutError(
            f"{job.name} did not finish after the stop request:\n{job.session.tail()}"
        ) from None


def taiji_resize(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """One job: 1 worker, grow to 2, grow to 4, shrink to 2."""
    job_id = f"bench{os.getpid()}{out.name}"
    home = out / "home"
    log = StepLog(out, "taiji")
    deadline = time.monotonic() + args.timeout
    job = LaunchedJob(
        "taiji-resize",
        taiji_cmd(args, out, 1, args.collective_timeout, job_id, "--max-np", "4"),
        out,
        dict(env, TAIJI_HOME=str(home)),
        log,
    )
    try:

        def w0() -> list[dict]:
            return log.select("commit", worker="w0")

        wait_for(lambda: len(w0()) >= args.warm, log, [job], deadline, "warm-up steps")
        store = job_store(home, job_id)
        changes, version = [], w0()[-1]["version"]
        for size in (2, 4, 2):
            requested = time.time()
            store.propose(size, "benchmark")

            def landed(size: int = size, version: int = version) -> int | None:
                at = [c for c in w0() if c["version"] > version and c["size"] == size]
                return at[0]["version"] if len(at) >= args.settle else None

            new = wait_for(landed, log, [job], deadline, f"{args.settle} steps at size {size}")
            changes.append({"to_version": new, "to_size": size, "requested": requested})
            version = new
        code = finish(job, out, deadline)
        log.poll()
        return {
            "changes": [taiji_change_figures(log.records, c, args.settle) for c in changes],
            "exit_code": code,
        }
    finally:
        job.close()


def taiji_fault(args: argparse.Namespace, out: Path, env: dict, nproc: int, action: str) -> dict:
    """``nproc`` workers; SIGKILL (crash) or SIGSTOP (hang) w1; time until a survivor commits
    a step in the next cluster version."""
    timeout = args.hang_timeout if action == "hang" else args.collective_timeout
    job_id = f"bench{os.getpid()}{out.name}"
    log = StepLog(out, "taiji")
    deadline = time.monotonic() + args.timeout + timeout
    job = LaunchedJob(
        f"taiji-{action}",
        taiji_cmd(args, out, nproc, timeout, job_id),
        out,
        dict(env, TAIJI_HOME=str(out / "home")),
        log,
    )
    try:

        def warm() -> bool:
            return all(len(log.select("commit", worker=f"w{r}")) >= args.warm for r in range(nproc))

        wait_for(warm, log, [job], deadline, "warm-up steps")
        victim_pid = log.select("boot", worker="w1")[0]["pid"]
        hit = time.time()
        job.signal_worker(victim_pid, signal.SIGSTOP if action == "hang" else signal.SIGKILL)

        def resumed() -> bool:
            return len([c for c in log.select("commit", worker="w0") if c["version"] > 1]) >= args.settle

        wait_for(resumed, log, [job], deadline, "steps after the failure")
        code = finish(job, out, deadline)
        log.poll()
        survivors = [f"w{r}" for r in range(nproc) if r != 1]
        return {**taiji_fault_figures(log.records, hit, survivors), "exit_code": code}
    finally:
        job.close()  # the stopped victim too: it is one of the step logs' pids


def taiji_kill_join(
    args: argparse.Namespace, out: Path, env: dict, kill_at_commit: int | None = None
) -> dict:
    """The case run beside torchft: 2 workers (steady-state samples/s), SIGKILL w1 (the survivor
    retries the step alone), then ask for 2 workers again (a new worker joins); every step's
    samples logged for the exactly-once figures. ``kill_at_commit``: instead of a SIGKILL from
    outside at a random moment, w1 kills itself at that step's fault phase ``commit`` (after the
    step's last collective, before its own commit: w0 commits the step with w1's share in it);
    the kill's time is then w1's last draw."""
    job_id = f"bench{os.getpid()}{out.name}"
    home = out / "home"
    log = StepLog(out, "taiji")
    deadline = time.monotonic() + 2 * args.timeout
    cmd = taiji_cmd(args, out, 2, args.collective_timeout, job_id, "--max-np", "2")
    if kill_at_commit is not None:
        if kill_at_commit <= args.steady:
            raise ValueError(
                f"kill_at_commit {kill_at_commit} must come after the {args.steady} steady steps"
            )
        env = dict(
            env,
            TAIJI_FAULTS=json.dumps(
                [{"action": "kill", "worker": "w1", "step": kill_at_commit, "phase": "commit"}]
            ),
        )
    job = LaunchedJob("taiji-kill-join", [*cmd, "--log-samples"], out, dict(env, TAIJI_HOME=str(home)), log)
    try:

        def w0() -> list[dict]:
            return log.select("commit", worker="w0")

        wait_for(
            lambda: len(w0()) >= args.steady and log.select("commit", worker="w1"),
            log,
            [job],
            deadline,
            "steady steps at 2 workers",
        )
        steady = samples_per_s(w0(), args.batch)
        if kill_at_commit is None:
            victim = log.select("boot", worker="w1")[0]["pid"]
            hit = time.time()
            job.signal_worker(victim, signal.SIGKILL)
        else:
            wait_for(
                lambda: any(c["size"] == 1 for c in w0()), log, [job], deadline, "a step after w1's kill"
            )
            hit = log.select("draw", worker="w1")[-1]["time"]
        wait_for(
            lambda: len([c for c in w0() if c["time"] > hit]) >= args.settle,
            log,
            [job],
            deadline,
            "steps after the kill",
        )
        requested = time.time()
        job_store(home, job_id).propose(2, "benchmark")

        need = joiner_steps(args.settle, len(log.select("commit", worker="w1")))

        def joined() -> bool:
            return len([c for c in log.select("commit") if c["worker"] not in ("w0", "w1")]) >= need

        wait_for(joined, log, [job], deadline, f"{need} steps of the joiner")
        code = finish(job, out, deadline)
        log.poll()
        return {
            "samples_per_s": steady,
            "kill": kill_figures(log.records, hit, {"w0"}),
            "join": join_figures(log.records, requested, {"w0"}, 2, args.settle),
            "exactly_once": exactly_once_figures(log.records, {"w1"}),
            "exit_code": code,
        }
    finally:
        job.close()
