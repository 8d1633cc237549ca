"""`taiji run`'s and `taiji join`'s parsed flags turned into their configs (:class:`RunConfig`,
:class:`JoinConfig`), with every refusal of bad input said before torch loads."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import env
from ..comm.addresses import interface_address
from ..comm.topologies import check_topology
from ..errors import ConfigError
from . import checkpoint_cli
from .options import JoinConfig, RunConfig, heartbeat_interval


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
        f"--max-np {max(max_np, nproc)}`), or wait for enough hosts before the start "
        f"(`--nnodes {hosts}:{most} --nproc-per-node {per_node}`, -np defaults to {hosts} x {per_node})"
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
        from .hosts.slurm_task import join_config

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
