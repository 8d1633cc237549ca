"""``taiji sched``: the cluster scheduler — the live daemon and its clients, and the simulator.

    taiji sched serve --slots 4 --policy pcrr --round 10          # the daemon (foreground)
    taiji sched serve --hosts hosts.txt --address 10.0.0.1:7070   # many hosts: "ADDRESS SLOTS" per line,
    taiji sched agent --host 10.0.0.2 --slots 4 --daemon 10.0.0.1:7070 --secret-file FILE  # on each
    taiji sched serve --ray 10.0.0.1:6379 --slots 4              # or: the hosts are a Ray cluster's nodes
    taiji sched submit --min-np 1 --max-np 4 --name mnist -- python examples/fashion_mnist.py
    taiji sched status                                            # a table of the jobs
    taiji sched cancel s0002
    taiji sched stop                                              # stops the daemon and its jobs
    taiji sched plot -o allocations.png                           # workers per job over time
    taiji sched simulate --workload pollux:6 --policy pcrr,tiresias  # the simulator (taiji.sched.cli)

The daemon shares ``--slots`` worker slots (cores) — or the slots of every host in ``--hosts``, each
driven by its ``taiji sched agent``, or of every node of a Ray cluster (``--ray``) — among elastic
taiji jobs: every ``--round`` seconds it runs the same policy code as ``taiji sched simulate`` on
models fitted to what each job measured, and resizes running jobs in place — shrinks first, grows
once the shrinks landed, so the slots are never oversubscribed. Clients find it through
``--state-dir`` (default ``~/.taiji/sched``) and sign their requests with the secret there.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, TaijiError
from ...sched.preemption import SuspendRules
from .. import metrics_http
from .channel import ask

PROG = "taiji sched"


def las_threshold(text: str) -> float | str:
    """``--las-threshold``: worker-seconds > 0, or ``auto`` (set from the workload)."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"worker-seconds > 0 or 'auto', not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="run the scheduler daemon in the foreground")
    serve.add_argument(
        "--slots",
        type=int,
        default=None,
        help=f"worker slots to share (default: this host's cores, {os.cpu_count() or 1}; with "
        "--ray: each node's, by default what the smallest node holds)",
    )
    serve.add_argument("--policy", default="pcrr", help="pcrr, fifo, tiresias, pollux, drf, srtf, optimus")
    serve.add_argument("--round", type=float, default=10.0, metavar="SECONDS", help="seconds between rounds")
    serve.add_argument(
        "--address",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to listen for requests (default: loopback, a free port)",
    )
    serve.add_argument(
        "--shrink-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a shrink not landed by then keeps its slots reserved and the round's grows go on",
    )
    serve.add_argument(
        "--max-suspensions-per-hour",
        type=int,
        default=SuspendRules.max_per_hour,
        metavar="N",
        help="a job is suspended at most this often in any hour (default: %(default)s; 0: never)",
    )
    serve.add_argument(
        "--min-run-factor",
        type=float,
        default=SuspendRules.min_run_factor,
        metavar="K",
        help="a resumed job runs at least K x its measured suspend/resume cost before it may be "
        "suspended again (a first start is not held back; default: %(default)s)",
    )
    serve.add_argument(
        "--min-left-factor",
        type=float,
        default=SuspendRules.min_left_factor,
        metavar="K",
        help="a job with less than K x its suspend/resume cost left to train is not suspended: it "
        "ends sooner than its suspension would pay (default: %(default)s; 0: any job)",
    )
    serve.add_argument(
        "--las-threshold",
        type=las_threshold,
        default=None,
        metavar="WORKER_SECONDS",
        help="tiresias: attained service (worker-seconds) after which a job is demoted, or 'auto' "
        "(default): the median predicted size, in worker-seconds, of the jobs seen lately "
        "(a fixed one, e.g. Pollux's 16 GPU-hours, suits only jobs of a known scale)",
    )
    serve.add_argument(
        "--hosts",
        default=None,
        metavar="FILE",
        help="many hosts: one 'ADDRESS SLOTS' line per host (all with the same slots), each running "
        "`taiji sched agent`; listen on an address they reach (--address)",
    )
    ray = serve.add_argument_group("Ray (pip install 'taiji[ray]')")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="the hosts are the nodes of a Ray cluster, live (ADDRESS: its head's HOST:PORT; default: "
        "RAY_ADDRESS or the cluster on this machine): no agents, no hosts file",
    )
    ray.add_argument(
        "--max-hosts",
        type=int,
        default=16,
        metavar="N",
        help="with --ray: the most nodes the pool holds (default: %(default)s)",
    )
    ray.add_argument(
        "--ray-cpus-per-worker",
        type=float,
        default=1.0,
        metavar="C",
        help="with --ray: Ray CPUs a node has per slot (default: %(default)s)",
    )
    ray.add_argument(
        "--ray-gpus-per-worker",
        type=float,
        default=0.0,
        metavar="G",
        help="with --ray: Ray GPUs a node has per slot (default: %(default)s)",
    )
    metrics_http.add_flags(serve)
    serve.add_argument(
        "--host-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a host whose agent is silent this long is down: its slots leave the pool",
    )
    serve.add_argument(
        "--fence",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="an agent that has not reached the daemon this long stops its launchers (they "
        "checkpoint); once that and --checkpoint-grace have passed, a job whose home host is "
        "down resumes from its checkpoint elsewhere (default: %(default)s; 0: such a job fails)",
    )
    serve.add_argument(
        "--checkpoint-grace",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="each job's taiji run --checkpoint-grace: how long a job being suspended may take to "
        "reach a step boundary and checkpoint (default: %(default)s)",
    )
    agent = sub.add_parser("agent", help="run one host's jobs for a `serve --hosts` daemon (foreground)")
    agent.add_argument(
        "--host", required=True, help="this host's address, as the daemon's --hosts file names it"
    )
    agent.add_argument(
        "--slots", type=int, required=True, help="this host's worker slots (as in the --hosts file)"
    )
    agent.add_argument(
        "--daemon",
        default=None,
        metavar="HOST:PORT",
        help="the daemon's address (default: from --state-dir's daemon.json)",
    )
    agent.add_argument(
        "--secret-file",
        default=None,
        metavar="FILE",
        help="a copy of the daemon's secret file (default: --state-dir's secret)",
    )
    agent.add_argument(
        "--work-dir",
        default=None,
        metavar="DIR",
        help="where the agent keeps job secrets and join logs (default: STATE_DIR/agent-HOST)",
    )
    submit = sub.add_parser("submit", help="queue a job: taiji sched submit [options] -- python train.py ...")
    submit.add_argument("--min-np", type=int, default=1, metavar="A")
    submit.add_argument("--max-np", type=int, default=None, metavar="B", help="default: all slots")
    submit.add_argument(
        "-np",
        type=int,
        default=None,
        metavar="N",
        help="the size a rigid policy (fifo) runs it at (default: min(B, slots))",
    )
    submit.add_argument(
        "--weight",
        type=float,
        default=1.0,
        help="the job's weight in PCRR's weighted completion time (other policies ignore it)",
    )
    submit.add_argument("--name", default="")
    submit.add_argument(
        "--work",
        type=int,
        default=0,
        metavar="SAMPLES",
        help="samples it will train (epochs x data set), for the policy until the job reports it",
    )
    submit.add_argument(
        "--max-batch",
        type=int,
        default=0,
        metavar="B",
        help="the job adapts its global batch up to B (taiji's goodput policy, e.g. "
        "examples/fashion_mnist.py --policy goodput --max-batch B): the policies then weigh "
        "its batches by goodput (default: it keeps its batch, unless its run log shows it changed)",
    )
    submit.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="P",
        help="its class (default 0): a waiting job of a higher class suspends lower ones if that "
        "lets its --min-np start",
    )
    submit.add_argument(
        "--no-preempt",
        action="store_true",
        help="never suspend it (it keeps at least --min-np workers until it ends)",
    )
    submit.add_argument(
        "--checkpoint-dir",
        default="",
        metavar="DIR",
        help="where it checkpoints and resumes from after a suspension (default: "
        "STATE_DIR/jobs/ID/checkpoints; many hosts: a directory every host reaches)",
    )
    submit.add_argument(
        "--checkpoint-every",
        default="",
        metavar="10m|N",
        help="also checkpoint periodically (what a job resumes from if its home host is lost)",
    )
    submit.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- CMD", help="the job's command")
    sub.add_parser("status", help="the jobs: state, workers, samples/s, progress, estimated finish")
    cancel = sub.add_parser("cancel", help="stop a job and free its slots")
    cancel.add_argument("job", metavar="JOB")
    sub.add_parser("stop", help="stop the daemon (and every job it runs)")
    plot = sub.add_parser("plot", help="each job's workers over time, from the daemon's saved state")
    plot.add_argument(
        "-o", "--output", default=None, metavar="PNG", help="default: STATE_DIR/allocations.png"
    )
    for command in sub.choices.values():
        command.add_argument(
            "--state-dir",
            default=None,
            metavar="DIR",
            help="the daemon's directory (default: $TAIJI_HOME/sched or ~/.taiji/sched)",
        )
    # its options are the simulator's own (`taiji sched simulate --help`): main() hands it over unparsed
    sub.add_parser(
        "simulate", add_help=False, help="run policies on a workload in the simulator and compare them"
    )
    return parser


def format_status(reply: dict[str, Any]) -> str:
    now = float(reply.get("now", time.time()))
    rows = [
        (
            "JOB",
            "NAME",
            "STATE",
            "WORKERS",
            "HOSTS",
            "BATCH",
            "NOISE",
            "SAMPLES/S",
            "PROGRESS",
            "ETA",
            "SINCE",
        )
    ]
    names = reply.get("host_names") or ["this host"]
    for job in reply.get("jobs", []):
        end, position, speed = job.get("end") or 0, job.get("position") or 0, job.get("samples_per_s") or 0.0
        progress = f"{100 * position / end:.0f}%" if end else "-"
        eta = f"{(end - position) / speed:.0f}s" if end and speed > 0 and job["state"] == "running" else "-"
        since = job.get("ended") or job.get("started") or job["submitted"]
        state = job["state"] + (f" at step {job['stopped_at']}" if job["state"] == "suspended" else "")
        state += " (suspending)" if job["state"] == "running" and job.get("suspending") is not None else ""
        state += f" ({job['reason']})" if job.get("reason") else ""
        rows.append(
            (
                job["id"],
                job["name"],
                state,
                str(job.get("size", 0)) + f" [{job['min_np']}-{job['max_np']}]",
                _hosts_of(job, names),
                str(job.get("batch_size") or "-"),
                _samples(job.get("noise_scale")),
                f"{speed:.0f}",
                progress,
                eta,
                f"{now - since:.0f}s ago",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    held = sum(job.get("size", 0) for job in reply.get("jobs", []) if job["state"] == "running")
    slots, up = int(reply.get("slots", 0)), reply.get("up") or [True] * len(names)
    down = [
        name for name, is_up in zip(names, up, strict=False) if not is_up and name
    ]  # ("": a Ray pool's seat no node took)
    lines.append(
        f"{held}/{slots * sum(1 for u in up if u)} slots in use on {sum(1 for u in up if u)} host(s)"
        + (f" ({', '.join(down)} down)" if down else "")
        + f"; policy {reply.get('policy')}"
    )
    return "\n".join(lines)


def _samples(noise_scale: float | None) -> str:
    """A gradient noise scale (samples) as the status table shows it; "-" until the run log has one."""
    if not noise_scale:
        return "-"
    return f"{noise_scale / 1000:.1f}k" if noise_scale >= 10_000 else f"{noise_scale:.0f}"


def _hosts_of(job: dict[str, Any], names: list[str]) -> str:
    placement = job.get("placement") or []
    if job["state"] != "running" or not any(placement):
        return "-" if job["state"] != "running" or len(names) > 1 else names[0]
    return ",".join(f"{name}={n}" for name, n in zip(names, placement, strict=False) if n)


def main(argv: Sequence[str]) -> int:
    if list(argv[:1]) == ["simulate"]:
        try:  # needs SciPy (the extra taiji[sched])
            from ...sched.cli import main as simulate_main
        except ImportError as exc:
            sys.stderr.write(f"{PROG}: error: {exc}; install the extra: pip install 'taiji[sched]'\n")
            return 2
        return simulate_main(list(argv))
    args = build_parser().parse_args(list(argv))
    from .daemon import run_daemon
    from .statedir import daemon_address, read_secret, state_dir

    directory = state_dir(args.state_dir)
    try:
        if args.command == "serve":
            from ...sched.costs import SYSTEMS
            from ...sched.policies import make_policy
            from ...sched.scheduler import Scheduler

            if not logging.getLogger().handlers:
                logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
            hosts = None
            slots, count = (os.cpu_count() or 1) if args.slots is None else args.slots, 1
            if args.ray is not None:
                if args.hosts:
                    raise ConfigError(
                        "--ray and --hosts: the hosts are a Ray cluster's nodes or a file's, not both"
                    )
                from ..hosts.ray.nodes import config_of
                from .ray_jobs import open_pool

                hosts = open_pool(
                    config_of(args), args.slots, args.max_hosts, directory, lambda: read_secret(directory)
                )
                slots, count = hosts.cfg.slots, hosts.cfg.max_hosts
            elif args.hosts:
                from .hosts import AgentHosts, read_hosts_file

                listed = read_hosts_file(args.hosts)
                hosts, slots, count = (
                    AgentHosts(listed, args.host_timeout, args.fence, args.checkpoint_grace),
                    listed[0][1],
                    len(listed),
                )
            threshold = (
                args.las_threshold if args.las_threshold is not None or args.policy != "tiresias" else "auto"
            )
            policy = make_policy(args.policy, SYSTEMS["taiji"], las_threshold=threshold, round_s=args.round)
            rules = SuspendRules(
                max_per_hour=args.max_suspensions_per_hour,
                min_run_factor=args.min_run_factor,
                min_left_factor=args.min_left_factor,
            )
            scheduler = Scheduler(slots, policy, args.shrink_timeout, hosts=count, rules=rules)
            if args.fence < 0 or args.checkpoint_grace <= 0:
                raise ConfigError("--fence must be >= 0 and --checkpoint-grace > 0 seconds")
            return run_daemon(
                directory,
                scheduler,
                args.round,
                args.address,
                hosts,
                metrics_http.config_of(args),
                args.checkpoint_grace,
            )
        if args.command == "agent":
            from ...cluster.auth import read_secret_file
            from .agent import SchedAgent, run_agent

            if not logging.getLogger().handlers:
                logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
            secret = read_secret_file(args.secret_file) if args.secret_file else read_secret(directory)
            work = Path(args.work_dir) if args.work_dir else directory / f"agent-{args.host}"
            return run_agent(
                SchedAgent(args.daemon or daemon_address(directory), secret, args.host, args.slots, work)
            )
        if args.command == "plot":
            print(plot_state(directory, args.output))
            return 0
        address, secret = daemon_address(directory), read_secret(directory)
        if args.command == "submit":
            reply = ask(
                address,
                secret,
                {
                    "op": "submit",
                    "command": _command_after_dashes(argv),
                    "min_np": args.min_np,
                    "max_np": args.max_np,
                    "np": args.np,
                    "weight": args.weight,
                    "name": args.name,
                    "cwd": os.getcwd(),
                    "work": args.work,
                    "priority": args.priority,
                    "no_preempt": args.no_preempt,
                    "checkpoint_dir": _absolute(args.checkpoint_dir),
                    "checkpoint_every": args.checkpoint_every,
                    "max_batch": args.max_batch,
                },
            )
            print(reply["job"])
        elif args.command == "status":
            print(format_status(ask(address, secret, {"op": "status"})))
        elif args.command == "cancel":
            reply = ask(address, secret, {"op": "cancel", "job": args.job}, timeout=30.0)
            print(f"{reply['job']}: {reply['state']}")
        else:
            ask(address, secret, {"op": "stop"})
            print("the scheduler daemon is stopping (and stopping its jobs)")
        return 0
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    except TaijiError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 1


def plot_state(directory: Path, output: str | None) -> Path:
    """Each job's observed workers over time (seconds since the first submission)."""
    import json

    from ...sched.plots import plot_allocations

    try:
        saved = json.loads((directory / "state.json").read_text())
    except (OSError, ValueError):
        raise ConfigError(
            f"no saved scheduler state in {directory} (state.json): has a daemon run there?"
        ) from None
    jobs = saved.get("jobs", [])
    if not jobs:
        raise ConfigError(f"the scheduler in {directory} has no jobs to plot yet")
    t0 = min(job["submitted"] for job in jobs)
    label = {job["id"]: f"{job['id']} {job['name']}" for job in jobs}
    allocations = {label[j["id"]]: [(t - t0, n) for t, n in j["allocations"]] for j in jobs}
    lifetimes = {
        label[j["id"]]: (j["submitted"] - t0, None if j.get("ended") is None else j["ended"] - t0)
        for j in jobs
    }
    path = Path(output) if output else directory / "allocations.png"
    shape = f"{saved.get('hosts', 1)} host(s) x {saved.get('slots')} slot(s)"
    suspensions = {label[j["id"]]: [t - t0 for t in j.get("suspensions", [])] for j in jobs}
    return plot_allocations(
        allocations,
        lifetimes,
        path,
        f"taiji sched ({shape})",
        unit=("seconds since the first submission", 1.0),
        held="workers",
        suspensions=suspensions,
    )


def _absolute(directory: str) -> str:
    """A directory as the daemon must see it (a URL unchanged)."""
    if not directory or "://" in directory:
        return directory
    return str(Path(directory).resolve())


def _command_after_dashes(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if "--" not in argv:
        raise ConfigError("put the job's command after --: taiji sched submit [options] -- python train.py")
    return argv[argv.index("--") + 1 :]
