"""The torchrun side of ``benchmarks/elastic.py`` (the anchor): plain DDP that checkpoints after
every step and resumes from the checkpoint when it starts, so a membership change is a restart."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from taiji_harness.bench import free_port
from taiji_harness.elastic_analysis import samples_per_s, torchrun_change_figures, torchrun_fault_figures
from taiji_harness.elastic_runs import LaunchedJob, StepLog, torchrun_cmd, wait_for

STOP_GRACE_S = 20.0  # SIGTERM to torchrun, then SIGKILL to its session after this long


def torchrun_resize(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """The restart path: run at 1, 2, 4, 2 workers in turn, each resuming from the checkpoint."""
    checkpoint = out / "ckpt.pt"
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + 3 * args.timeout
    jobs: list[LaunchedJob] = []
    changes: list[dict] = []
    try:
        for i, size in enumerate((1, 2, 4, 2)):
            change: dict = {"to_size": size, "tag": str(i)}
            if jobs:
                change["requested"] = time.time()
                jobs[-1].session.terminate(STOP_GRACE_S)
                change["stopped"] = time.time()
            broadcast = ["--measure-broadcast", "5"] if size > 1 else []
            cmd = torchrun_cmd(
                args,
                out,
                size,
                ["--standalone", "--max-restarts", "0"],
                "--checkpoint",
                str(checkpoint),
                "--tag",
                str(i),
                "--timeout",
                str(args.collective_timeout),
                *broadcast,
            )
            jobs.append(LaunchedJob(f"torchrun-resize-{i}", cmd, out, env, log))
            change["agent_started"] = jobs[-1].started
            need = args.warm if i == 0 else args.settle

            def ready(tag: str = str(i), need: int = need, size: int = size) -> bool:
                return len(log.select("commit", tag=tag, rank=0)) >= need and (
                    size == 1 or bool(log.select("broadcast", tag=tag))
                )

            wait_for(ready, log, [jobs[-1]], deadline, f"{need} steps at size {size}")
            changes.append(change)
        jobs[-1].session.terminate(STOP_GRACE_S)
        log.poll()
        return {"changes": [torchrun_change_figures(log.records, c, args.settle) for c in changes[1:]]}
    finally:
        for job in jobs:
            job.close()


def torchrun_fault(args: argparse.Namespace, out: Path, env: dict, action: str) -> dict:
    """2 workers, ``--max-restarts 1``; SIGKILL (crash) or SIGSTOP (hang) rank 1; time until
    the restarted group commits a step."""
    timeout = args.hang_timeout if action == "hang" else args.collective_timeout
    log = StepLog(out, "torchrun")
    # a hang also waits for torchrun's --shutdown-timeout (30 s) before the stopped worker dies
    deadline = time.monotonic() + args.timeout + timeout + (35.0 if action == "hang" else 0.0)
    cmd = torchrun_cmd(
        args,
        out,
        2,
        ["--standalone", "--max-restarts", "1"],
        "--checkpoint",
        str(out / "ckpt.pt"),
        "--timeout",
        str(timeout),
    )
    job = LaunchedJob(f"torchrun-{action}", cmd, out, env, log)
    try:

        def warm() -> bool:
            return len(log.select("commit", restart=0, rank=0)) >= args.warm and bool(
                log.select("boot", restart=0, rank=1)
            )

        wait_for(warm, log, [job], deadline, "warm-up steps")
        victim_pid = log.select("boot", restart=0, rank=1)[0]["pid"]
        hit = time.time()
        job.signal_worker(victim_pid, signal.SIGSTOP if action == "hang" else signal.SIGKILL)
        wait_for(
            lambda: len(log.select("commit", restart=1, rank=0)) >= args.settle,
            log,
            [job],
            deadline,
            "steps after the restart",
        )
        job.session.terminate(STOP_GRACE_S)
        log.poll()
        return torchrun_fault_figures(log.records, hit)
    finally:
        job.close()  # the stopped victim too: it is one of the step logs' pids


def torchrun_steady(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """Plain DDP on 2 workers, no checkpoint: the steady-state samples/s of the anchor."""
    log = StepLog(out, "torchrun")
    job = LaunchedJob(
        "torchrun-steady",
        torchrun_cmd(
            args, out, 2, ["--standalone", "--max-restarts", "0"], "--timeout", str(args.collective_timeout)
        ),
        out,
        env,
        log,
    )
    try:
        wait_for(
            lambda: len(log.select("commit", rank=0)) >= args.steady,
            log,
            [job],
            time.monotonic() + args.timeout,
            f"{args.steady} steps",
        )
        return {"samples_per_s": samples_per_s(log.select("commit", rank=0), args.batch)}
    finally:
        job.close()


def torchrun_elastic(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """torchrun's own scale-up: agent A (--nnodes 1:2) trains alone; agent B joins through the
    c10d rendezvous. Reports what happened within ``--elastic-wait`` seconds."""
    log = StepLog(out, "torchrun")
    options = [
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "bench",
        "--rdzv-conf",
        "last_call_timeout=1",
        "--max-restarts",
        "3",
    ]
    cmd = torchrun_cmd(
        args, out, 1, options, "--checkpoint", str(out / "ckpt.pt"), "--timeout", str(args.collective_timeout)
    )
    env = dict(env, LOGLEVEL="INFO")
    deadline = time.monotonic() + args.timeout
    jobs = [LaunchedJob("torchrun-elastic-A", cmd, out, env, log)]
    try:
        wait_for(lambda: len(log.select("commit", size=1)) >= args.warm, log, jobs, deadline, "warm-up steps")
        requested = time.time()
        jobs.append(LaunchedJob("torchrun-elastic-B", cmd, out, env, log))
        result: dict = {
            "config": "two agents, --nnodes 1:2 --nproc-per-node 1, c10d rendezvous on 127.0.0.1, "
            "last_call_timeout=1, --max-restarts 3",
            "waited_s": args.elastic_wait,
        }
        try:
            wait_for(
                lambda: log.select("commit", size=2),
                log,
                jobs,
                time.monotonic() + args.elastic_wait,
                "step at size 2",
            )
            first = log.select("commit", size=2)[0]["time"]
            result.update(
                outcome="scaled up",
                request_to_first_step_s=first - requested,
                stall_s=first - max(c["time"] for c in log.select("commit", size=1)),
            )
        except (TimeoutError, RuntimeError) as exc:
            last = max(c["time"] for c in log.select("commit", size=1))
            texts = {job.name: job.session.text() for job in jobs}
            result.update(
                outcome="no step at size 2" + (" (an agent exited)" if isinstance(exc, RuntimeError) else ""),
                agent_a_detected_new_node="Detected 1 new nodes" in texts[jobs[0].name],
                training_stopped_after_s=round(last - requested, 3),
                errors={
                    name: [ln.strip()[-220:] for ln in text.splitlines() if "Error" in ln][-2:]
                    for name, text in texts.items()
                },
            )
        return result
    finally:
        for job in jobs:
            job.close()
