"""The torchft side of ``benchmarks/elastic.py`` (the modern fault-tolerance anchor): a lighthouse
and two replica groups of one worker each, every group under torchrun of its own, as torchft's
README runs them; the training script's torchft path is configured as torchft's ``train_ddp.py``.

torchft is optional (``pip install -e '.[bench]'``): without it ``torchft_missing()`` says how
to install it and the torchft rows say "not installed"."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import signal
import sys
import time
from pathlib import Path

from taiji_harness.bench import free_port
from taiji_harness.elastic_analysis import (
    exactly_once_figures,
    join_figures,
    kill_figures,
    samples_per_s,
    worker_error,
)
from taiji_harness.elastic_runs import LaunchedJob, StepLog, joiner_steps, torchrun_cmd, wait_for

INSTALL_HINT = (
    "pip install -e '.[bench]' (torchft-nightly; with the torchft 0.2.0 release the survivor of a kill "
    "dies: see benchmarks/README.md)"
)
# the lighthouse as torchft's README starts it; bound to loopback
LIGHTHOUSE_OPTIONS = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000")
STOP_GRACE_S = 5.0


def torchft_version() -> str | None:
    """The installed torchft distribution and version (``torchft 0.2.0``), or None."""
    for dist in ("torchft-nightly", "torchft"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def torchft_missing() -> str | None:
    """Why the torchft side cannot run (with how to install it), or None when it can."""
    if importlib.util.find_spec("torchft") is None:
        return f"not installed: {INSTALL_HINT}"
    if not lighthouse_binary().exists():
        return f"not installed: no torchft_lighthouse next to {sys.executable}; {INSTALL_HINT}"
    return None


def lighthouse_binary() -> Path:
    return Path(sys.executable).parent / "torchft_lighthouse"


def torchft_kill_join(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """Lighthouse + replica groups 0 and 1 (steady-state samples/s); SIGKILL group 1's worker;
    then start group 1 again (it heals from group 0). Every phase that torchft could not complete
    is reported with the error that stopped it; figures of the phases before it stay."""
    port = free_port()
    log = StepLog(out, "torchft")
    deadline = time.monotonic() + 2 * args.timeout
    genv = dict(env, NUM_REPLICA_GROUPS="2", TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
    lighthouse = LaunchedJob(
        "torchft-lighthouse",
        [str(lighthouse_binary()), *LIGHTHOUSE_OPTIONS, "--bind", f"127.0.0.1:{port}"],
        out,
        env,
        log,
    )
    jobs: list[LaunchedJob] = []

    def group(replica: int, tag: str) -> LaunchedJob:
        cmd = torchrun_cmd(
            args, out, 1, ["--standalone", "--max-restarts", "0"], "--log-samples", "--tag", tag
        )
        jobs.append(
            LaunchedJob(
                f"torchft-group{replica}-{tag}", cmd, out, dict(genv, REPLICA_GROUP_ID=str(replica)), log
            )
        )
        return jobs[-1]

    def commits(replica: int, tag: str, **match) -> list[dict]:
        return [c for c in log.select("commit", tag=tag, **match) if c["worker"].startswith(f"g{replica}-")]

    result: dict = {"version": torchft_version()}
    phase = "start"
    try:
        survivor, victim = group(0, "0"), group(1, "0")
        wait_for(
            lambda: len(commits(0, "0", size=2)) >= args.steady and commits(1, "0"),
            log,
            [lighthouse, survivor, victim],
            deadline,
            "steady steps of 2 replica groups",
        )
        result["samples_per_s"] = samples_per_s(commits(0, "0", size=2), args.batch)
        survivors = {c["worker"] for c in commits(0, "0")}
        killed = {c["worker"] for c in commits(1, "0")}
        phase = "kill"
        hit = time.time()
        victim.signal_worker(next(iter(log.select("boot", replica=1)))["pid"], signal.SIGKILL)
        wait_for(
            lambda: len([c for c in commits(0, "0") if c["time"] > hit]) >= args.settle,
            log,
            [lighthouse, survivor],
            deadline,
            "survivor's steps after the kill",
        )
        log.poll()
        result["kill"] = kill_figures(log.records, hit, survivors)
        phase = "join"
        requested = time.time()
        joiner = group(1, "1")
        need = joiner_steps(args.settle, len(commits(1, "0")))
        wait_for(
            lambda: (
                len(commits(1, "1")) >= need
                and len([c for c in commits(0, "0", size=2) if c["time"] > requested]) >= args.settle
            ),
            log,
            [lighthouse, survivor, joiner],
            deadline,
            f"{need} steps of the joiner",
        )
        log.poll()
        result["join"] = join_figures(log.records, requested, survivors, 2, args.settle)
        result["exactly_once"] = exactly_once_figures(log.records, killed)
    except (RuntimeError, TimeoutError, ValueError) as exc:
        # the killed group's agent exits by design: look at the others
        watched = [job for job in jobs if phase == "start" or job is not jobs[1]]
        exited = [job for job in watched if not job.session.running()] or watched
        first_line = (str(exc).splitlines() or [""])[0]
        result["error"] = {
            "phase": phase,
            "message": f"{type(exc).__name__}: {first_line[:300]}",
            "worker_errors": {job.name: worker_error(job.session.text()) for job in exited},
        }
    finally:
        for job in jobs:
            job.session.terminate(STOP_GRACE_S)
        for job in [*jobs, lighthouse]:
            job.close()
    return result
