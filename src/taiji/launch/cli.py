"""The ``taiji`` command.

taiji run -np 2 python examples/fashion_mnist.py --epochs 2
taiji run -np 4 --timeout 30 -- ./train.sh --flag
taiji sched simulate --workload pollux:6 --policy tiresias,pollux --out runs/sched
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .. import env
from ..comm.addresses import interface_address
from ..comm.topologies import check_topology
from ..errors import AuthError, ConfigError, LaunchError, StoreError
from . import checkpoint_cli, drain, metrics_http, ray_hosts, registry, top
from .control_socket import request
from .options import JoinConfig, RunConfig, heartbeat_interval

# Only `taiji run` (and `plot`, `sched`) load torch, when they run: `status`, `resize` and `ls`
# talk to the launcher's control socket and answer in a fraction of a second.

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line and exits 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"taiji: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="taiji", description="Adaptive, elastic distributed training on PyTorch.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    run = sub.add_parser(
        "run",
        help="start a job: N workers running CMD",
        usage="taiji run (-np N | --nnodes MIN:MAX --nproc-per-node K) [options] [--] CMD [ARGS...]",
    )
    run.add_argument(
        "-np",
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="number of workers at the start (default with --nnodes: MIN x --nproc-per-node)",
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--host",
        default=None,
        help="address the job store and the workers listen on and advertise (default: loopback)",
    )
    where.add_argument(
        "--ifname",
        default=None,
        metavar="NAME",
        help="advertise the IPv4 address of this network interface instead of --host",
    )
    run.add_argument("--port", type=int, default=0, help="job store port (default: a free port)")
    run.add_argument(
        "--store",
        default="tcp",
        metavar="tcp|etcd|etcd://HOST:PORT,...",
        help="the job store: a TCPStore hosted by the launcher (default), an etcd server it starts "
        "(`etcd` binary, package etcd-server), or your etcd cluster",
    )
    run.add_argument(
        "--nproc-per-node",
        type=int,
        default=0,
        metavar="K",
        help="this host's worker slots; other hosts may then join with `taiji join` and the "
        "job grows onto their slots up to --max-np (default: one host, no joins)",
    )
    run.add_argument(
        "--nnodes",
        default=None,
        metavar="MIN:MAX",
        help="hosts in the job, this one included (with --nproc-per-node): the job starts once MIN "
        "hosts have joined (up to --join-timeout), grows onto joining hosts up to MAX and "
        "refuses more; --max-np defaults to MAX x --nproc-per-node. N means N:N",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=env.TIMEOUT.default,
        help="seconds a collective may wait for its peers before it fails; a peer that is "
        "busy (heartbeat fresh) is then waited for, one that is stuck is stopped "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--liveness-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a worker whose heartbeat stops this long is stopped or frozen and is "
        "killed (default: %(default)s)",
    )
    run.add_argument(
        "--busy-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long a live worker busy outside training (an evaluation, a checkpoint) "
        "may keep its waiting peers before it is stopped (default: %(default)s)",
    )
    run.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping workers (default: %(default)s)",
    )
    run.add_argument("--job-id", default="", help="job id (default: generated)")
    run.add_argument(
        "--topology",
        default="ring",
        metavar="ring|tree|star|hierarchical",
        help="how gradients are allreduced: gloo's flat ring (default), a binary tree, a star through "
        "rank 0, or hierarchical (inside each host, then among one leader per host)",
    )
    run.add_argument(
        "--cuda-backend",
        default="nccl",
        choices=("nccl", "gloo"),
        help="process groups for CUDA tensors: nccl, one GPU per worker (default), or gloo, for "
        "workers sharing a GPU (NCCL refuses two ranks on one device)",
    )
    run.add_argument(
        "--debug-collectives",
        action="store_true",
        help="check shapes/dtypes across ranks before each collective",
    )
    run.add_argument(
        "--run-dir",
        default=None,
        help="where rank 0 writes metrics.jsonl and events.jsonl (default: runs/JOB_ID)",
    )
    run.add_argument(
        "--min-np", type=int, default=None, metavar="A", help="never train with fewer workers (default: 1)"
    )
    run.add_argument(
        "--max-np",
        type=int,
        default=None,
        metavar="B",
        help="never grow beyond this many workers (default: -np)",
    )
    run.add_argument("--replace", action="store_true", help="spawn a replacement for every failed worker")
    run.add_argument(
        "--join-timeout",
        type=float,
        default=120.0,
        help="seconds a joiner may take to become ready (default: %(default)s)",
    )
    run.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="the job's secret (an owner-only file of 64 hex digits) instead of a new one: a "
        "scheduler that starts `taiji join` on other hosts derives it there",
    )
    run.add_argument(
        "--no-grow-on-join",
        dest="grow_on_join",
        action="store_false",
        help="a host that joins adds slots, but only a resize (`--placement`) puts workers there "
        "(a scheduler places them); default: the job grows onto them",
    )
    run.add_argument(
        "--max-failures",
        type=int,
        default=3,
        help="worker failures the job survives before it stops (default: %(default)s)",
    )
    run.add_argument(
        "--slurm",
        action="store_true",
        help="run as the tasks of a Slurm job step, one per node (`srun --ntasks-per-node 1 taiji run "
        "--slurm ...`): task 0 is the launcher, the others join it; --nnodes defaults to the step's "
        "nodes, --nproc-per-node to the node's GPUs (else 1); the secret is handed over in a 0600 "
        f"file under $SLURM_SUBMIT_DIR/.taiji (or ${env.SLURM_DIR.name})",
    )
    run.add_argument(
        "--requeue",
        action="store_true",
        help="with --slurm, --checkpoint-dir and --resume auto: when the job stops on a notice with a "
        "complete checkpoint (exit 75: scancel --signal=TERM, a time limit's --signal), task 0 "
        "requeues its Slurm job (`scontrol requeue`, a batch job submitted with --requeue), "
        "whatever the other tasks' statuses (srun reports the largest)",
    )
    checkpoint_cli.add_run_flags(run)
    metrics_http.add_flags(run)
    ray_hosts.add_run_flags(run)
    top.add_parser(sub)
    drain.add_parser(sub)
    join = sub.add_parser(
        "join",
        help="add this host to a running job (an agent for its workers)",
        usage="taiji join JOB@HOST:PORT --secret-file FILE --nproc-per-node K "
        "(--host IP | --ifname NAME)\n       taiji join --slurm JOB [--nproc-per-node K] "
        "[--ifname NAME]   (a task of a Slurm allocation)",
    )
    join.add_argument(
        "target", nargs="?", metavar="JOB@HOST:PORT", help="what `taiji run` printed on the launcher's host"
    )
    join.add_argument(
        "--slurm",
        default=None,
        metavar="JOB",
        help="as a task of another Slurm allocation (one per node): join the job that Slurm job JOB "
        "runs with `taiji run --slurm` (its address and secret are read from the shared directory)",
    )
    join.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="the job's secret file, copied from the launcher's host (`-`: read it from stdin)",
    )
    join.add_argument(
        "--nproc-per-node", type=int, default=None, metavar="K", help="worker slots on this host"
    )
    join_where = join.add_mutually_exclusive_group()
    join_where.add_argument("--host", default=None, help="this host's address, which its workers advertise")
    join_where.add_argument(
        "--ifname", default=None, metavar="NAME", help="advertise the IPv4 address of this network interface"
    )
    join.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the job's store (default: %(default)s)",
    )
    join.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping workers (default: %(default)s)",
    )
    for command in (run, join):
        tls = command.add_argument_group(
            "TLS to an etcds:// store (each host gives its own paths; workers inherit them)"
        )
        tls.add_argument(
            "--etcd-ca",
            default=None,
            metavar="FILE",
            help=f"CA that signed the etcd servers' certificates (or {env.ETCD_CA.name})",
        )
        tls.add_argument(
            "--etcd-cert",
            default=None,
            metavar="FILE",
            help=f"client certificate, when the servers ask for one (or {env.ETCD_CERT.name})",
        )
        tls.add_argument("--etcd-key", default=None, metavar="FILE", help=f"its key (or {env.ETCD_KEY.name})")
    resize = sub.add_parser(
        "resize",
        help="ask a running job for N workers",
        usage="taiji resize [--job ID] [--placement HOST=K,...] N",
    )
    resize.add_argument(
        "--job", default=None, help="the job id `taiji run` printed (default: the only running job)"
    )
    resize.add_argument(
        "--placement",
        default=None,
        metavar="HOST=K,...",
        help="how many of the N workers each host runs (the hosts' addresses as `taiji status` "
        "shows them); it only adds or only removes workers (a move is a shrink, then a grow)",
    )
    resize.add_argument("size", type=int, metavar="N")
    status = sub.add_parser(
        "status", help="show a running job's cluster and progress", usage="taiji status [--job ID]"
    )
    status.add_argument(
        "--job", default=None, help="the job id `taiji run` printed (default: the only running job)"
    )
    sub.add_parser("ls", help="list the jobs running on this host (and prune dead ones)", usage="taiji ls")
    plot = sub.add_parser(
        "plot",
        help="draw a run's timeline (PNG) from its run directory",
        usage="taiji plot RUN_DIR [-o OUT.png]",
    )
    plot.add_argument("run_dir", metavar="RUN_DIR")
    plot.add_argument("-o", "--output", default=None, help="PNG path (default: RUN_DIR/timeline.png)")
    # listed for `taiji --help` only: main() hands these to their own parsers (OWN_PARSERS) before parsing
    sub.add_parser(
        "checkpoint",
        help="inspect and export checkpoints: `taiji checkpoint show|export --help`",
        add_help=False,
    )
    sub.add_parser("sched", help="cluster scheduling: `taiji sched simulate --help`", add_help=False)
    run.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="CMD",
        help="the worker command, e.g. `python train.py --lr 0.1`; a bare `python` "
        "or a `.py` script runs with the launcher's own interpreter",
    )
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
    min_hosts, max_hosts = _parse_nnodes(args.nnodes, args.nproc_per_node)
    if args.nproc is None:
        if args.nproc_per_node < 1:
            raise ConfigError(
                "say how many workers: -np N (N workers on this host), or --nproc-per-node K (K on "
                "this host, more on the hosts that join, up to --max-np; with --nnodes MIN:MAX, "
                "MIN x K across MIN hosts); e.g. `taiji run -np 2 python train.py`"
            )
        args.nproc = min_hosts * args.nproc_per_node  # torchrun's: K workers on each of the MIN hosts
    if args.nproc < 1:
        raise ConfigError(f"-np must be at least 1, got {args.nproc}")
    if getattr(args, "requeue", False) and not args.slurm:
        raise ConfigError(
            "--requeue is for `srun taiji run --slurm` in an sbatch job (it requeues the Slurm job); "
            "elsewhere rerun `taiji run --checkpoint-dir PATH --resume auto ...` after exit 75"
        )
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    min_np = 1 if args.min_np is None else args.min_np
    max_np = max(args.nproc, min_np) if args.max_np is None else args.max_np
    if args.max_np is None and args.nnodes is not None:
        max_np = max(max_np, max_hosts * args.nproc_per_node)
    if min_np < 1:
        raise ConfigError(f"--min-np must be at least 1, got {min_np}")
    if not min_np <= args.nproc <= max_np:
        raise ConfigError(f"need --min-np <= -np <= --max-np, got {min_np} <= {args.nproc} <= {max_np}")
    if args.liveness_timeout < 4 * heartbeat_interval(args.liveness_timeout) or args.busy_timeout <= 0:
        raise ConfigError("--liveness-timeout must be at least 0.2 and --busy-timeout positive")
    if args.join_timeout <= 0 or args.max_failures < 0:
        raise ConfigError("--join-timeout must be positive and --max-failures >= 0")
    if args.grace < 0:
        raise ConfigError(f"--grace must be >= 0 seconds, got {args.grace}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.nproc_per_node < 0:
        raise ConfigError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if args.nproc_per_node and args.nproc > min_hosts * args.nproc_per_node:
        raise ConfigError(_unfit_start(args.nproc, args.nproc_per_node, args.nnodes, max_np))
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable  # the interpreter that has taiji, venv or not
    elif command and command[0].endswith(".py"):
        command = [sys.executable] + command  # `taiji run -np 2 train.py` runs it with this Python
    _check_command(command)
    job_id = args.job_id or f"j{secrets.token_hex(4)}"
    host = interface_address(args.ifname) if args.ifname else (args.host or "127.0.0.1")
    return RunConfig(
        nproc=args.nproc,
        command=tuple(command),
        host=host,
        port=args.port,
        timeout=args.timeout,
        grace=args.grace,
        job_id=job_id,
        run_dir=args.run_dir or str(Path("runs") / job_id),
        debug_collectives=args.debug_collectives,
        topology=check_topology(args.topology),
        cuda_backend=args.cuda_backend,
        min_np=min_np,
        max_np=max_np,
        replace=args.replace,
        join_timeout=args.join_timeout,
        max_failures=args.max_failures,
        liveness_timeout=args.liveness_timeout,
        busy_timeout=args.busy_timeout,
        nproc_per_node=args.nproc_per_node,
        store=_parse_store(args.store),
        min_hosts=min_hosts,
        max_hosts=max_hosts,
        grow_on_join=args.grow_on_join,
        secret=_read_secret(args.secret_file),
        checkpoint=checkpoint_cli.parse_run_flags(args),
    )


def _unfit_start(nproc: int, per_node: int, nnodes: str | None, max_np: int) -> str:
    """Why -np does not fit the starting hosts' slots, with the two forms that work."""
    min_hosts = int(nnodes.partition(":")[0]) if nnodes else 1
    where = "this host's" if min_hosts == 1 else f"the {min_hosts} starting hosts' (--nnodes MIN) x"
    fits, hosts = min_hosts * per_node, -(-nproc // per_node)
    most = max(-(-max_np // per_node), hosts)
    same_hosts = f"--nnodes {nnodes} " if nnodes else ""
    return (
        f"-np {nproc} workers must fit {where} --nproc-per-node {per_node} at the start: either start with "
        f"what fits and grow onto the hosts that join (`-np {fits} {same_hosts}--nproc-per-node {per_node} "
        f"--max-np {max(max_np, nproc)}`), or wait for enough hosts before the start (`--nnodes {hosts}:{most} "
        f"--nproc-per-node {per_node}`, -np defaults to {hosts} x {per_node})"
    )


def _read_secret(path: str | None) -> bytes | None:
    from ..cluster.auth import read_secret_file

    return None if path is None else read_secret_file(path)


def _parse_nnodes(nnodes: str | None, per_node: int) -> tuple[int, int]:
    """``--nnodes MIN:MAX`` (or ``N``) -> (MIN, MAX); (1, unlimited) when not given."""
    if nnodes is None:
        return 1, 0
    low, _, high = nnodes.partition(":")
    if not (low.isdigit() and (high or low).isdigit()) or not 1 <= int(low) <= int(high or low):
        raise ConfigError(f"--nnodes takes MIN:MAX (1 <= MIN <= MAX) or N, got {nnodes!r}")
    if per_node < 1:
        raise ConfigError("--nnodes needs --nproc-per-node K (each host's worker slots)")
    return int(low), int(high or low)


def _parse_store(store: str) -> str:
    if store in ("tcp", "etcd"):
        return store
    from ..cluster.etcd import (
        is_etcd_url,
        parse_url,
    )  # not before: `taiji run` imports torch after starting workers

    if is_etcd_url(store):
        parse_url(store)
        return store
    raise ConfigError(f"--store must be tcp, etcd or etcd[s]://HOST:PORT[,HOST:PORT...], got {store!r}")


def export_tls_files(args: argparse.Namespace) -> None:
    """--etcd-ca/--etcd-cert/--etcd-key go into this process's environment, where the etcd client
    reads them and which the workers it starts inherit."""
    for flag, var in (("etcd_ca", env.ETCD_CA), ("etcd_cert", env.ETCD_CERT), ("etcd_key", env.ETCD_KEY)):
        path = getattr(args, flag, None)
        if path is None:
            continue
        if not Path(path).is_file():
            raise ConfigError(f"--{flag.replace('_', '-')} {path}: no such file")
        os.environ[var.name] = str(Path(path).resolve())


def parse_join(args: argparse.Namespace) -> JoinConfig:
    from ..cluster.auth import read_secret_file

    if args.slurm is not None:
        from .slurm_task import join_config

        return join_config(args)
    missing = [
        name
        for name, value in (
            ("JOB@HOST:PORT", args.target),
            ("--secret-file", args.secret_file),
            ("--nproc-per-node", args.nproc_per_node),
            ("--host or --ifname", args.host or args.ifname),
        )
        if not value and value != 0
    ]
    if missing:
        raise ConfigError(
            f"taiji join needs {', '.join(missing)} (or --slurm JOB, as a task of a Slurm allocation)"
        )
    job_id, at, address = args.target.partition("@")
    from ..cluster.etcd import is_etcd_url, parse_url

    if is_etcd_url(address):
        parse_url(address)
        store_url = address
    else:
        head, colon, port = address.rpartition(":")
        if not (job_id and at and head and colon and port.isdigit()):
            raise ConfigError(
                f"expected JOB@HOST:PORT or JOB@etcd[s]://HOST:PORT (as `taiji run` prints it), "
                f"got {args.target!r}"
            )
        store_url = f"tcp://{address}"
    if not (job_id and at):
        raise ConfigError(f"expected JOB@HOST:PORT or JOB@etcd://HOST:PORT, got {args.target!r}")
    if args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    host = interface_address(args.ifname) if args.ifname else args.host
    return JoinConfig(
        job_id=job_id,
        store_url=store_url,
        secret=read_secret_file(args.secret_file),
        slots=args.nproc_per_node,
        host=host,
        timeout=args.timeout,
        grace=args.grace,
    )


def parse_placement(text: str | None) -> dict[str, int]:
    """``HOST=K,HOST=K`` -> {host: K}; ConfigError naming what is wrong."""
    placement: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        host, sep, count = part.strip().rpartition("=")
        if not sep or not host or not re.fullmatch(r"[0-9]+", count):
            raise ConfigError(f"--placement wants HOST=K,... (e.g. 10.0.0.1=2,10.0.0.2=1), got {part!r}")
        if host in placement:
            raise ConfigError(f"--placement names {host} twice")
        placement[host] = int(count)
    return placement


def resize_job(job_id: str | None, size: int, placement: str | None = None) -> int:
    if size < 1:
        raise ConfigError(f"cannot resize to {size} workers")
    where = parse_placement(placement)
    if where and sum(where.values()) != size:
        raise ConfigError(
            f"--placement puts {sum(where.values())} workers on hosts, not the {size} asked for"
        )
    entry = registry.find_job(job_id)
    if where:  # the launcher would refuse in its log only: say so here
        hosts = {
            address: slots
            for address, slots, _ in request(registry.control_socket(entry.job), {"op": "status"}).get(
                "hosts"
            )
            or []
        }
        for address, count in where.items():
            if address not in hosts:
                raise ConfigError(
                    f"--placement names {address}, not one of job {entry.job}'s hosts: "
                    f"{', '.join(hosts) or 'none reported'} (`taiji status` lists them)"
                )
            if count > hosts[address]:
                raise ConfigError(
                    f"--placement puts {count} workers on {address}, which has {hosts[address]} slot(s)"
                )
    request(
        registry.control_socket(entry.job),
        {"op": "resize", "size": size, "source": "taiji resize", **({"placement": where} if where else {})},
    )
    print(f"taiji: asked job {entry.job} for {size} worker(s); the launcher logs what it does")
    return 0


def _progress_line(progress: dict[str, Any] | None) -> str:
    if not progress:
        return "no progress reported yet"
    age = time.time() - progress.get("time", time.time())
    return (
        f"step {progress['step']} (epoch {progress['epoch']}), global batch {progress['batch_size']}, "
        f"{progress['samples_per_s']:.0f} samples/s, reported by rank 0 at v{progress['version']} {age:.0f}s ago"
    )


def job_status(job_id: str | None) -> int:
    entry = registry.find_job(job_id)
    status = request(registry.control_socket(entry.job), {"op": "status"})
    workers = status["workers"]
    print(
        f"job {entry.job}: cluster v{status['version']}, {len(workers)} worker(s): {', '.join(workers)}"
        + (f"; joining: {', '.join(status['joiners'])}" if status["joiners"] else "")
    )
    print(f"  {_progress_line(status.get('progress'))}")
    print(
        f"  wanted {status['desired']} (min {status['min_np']}, max {status['max_np']}), "
        f"{status['failures']} failure(s); launcher pid {entry.pid}, command: {' '.join(entry.command)}"
    )
    hosts = status.get("hosts") or []
    if len(hosts) > 1:
        print("  hosts: " + ", ".join(f"{address} {used}/{slots}" for address, slots, used in hosts))
    return 0


def list_jobs() -> int:
    """Every job on this host: running ones with their cluster and progress; stale entries pruned."""
    stale = registry.prune()
    for entry in stale:
        print(
            f"taiji: job {entry.job} is not running (its launcher, pid {entry.pid}, exited); removed its entry"
        )
    jobs = registry.all_jobs()
    if not jobs:
        print("no job is running on this host")
        return 0
    print(f"{'JOB':<12} {'STATE':<10} {'WORKERS':>7} {'VERSION':>7} {'STEP':>8}  {'AGE':>7}  COMMAND")
    for entry in jobs:
        try:
            status = request(registry.control_socket(entry.job), {"op": "status"}, timeout=1.0)
            state, workers, version = "running", str(len(status["workers"])), f"v{status['version']}"
            step = str((status.get("progress") or {}).get("step", "-"))
        except StoreError:
            state, workers, version, step = "no answer", "?", "?", "?"
        age = f"{time.time() - entry.started:.0f}s" if entry.started else "?"
        print(
            f"{entry.job:<12} {state:<10} {workers:>7} {version:>7} {step:>8}  {age:>7}  {' '.join(entry.command)}"
        )
    return 0


def exiting(code: int) -> int:
    """A command that loaded torch is done: freeze the objects alive, so the interpreter's exit
    does not scan them all (seconds on a busy host, while a drained host still counts as in use)."""
    gc.freeze()
    return code


def _sched_main(argv: Sequence[str]) -> int:
    from .sched.cli import main as sched_main  # its own parser (launch/sched/cli.py), loaded only when used

    return sched_main(argv)


# commands with a parser of their own: `taiji NAME ...` goes to it whole (build_parser lists them for --help)
OWN_PARSERS = {"checkpoint": checkpoint_cli.main, "sched": _sched_main}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in OWN_PARSERS:
        return OWN_PARSERS[argv[0]](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    env.quiet_cpp_logs()  # before torch loads (lazily, below)
    try:
        if args.subcommand in ("run", "join"):
            export_tls_files(args)
        if args.subcommand == "run":
            if args.slurm:
                from .slurm_task import prepare_run, run_task

                allocation = prepare_run(args)  # before torch loads: a task outside Slurm is told at once
            from .run import run_job

            metrics = metrics_http.config_of(args)
            if args.slurm:
                return exiting(
                    run_task(
                        parse_run(args),
                        allocation,
                        lambda cfg, announce: run_job(cfg, metrics=metrics, announce=announce),
                        requeue_on_notice=args.requeue,
                    )
                )
            ray_hosts.fill_defaults(args)
            cfg, ray_cfg, provider = parse_run(args), ray_hosts.config_of(args), None
            if ray_cfg is not None:
                cfg, provider = ray_hosts.prepare(cfg, ray_cfg)
            return exiting(run_job(cfg, metrics=metrics, provider=provider))
        if args.subcommand == "join":
            join = parse_join(args)  # before torch loads (with the agent): bad input is told at once
            from .agent import Agent

            return exiting(Agent(join).run())
        if args.subcommand == "resize":
            return resize_job(args.job, args.size, args.placement)
        if args.subcommand == "status":
            return job_status(args.job)
        if args.subcommand == "ls":
            return list_jobs()
        if args.subcommand == "top":
            return top.main(args)
        if args.subcommand == "drain":
            return drain.main(args)
        if args.subcommand == "plot":
            from ..metrics.plot import plot_run

            print(f"taiji: wrote {plot_run(args.run_dir, args.output)}")
            return 0
    except (ConfigError, LaunchError, StoreError, AuthError) as exc:
        sys.stderr.write(f"taiji: error: {exc}\n")
        return 2 if isinstance(exc, ConfigError) else 1
    parser.error(f"unknown command {args.subcommand!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
