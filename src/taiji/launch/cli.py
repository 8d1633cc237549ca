"""The ``taiji`` command: each subcommand handed its parsed flags.

taiji run -np 2 python examples/fashion_mnist.py --epochs 2
taiji run -np 4 --timeout 30 -- ./train.sh --flag
taiji sched simulate --workload pollux:6 --policy tiresias,pollux --out runs/sched

The command line itself is launch/parser.py's, and launch/arguments.py turns `run`'s and `join`'s
flags into configs. This entry point is the one part of launch/ that opens every room's doors: it
hands `taiji join`'s agent (the hosts' room) the job room's takeover, and a Slurm task the
launcher's exit code that requeues its job.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Sequence

from .. import env
from ..errors import AuthError, ConfigError, LaunchError, StoreError
from . import checkpoint_cli, metrics_http, top
from .arguments import export_tls_files, parse_join, parse_run
from .control_cli import job_status, list_jobs, resize_job
from .hosts import drain
from .hosts.ray import nodes as ray_nodes
from .parser import build_parser

# Only `taiji run` (and `plot`, `sched`) load torch, when they run: `status`, `resize` and `ls`
# talk to the launcher's control socket and answer in a fraction of a second.

log = logging.getLogger(__name__)


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
                from .hosts.slurm_task import prepare_run, run_task

                allocation = prepare_run(args)  # before torch loads: a task outside Slurm is told at once
            from .run import run_job

            metrics = metrics_http.config_of(args)
            if args.slurm:
                from .hosts.agent import Agent  # torch loads while the launcher starts
                from .takeover import take_over

                return exiting(
                    run_task(
                        parse_run(args),
                        allocation,
                        lambda cfg, announce: run_job(cfg, metrics=metrics, announce=announce),
                        lambda join: Agent(join, take_over).run(),
                        requeue_on=checkpoint_cli.EXIT_RESUMABLE if args.requeue else None,
                    )
                )
            ray_nodes.fill_defaults(args)
            cfg, ray_cfg, provider = parse_run(args), ray_nodes.config_of(args), None
            if ray_cfg is not None:
                cfg, provider = ray_nodes.prepare(cfg, ray_cfg)
            return exiting(run_job(cfg, metrics=metrics, provider=provider))
        if args.subcommand == "join":
            join = parse_join(args)  # before torch loads (with the agent): bad input is told at once
            from .hosts.agent import Agent
            from .takeover import take_over

            return exiting(Agent(join, take_over).run())
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
