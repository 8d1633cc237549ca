"""The ``taiji`` command line: its subcommands and their flags (argparse).

The flags of a part that owns them are added by that part (checkpoints, metrics, Ray, `taiji top`,
`taiji drain`); launch/arguments.py turns parsed ``run``/``join`` flags into their configs and
launch/cli.py runs the command.
"""

from __future__ import annotations

import argparse

from .. import env
from . import checkpoint_cli, metrics_http, top
from .hosts import drain
from .hosts.ray import nodes as ray_nodes


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
    ray_nodes.add_run_flags(run)
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
    # listed for `taiji --help` only: launch/cli.py's main() hands these to their own parsers (OWN_PARSERS)
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
