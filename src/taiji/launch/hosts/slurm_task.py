"""`taiji run --slurm` and `taiji join --slurm JOB`: one task per node, started by `srun`.

Task 0 of the step runs the launcher on its node; once its job store is up it leaves a
*handover* in a directory every node shares (``$TAIJI_SLURM_DIR``, else ``$SLURM_SUBMIT_DIR``):
``.taiji/slurm/<slurm job>/secret`` (the job's secret, 0600, in a 0700 directory: never on a
command line) and ``job.json`` (the taiji job id and its store's address, with the Slurm job,
step and restart count it belongs to). Every other task waits for a handover of its own step
(a requeued job's or an earlier step's is not) and joins as its node's agent. A task of another
allocation joins with `taiji join --slurm JOB` (the first job's id): it grows the job, and its
own allocation's end (SIGTERM) is a planned shrink off its node.

Inside one allocation, Slurm signals every task at once (scancel --signal, a time limit's
--signal, preemption): the launcher takes the final checkpoint and exits 75, so an agent there
keeps its workers until the launcher stops them. With ``--requeue`` the launcher then requeues
its Slurm job itself (``scontrol requeue``): the decision is the launcher's own outcome, not
`srun`'s status, which is the largest of its tasks' (137 once any node's task was killed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ... import env
from ...cluster.auth import read_secret_file, write_secret_file
from ...comm.addresses import interface_address
from ...errors import ConfigError, LaunchError, StoreError
from ..options import JoinConfig, RunConfig
from . import slurm

POLL_SECONDS = 0.1
RECORD, SECRET = "job.json", "secret"
SCONTROL_TIMEOUT = 30.0


def shared_dir(allocation: slurm.Allocation | None) -> Path:
    """Where the handover lives: $TAIJI_SLURM_DIR, else the job's submit directory, else here."""
    return Path(env.SLURM_DIR.get() or (allocation.submit_dir if allocation else "") or os.getcwd())


class Handover:
    """The launcher's address and secret for the other tasks of its job, in a shared directory."""

    def __init__(self, base: Path, slurm_job: str):
        self.slurm_job = slurm_job
        self.directory = base / ".taiji" / "slurm" / slurm_job

    def _write(self, allocation: slurm.Allocation, record: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        record = {
            "slurm_job": allocation.job,
            "step": allocation.step,
            "restart": allocation.restart,
            "node": allocation.node,
            **record,
        }
        temporary = self.directory / f".{RECORD}.{os.getpid()}"
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.directory / RECORD)  # whole or absent

    def publish(self, allocation: slurm.Allocation, job_id: str, store_url: str, secret: bytes) -> None:
        write_secret_file(self.directory / SECRET, secret)  # first: a record names a secret that is there
        self._write(allocation, {"job": job_id, "store": store_url})

    def fail(self, allocation: slurm.Allocation, message: str) -> None:
        """The launcher could not start: its tasks say why instead of waiting for it."""
        self._write(allocation, {"error": message})

    def withdraw(self, allocation: slurm.Allocation) -> None:
        """The launcher exits: remove the handover, if it is still this task's."""
        record = self.read()
        if record is not None and same_run(record, allocation):
            shutil.rmtree(self.directory, ignore_errors=True)

    def read(self) -> dict | None:
        try:
            return json.loads((self.directory / RECORD).read_text())
        except (OSError, ValueError):
            return None

    def wait(self, accept: Callable[[dict], bool], timeout: float, waiting_for: str) -> tuple[dict, bytes]:
        """The first record ``accept`` takes (and the secret), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.read()
            if record is not None and accept(record):
                if "error" in record:
                    raise LaunchError(
                        f"the job's launcher (Slurm job {record.get('slurm_job')}, node "
                        f"{record.get('node')}) could not start: {record['error']}"
                    )
                return record, read_secret_file(str(self.directory / SECRET))
            if time.monotonic() > deadline:
                seen = (
                    f"; {self.directory / RECORD} is from Slurm job {record.get('slurm_job')} step "
                    f"{record.get('step')} (restart {record.get('restart')}), not this one"
                    if record
                    else ""
                )
                raise LaunchError(
                    f"no {waiting_for} within {timeout:g}s in {self.directory}{seen}: is task 0 "
                    "running (its output says why not), and do all nodes share this directory "
                    f"(else set {env.SLURM_DIR.name} to one they share)?"
                )
            time.sleep(POLL_SECONDS)


def same_run(record: dict, allocation: slurm.Allocation) -> bool:
    return (record.get("slurm_job"), record.get("step"), record.get("restart")) == (
        allocation.job,
        allocation.step,
        allocation.restart,
    )


def _node_address(args: argparse.Namespace, allocation: slurm.Allocation) -> str:
    if getattr(args, "host", None):
        raise ConfigError(
            "--host with --slurm would give every node the same address: leave it out (each node "
            "advertises its node name's address) or give --ifname NAME"
        )
    return interface_address(args.ifname) if args.ifname else slurm.ipv4_of(allocation.node)


def prepare_run(args: argparse.Namespace) -> slurm.Allocation:
    """`taiji run --slurm`'s defaults from the allocation, into ``args`` before they are parsed:
    --nnodes N:N (N: the step's nodes), --nproc-per-node (the node's GPUs, else 1), the node's
    address, a job id of the Slurm job's."""
    allocation = slurm.read_allocation(os.environ)
    slurm.check_one_task_per_node(allocation)
    nodes = len(allocation.nodes)
    if args.nnodes is None:
        args.nnodes = f"{nodes}:{nodes}"
    elif args.nnodes.partition(":")[0].isdigit() and int(args.nnodes.partition(":")[0]) > nodes:
        raise ConfigError(
            f"--nnodes {args.nnodes} waits for more hosts than the {nodes} node(s) of Slurm job "
            f"{allocation.job} before it starts: lower its MIN (a second allocation can grow the "
            "job later with `taiji join --slurm`, up to its MAX)"
        )
    if not args.nproc_per_node:
        args.nproc_per_node = slurm.default_slots(allocation)
    if allocation.launches and not args.ifname:
        slurm.check_nodes_resolve(allocation.nodes)  # every node: an agent there must advertise its own
    if args.requeue and not (args.checkpoint_dir and args.resume == "auto"):
        raise ConfigError(
            "--requeue needs --checkpoint-dir PATH and --resume auto: the requeued job runs the same "
            "command and must resume from the checkpoint its stop wrote"
        )
    args.host = _node_address(args, allocation)
    args.ifname = None
    args.job_id = args.job_id or f"slurm{allocation.job}"
    return allocation


def job_state(job: str) -> str:
    """Slurm's state of ``job`` (RUNNING, CANCELLED, ...; "" where scontrol cannot say)."""
    try:
        done = subprocess.run(
            ["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return next(
        (field.split("=", 1)[1] for field in done.stdout.split() if field.startswith("JobState=")), ""
    )


def requeue(allocation: slurm.Allocation, say: Callable[[str], None]) -> bool:
    """Requeue this task's Slurm job (it stopped on a notice with a complete checkpoint); whether
    Slurm took it. Only a job still RUNNING is: a cancelled one (plain `scancel`) was meant to
    end, and one Slurm requeues itself (preemption with PreemptMode=REQUEUE) is not requeued twice."""
    state = job_state(allocation.job)
    if state != "RUNNING":
        say(
            f"Slurm job {allocation.job} is {state or 'in a state scontrol does not tell'}, not RUNNING: "
            "not requeued (a cancelled job is meant to end; a preempted one Slurm requeues itself)"
        )
        return False
    say(
        f"requeueing Slurm job {allocation.job} (`scontrol requeue`): it resumes from its checkpoint when "
        "Slurm starts it again (Slurm holds a requeued job for about two minutes first: its BeginTime)"
    )
    try:
        done = subprocess.run(
            ["scontrol", "requeue", allocation.job], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(
            f"could not requeue Slurm job {allocation.job}: {exc}; requeue it yourself: "
            f"`scontrol requeue {allocation.job}`"
        )
        return False
    if done.returncode != 0:
        say(
            f"Slurm refused to requeue job {allocation.job}: {(done.stderr or done.stdout).strip()} (a job "
            "submitted with --no-requeue, or not a batch job: requeue needs `sbatch --requeue`)"
        )
        return False
    return True


def run_task(
    cfg: RunConfig,
    allocation: slurm.Allocation,
    run_job: Callable[[RunConfig, Callable[[str, bytes], None]], int],
    join: Callable[[JoinConfig], int],
    requeue_on: int | None = None,
) -> int:
    """Task 0: the launcher (``run_job`` with a callback that publishes the handover; when it exits
    ``requeue_on``, a stop on a notice with a complete checkpoint, it requeues the Slurm job); any
    other task: its node's agent (``join``), once the handover of this step is there."""
    handover = Handover(shared_dir(allocation), allocation.job)
    cfg = replace(cfg, hosts_from="slurm")
    if allocation.launches:
        code = _launch(cfg, allocation, handover, run_job)
        if requeue_on is not None and code == requeue_on:
            requeue(allocation, lambda text: print(f"taiji: {text}", flush=True))
        return code
    record, secret = handover.wait(
        lambda r: same_run(r, allocation),
        cfg.join_timeout,
        f"launcher of Slurm job {allocation.job} step {allocation.step or '-'}",
    )
    return join(
        JoinConfig(
            job_id=str(record["job"]),
            store_url=str(record["store"]),
            secret=secret,
            slots=cfg.nproc_per_node,
            host=cfg.host,
            grace=cfg.grace,
            job_notice=True,
        )
    )


def _launch(
    cfg: RunConfig,
    allocation: slurm.Allocation,
    handover: Handover,
    run_job: Callable[[RunConfig, Callable[[str, bytes], None]], int],
) -> int:
    """Task 0's launcher, its handover published once its store is up and withdrawn when it exits."""

    def announce(store_url: str, secret: bytes) -> None:
        handover.publish(allocation, cfg.job_id, store_url, secret)
        others = ", ".join(allocation.nodes[1:]) or "no other node"
        sys.stdout.write(
            f"taiji: Slurm job {allocation.job}: the tasks on {others} join through "
            f"{handover.directory}; another allocation's tasks join with "
            f"`srun taiji join --slurm {allocation.job}`\n"
        )
        sys.stdout.flush()

    try:
        return run_job(cfg, announce)
    except (ConfigError, LaunchError, StoreError) as exc:
        handover.fail(allocation, str(exc))
        raise
    finally:
        handover.withdraw(allocation)


def join_config(args: argparse.Namespace) -> JoinConfig:
    """`taiji join --slurm JOB`: this allocation's node joins the job Slurm job JOB's tasks run."""
    if args.target:
        raise ConfigError(f"give either JOB@HOST:PORT or --slurm JOB, not both (got {args.target!r})")
    target = str(args.slurm)
    allocation = slurm.read_allocation(os.environ)
    slurm.check_one_task_per_node(allocation)
    handover = Handover(shared_dir(allocation), target)
    record = handover.read()
    if record is None:
        raise ConfigError(
            f"no taiji job runs under Slurm job {target}: nothing in {handover.directory} (task 0 of "
            f"`srun taiji run --slurm` writes it there while the job runs). Check the id (`squeue`), "
            f"and that both jobs share that directory (submit them from one, or set "
            f"{env.SLURM_DIR.name})"
        )
    if str(record.get("slurm_job")) != target:
        raise ConfigError(
            f"{handover.directory / RECORD} belongs to Slurm job {record.get('slurm_job')}, not {target}"
        )
    record, secret = handover.wait(lambda r: True, 0, f"launcher of Slurm job {target}")
    slots = args.nproc_per_node or slurm.default_slots(allocation)
    if slots < 1:
        raise ConfigError(f"--nproc-per-node must be at least 1, got {slots}")
    # another step of the launcher's own allocation: Slurm's SIGTERM reaches the launcher too
    return JoinConfig(
        job_id=str(record["job"]),
        store_url=str(record["store"]),
        secret=secret,
        slots=slots,
        host=_node_address(args, allocation),
        timeout=args.timeout,
        grace=args.grace,
        job_notice=allocation.job == target,
    )
