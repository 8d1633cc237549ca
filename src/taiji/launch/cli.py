"""The ``taiji`` command.

    taiji run -np 2 python examples/fashion_mnist.py --epochs 2
    taiji run -np 4 --timeout 30 -- ./train.sh --flag
"""
from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import env
from ..cluster import spec
from ..cluster.store import JobStore, host_store
from ..errors import ConfigError, LaunchError, StoreError
from .supervisor import Supervisor, WorkerProcess, describe_exit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunConfig:
    nproc: int
    command: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 0
    timeout: float = 60.0
    grace: float = 5.0
    job_id: str = ""
    debug_collectives: bool = False


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line and exits 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"taiji: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="taiji", description="Adaptive, elastic distributed training on PyTorch.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    run = sub.add_parser("run", help="start a job: N workers running CMD",
                         usage="taiji run -np N [options] [--] CMD [ARGS...]")
    run.add_argument("-np", "--nproc", type=int, required=True, metavar="N", help="number of workers")
    run.add_argument("--host", default="127.0.0.1",
                     help="address the job store listens on (default: loopback)")
    run.add_argument("--port", type=int, default=0, help="job store port (default: a free port)")
    run.add_argument("--timeout", type=float, default=env.TIMEOUT.default,
                     help="seconds a collective may take before it fails (default: %(default)s)")
    run.add_argument("--grace", type=float, default=5.0,
                     help="seconds between SIGTERM and SIGKILL when stopping workers (default: %(default)s)")
    run.add_argument("--job-id", default="", help="job id (default: generated)")
    run.add_argument("--debug-collectives", action="store_true",
                     help="check shapes/dtypes across ranks before each collective")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                     help="the worker command, e.g. `python train.py --lr 0.1`; a bare `python` "
                          "or a `.py` script runs with the launcher's own interpreter")
    return parser


def _check_command(command: Sequence[str]) -> None:
    if not command:
        raise ConfigError("no worker command given; e.g. `taiji run -np 2 python train.py`")
    program = command[0]
    if os.sep in program:
        if not Path(program).exists():
            raise ConfigError(f"the worker program {program!r} does not exist")
        if not os.access(program, os.X_OK):
            raise ConfigError(f"the worker program {program!r} is not executable")
    elif shutil.which(program) is None:
        raise ConfigError(f"the worker program {program!r} is not on PATH")
    if Path(program).name.startswith("python") and len(command) > 1:
        script = command[1]
        if not script.startswith("-") and not Path(script).exists():
            raise ConfigError(f"the script {script!r} does not exist (working directory: {os.getcwd()})")


def parse_run(args: argparse.Namespace) -> RunConfig:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.nproc < 1:
        raise ConfigError(f"-np must be at least 1, got {args.nproc}")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    if args.grace < 0:
        raise ConfigError(f"--grace must be >= 0 seconds, got {args.grace}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable  # the interpreter that has taiji, venv or not
    elif command and command[0].endswith(".py"):
        command = [sys.executable] + command  # `taiji run -np 2 train.py` runs it with this Python
    _check_command(command)
    return RunConfig(nproc=args.nproc, command=tuple(command), host=args.host, port=args.port,
                     timeout=args.timeout, grace=args.grace,
                     job_id=args.job_id or f"j{secrets.token_hex(4)}",
                     debug_collectives=args.debug_collectives)


def worker_env(cfg: RunConfig, worker: spec.WorkerSpec, rank: int, size: int, port: int,
               secret: str) -> dict[str, str]:
    environ = dict(os.environ)
    environ.update({
        env.JOB_ID.name: cfg.job_id,
        env.WORKER_ID.name: worker.id,
        env.STORE_HOST.name: cfg.host,
        env.STORE_PORT.name: str(port),
        env.SECRET.name: secret,
        env.LAUNCHER_PID.name: str(os.getpid()),
        env.TIMEOUT.name: str(cfg.timeout),
        # the torchrun contract, for scripts that read it
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": cfg.host, "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # env:// init joins our store instead of hosting one
        "PYTHONUNBUFFERED": "1",
    })
    if cfg.debug_collectives:
        environ[env.DEBUG_COLLECTIVES.name] = "1"
    if "OMP_NUM_THREADS" not in os.environ:  # n workers on one host must not oversubscribe cores
        environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // size))
    return environ


def _report_failure(sup: Supervisor, worker: WorkerProcess) -> None:
    lines = "\n".join(f"    {line}" for line in list(worker.tail)[-20:]) or "    (no output)"
    assert worker.exit_code is not None
    sup.write(f"taiji: worker {worker.worker_id} (rank {worker.rank}, pid {worker.pid}) failed first: "
              f"{describe_exit(worker.exit_code)}. Last lines of its output:\n{lines}\n")


def run_job(cfg: RunConfig, output=None) -> int:
    """Start the store and the workers, supervise them, and return the job's exit code."""
    sup = Supervisor(output=output)
    store = host_store(cfg.host, cfg.port, timeout=cfg.timeout)
    job_store = JobStore(store, cfg.job_id)
    workers = [spec.WorkerSpec(f"w{i}", cfg.host) for i in range(cfg.nproc)]
    config = spec.initial(workers)
    if not job_store.publish(config):
        raise StoreError(f"job {cfg.job_id}: the store already holds a cluster config")
    secret = secrets.token_hex(16)
    sup.write(f"taiji: job {cfg.job_id}: {cfg.nproc} worker(s), store {cfg.host}:{store.port}, "
              f"command: {' '.join(cfg.command)}\n")
    started = time.monotonic()
    sup.install_signal_handlers()
    first_failure: WorkerProcess | None = None
    try:
        for rank, worker in enumerate(workers):
            sup.spawn(worker.id, rank, cfg.command,
                      worker_env(cfg, worker, rank, cfg.nproc, store.port, secret))
        while sup.running():
            exited, received = sup.wait()
            if received:
                name = signal.Signals(received[0]).name
                sup.write(f"taiji: received {name}; stopping {len(sup.running())} worker(s)\n")
                sup.stop_all(cfg.grace)
                return 128 + received[0]
            for worker in exited:
                assert worker.exit_code is not None
                if worker.exit_code != 0 and first_failure is None:
                    first_failure = worker
                    _report_failure(sup, worker)
                    if sup.running():
                        sup.write(f"taiji: stopping the other {len(sup.running())} worker(s)\n")
                    sup.stop_all(cfg.grace)
    except BaseException:
        sup.stop_all(cfg.grace)
        raise
    finally:
        sup.close()
    if first_failure is not None:
        code = first_failure.exit_code or 1
        return code if code > 0 else 128 - code  # killed by signal s: 128 + s, as shells report
    sup.write(f"taiji: job {cfg.job_id} finished: all {cfg.nproc} worker(s) exited 0 "
              f"in {time.monotonic() - started:.1f}s\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.subcommand == "run":
            return run_job(parse_run(args))
    except (ConfigError, LaunchError, StoreError) as exc:
        sys.stderr.write(f"taiji: error: {exc}\n")
        return 2 if isinstance(exc, ConfigError) else 1
    parser.error(f"unknown command {args.subcommand!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
