"""taiji on Ray (`taiji run --ray`) vs `taiji join` vs Ray Train's elastic restart, side by side,
on emulated hosts (network namespaces behind a bridge, taiji_harness/netns.py; needs root and Ray:
pip install 'taiji[ray]').

Every side trains the same model on the same data with the same global batch (``_elastic_train.py``:
an MLP of 1.05M parameters, gloo over each host's ``eth0``), one worker on host 0, then one on host
0 and one on host 1; figures come from the processes' step logs.

- **taiji on Ray**: a Ray node on host 0 (the head, 1 CPU) runs the launcher (`taiji run --ray
  -np 1 --max-np 2`) and its worker. After ``--warm`` steps a Ray node is started on host 1; the
  launcher places its agent actor there and the job grows onto it. After ``--settle`` steps and
  ``--steady`` more at 2 workers, host 1's raylet is SIGKILLed (the node leaves the cluster).
- **taiji join**: the same without Ray's part: `taiji run -np 1 --max-np 2` on host 0, `taiji join`
  on host 1 after the warm-up; the same steps at 2 workers; then host 1's agent is SIGKILLed. The
  same Ray nodes run beside it, idle, so that both sides share the machine with Ray's daemons
  (gcs_server, raylets, their agents: a CPU cost of running Ray at all, not of taiji on Ray).
- **Ray Train**: a Ray node on host 0 (1 CPU) runs the driver of a ``TorchTrainer`` with
  ``ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=1)`` (``_ray_train.py``:
  DDP, rank 0 saves a checkpoint every step). After the warm-up a Ray node is started on host 1:
  Ray Train stops the group and starts it again at 2 workers from the checkpoint. Then host 1's
  raylet is SIGKILLed: Ray Train starts the group again at 1 worker.

Rows (> 1 = taiji on Ray ahead): **grow stall** — the running worker's stall, (first commit at 2 -
last commit at 1) - one normal step at 2 — against Ray Train's restart (target ≥ 100×) and against
`taiji join` (target ≤ join's + 10 ms); **node loss** — the kill to host 0's next committed step
(target ≤ 0.5 s; anchor: Ray Train's restart after the same kill); **steady samples/s** at 2
workers against `taiji join` (target ≥ 0.98). Each row also carries request -> new size (a node
added / `taiji join` started -> the first step at 2) and the 1-minute load average.

    .venv/bin/python benchmarks/ray_engine.py --quick     # one repetition of each side, ~10 min loaded
    .venv/bin/python benchmarks/ray_engine.py --cases ray,join --reps 3   # taiji's sides only (no Ray Train)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from multihost import in_host, skipped_without_hosts, taiji_agent  # noqa: E402
from taiji_harness import ray_nodes  # noqa: E402
from taiji_harness.bench import contract_row, median, print_result, reap_on_sigterm  # noqa: E402
from taiji_harness.elastic_analysis import normal_step, taiji_change_figures  # noqa: E402
from taiji_harness.elastic_runs import LaunchedJob, StepLog, train_args, wait_for  # noqa: E402

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "taiji.launch.cli"]
TAIJI_PORT = 29400


def load() -> float:
    return round(os.getloadavg()[0], 2)


def samples_per_s(commits: list[dict], batch: int) -> float:
    """Global samples per second over consecutive commits of one worker."""
    return batch * (len(commits) - 1) / (commits[-1]["time"] - commits[0]["time"])


class RayCluster:
    """The Ray nodes of one side, under a short temporary directory (Ray's socket paths must fit)."""

    def __init__(self, hosts, out: Path, env: dict):
        self.hosts, self.out, self.env = hosts, out, env
        self.temp = tempfile.mkdtemp(prefix="tjrb")

    def start(self, i: int) -> float:
        """Start host ``i``'s node and wait until it is in the cluster; the wall-clock time it was."""
        ray_nodes.start_and_wait(self.hosts, i, self.out / f"ray{i}.log", self.temp, env=self.env)
        return time.time()

    @property
    def address(self) -> str:
        return f"{self.hosts.address(0)}:{ray_nodes.PORT}"

    def kill_node(self, i: int) -> float:
        """SIGKILL host ``i``'s raylet (the node leaves the cluster); the wall-clock time of the kill."""
        pid = ray_nodes.raylet_pid(self.hosts, i)
        assert pid is not None, f"no raylet on host {i}"
        hit = time.time()
        os.kill(pid, signal.SIGKILL)
        return hit

    def close(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)  # its processes end with the hosts'


def taiji_launcher(
    args: argparse.Namespace, hosts, out: Path, env: dict, log: StepLog, *mode: str
) -> LaunchedJob:
    return LaunchedJob(
        "taiji",
        in_host(
            hosts,
            0,
            [
                *CLI,
                "run",
                "-np",
                "1",
                "--nproc-per-node",
                "1",
                "--max-np",
                "2",
                "--host",
                hosts.address(0),
                *mode,
                "--job-id",
                "jray",
                "--timeout",
                str(args.collective_timeout),
                "--liveness-timeout",
                str(args.liveness_timeout),
                "--run-dir",
                str(out / "run"),
                "--",
                *train_args(args, out),
            ],
        ),
        out,
        env,
        log,
    )


def taiji_side(args: argparse.Namespace, hosts, out: Path, env: dict, on_ray: bool) -> dict:
    """Grow onto host 1, steady steps at 2, then lose host 1: taiji on Ray, or with `taiji join`."""
    log = StepLog(out, "taiji")
    env = dict(env, TAIJI_HOME=str(out / "home"))
    deadline = time.monotonic() + args.timeout
    cluster = RayCluster(hosts, out, env)  # on both: the same Ray daemons beside the training (idle for join)
    jobs: list[LaunchedJob] = []
    try:
        cluster.start(0)
        jobs.append(
            taiji_launcher(
                args,
                hosts,
                out,
                env,
                log,
                *(["--ray", cluster.address] if on_ray else ["--port", str(TAIJI_PORT)]),
            )
        )

        def w0(version: int | None = None) -> list[dict]:
            return [
                c for c in log.select("commit", worker="w0") if version is None or c["version"] == version
            ]

        wait_for(lambda: len(w0()) >= args.warm, log, jobs, deadline, "warm-up steps")
        requested = cluster.start(1)  # the node is in the cluster: the job's part begins
        if not on_ray:
            jobs.append(taiji_agent(hosts, out, env, log, "jray", f"{hosts.address(0)}:{TAIJI_PORT}"))
        wanted = args.settle + args.steady
        wait_for(lambda: len(w0(2)) >= wanted, log, jobs, deadline, f"{wanted} steps on two hosts")
        grow = taiji_change_figures(
            log.records, {"to_version": 2, "to_size": 2, "requested": requested}, args.settle
        )
        grow["load"] = load()
        steady = samples_per_s(w0(2)[args.settle : wanted], args.batch)
        if on_ray:
            hit = cluster.kill_node(1)
        else:
            hit = time.time()
            os.killpg(jobs[1].session.popen.pid, signal.SIGKILL)
        first = wait_for(
            lambda: [c for c in w0() if c["version"] > 2 and c["time"] > hit],
            log,
            jobs[:1],
            deadline,
            "a step after the node's loss",
        )[0]
        loss = {"resume_s": first["time"] - hit, "to_size": first["size"], "load": load()}
        (out / "stop").touch()
        jobs[0].session.wait(max(deadline - time.monotonic(), 1.0))
        return {"grow": grow, "steady_samples_s": steady, "steady_load": load(), "node_loss": loss}
    finally:
        for job in jobs:
            job.close()
        cluster.close()


def raytrain_side(args: argparse.Namespace, hosts, out: Path, env: dict) -> dict:
    """Ray Train's elastic group: grow onto host 1's new node (a restart), then lose it (another)."""
    log = StepLog(out, "raytrain")
    deadline = time.monotonic() + args.timeout + args.fault_wait
    cluster = RayCluster(hosts, out, env)
    jobs: list[LaunchedJob] = []
    try:
        cluster.start(0)
        jobs.append(
            LaunchedJob(
                "raytrain",
                in_host(
                    hosts,
                    0,
                    [
                        sys.executable,
                        str(HERE / "_ray_train.py"),
                        str(out),
                        "--address",
                        cluster.address,
                        "--max-workers",
                        "2",
                        "--batch",
                        str(args.batch),
                        "--step-delay",
                        str(args.step_delay),
                        "--timeout",
                        str(args.collective_timeout),
                    ],
                ),
                out,
                env,
                log,
            )
        )

        def rank0(size: int | None = None, since: float = 0.0) -> list[dict]:
            return [
                c
                for c in log.select("commit", rank=0)
                if (size is None or c["size"] == size) and c["time"] > since
            ]

        wait_for(lambda: len(rank0(1)) >= args.warm, log, jobs, deadline, "warm-up steps")
        requested = cluster.start(1)
        wanted = args.settle + args.steady
        wait_for(lambda: len(rank0(2)) >= wanted, log, jobs, deadline, f"{wanted} steps on two hosts")
        old, new = rank0(1), rank0(2)
        boots = [b for b in log.select("boot") if b["size"] == 2]
        grow = {
            "to_size": 2,
            "stall_s": new[0]["time"] - old[-1]["time"] - normal_step(new, args.settle),
            "request_to_new_size_s": new[0]["time"] - requested,
            "restart_boot_s": max(b["ready"] for b in boots) - min(b["exec"] for b in boots),
            "resumed_at": min(b["resumed_at"] for b in boots),
            "last_committed_before": old[-1]["step"],
            "step_ms_after": normal_step(new, args.settle) * 1e3,
            "load": load(),
        }
        steady = samples_per_s(new[args.settle : wanted], args.batch)
        hit = cluster.kill_node(1)
        try:
            first = wait_for(
                lambda: rank0(1, since=hit),
                log,
                jobs,
                time.monotonic() + args.fault_wait,
                "a step after the node's loss",
            )[0]
            loss = {"resume_s": first["time"] - hit, "outcome": "restarted at 1 worker", "load": load()}
        except (TimeoutError, RuntimeError) as exc:
            loss = {
                "resume_s": None,
                "lower_bound_s": args.fault_wait,
                "load": load(),
                "outcome": f"no step within {args.fault_wait:g}s"
                + (" (the driver exited)" if isinstance(exc, RuntimeError) else ""),
            }
        return {"grow": grow, "steady_samples_s": steady, "steady_load": load(), "node_loss": loss}
    finally:
        for job in jobs:
            job.close()
        cluster.close()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repetition of each side (~10 min on a loaded 2-core machine)",
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default: 1 quick, 3 full)")
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--settle", type=int, default=8, help="steps at 2 before the steady window")
    parser.add_argument(
        "--steady",
        type=int,
        default=None,
        help="steps at 2 timed for samples/s (60 quick, 400 full: a shorter window is mostly load noise)",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.01)
    parser.add_argument("--collective-timeout", type=float, default=5.0)
    parser.add_argument(
        "--liveness-timeout",
        type=float,
        default=5.0,
        help="taiji's sides: a silent agent or worker is dropped after this (not what a node "
        "loss waits for: the agent's tether closes at once)",
    )
    parser.add_argument("--timeout", type=float, default=400.0, help="hard limit per side, seconds")
    parser.add_argument(
        "--fault-wait",
        type=float,
        default=60.0,
        help="how long to wait for Ray Train to commit a step after the node's loss",
    )
    parser.add_argument(
        "--cases",
        default="ray,join,raytrain",
        help="which sides (comma-separated; a run of some is recorded beside the full one)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.steady = args.steady or (60 if args.quick else 400)
    return args


def rows_of(runs: dict[str, list[dict]]) -> list[dict]:
    def values(side: str, *path: str) -> list[float]:
        found = []
        for run in runs[side]:
            for key in path:
                run = run.get(key) if isinstance(run, dict) else None
            if run is not None:
                found.append(run)
        return found

    def med(side: str, *path: str) -> float | None:
        found = values(side, *path)
        return round(median(found), 4) if found else None

    ray_stall, join_stall = med("ray", "grow", "stall_s"), med("join", "grow", "stall_s")
    anchor_loss = med("raytrain", "node_loss", "resume_s")
    rows = [  # (the sides a row needs, the row): a run of some sides has the rows they make
        (
            {"ray", "raytrain"},
            contract_row(
                "grow stall: taiji on Ray vs Ray Train restart",
                ray_stall,
                med("raytrain", "grow", "stall_s"),
                higher_is_better=False,
                unit="s",
                target="ratio >= 100",
                taiji_all=values("ray", "grow", "stall_s"),
                anchor_all=values("raytrain", "grow", "stall_s"),
                taiji_request_to_new_size_s=med("ray", "grow", "request_to_new_size_s"),
                anchor_request_to_new_size_s=med("raytrain", "grow", "request_to_new_size_s"),
                load=values("ray", "grow", "load") + values("raytrain", "grow", "load"),
            ),
        ),
        (
            {"ray", "join"},
            contract_row(
                "grow stall: taiji on Ray vs taiji join",
                ray_stall,
                join_stall,
                higher_is_better=False,
                unit="s",
                target="taiji <= anchor + 0.010 s",
                met=None if None in (ray_stall, join_stall) else ray_stall <= join_stall + 0.010,
                taiji_all=values("ray", "grow", "stall_s"),
                anchor_all=values("join", "grow", "stall_s"),
                taiji_request_to_new_size_s=med("ray", "grow", "request_to_new_size_s"),
                anchor_request_to_new_size_s=med("join", "grow", "request_to_new_size_s"),
                load=values("ray", "grow", "load") + values("join", "grow", "load"),
            ),
        ),
        (
            {"ray"},
            contract_row(
                "node loss → next committed step",
                med("ray", "node_loss", "resume_s"),
                anchor_loss or med("raytrain", "node_loss", "lower_bound_s"),
                higher_is_better=False,
                unit="s",
                target="taiji <= 0.5 s",
                anchor_side="Ray Train, raylet killed the same way",
                anchor_is_lower_bound=anchor_loss is None and bool(runs["raytrain"]),
                anchor_outcome=values("raytrain", "node_loss", "outcome"),
                taiji_all=values("ray", "node_loss", "resume_s"),
                taiji_join_agent_killed_s=med("join", "node_loss", "resume_s"),
                load=values("ray", "node_loss", "load") + values("raytrain", "node_loss", "load"),
            ),
        ),
        (
            {"ray", "join"},
            contract_row(
                "steady samples/s: taiji on Ray vs taiji join",
                med("ray", "steady_samples_s"),
                med("join", "steady_samples_s"),
                higher_is_better=True,
                target="ratio >= 0.98",
                taiji_all=values("ray", "steady_samples_s"),
                anchor_all=values("join", "steady_samples_s"),
                ray_train_samples_s=med("raytrain", "steady_samples_s"),
                load=values("ray", "steady_load") + values("join", "steady_load"),
            ),
        ),
    ]
    ran = {side for side, found in runs.items() if found}
    return [row for needed, row in rows if needed <= ran]


def main(argv=None) -> None:
    args = parse_args(argv)
    reap_on_sigterm()
    if skipped_without_hosts("ray_engine"):
        return
    if not ray_nodes.ray_installed():
        print(
            "# ray_engine: Ray is not installed (pip install 'taiji[ray]'); nothing measured", file=sys.stderr
        )
        print_result("ray_engine", [], skipped="Ray is not installed")
        return
    from taiji_harness.netns import EmulatedHosts

    base = Path(tempfile.mkdtemp(prefix="taiji-rayengine-"))
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        GLOO_SOCKET_IFNAME="eth0",
        OMP_NUM_THREADS="1",
        RAY_DEDUP_LOGS="0",
        **ray_nodes.auth_env(),
    )
    sides = {
        "ray": lambda *a: taiji_side(*a, on_ray=True),
        "join": lambda *a: taiji_side(*a, on_ray=False),
        "raytrain": raytrain_side,
    }
    order = [name for name in args.cases.split(",") if name in sides]
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    errors: list[str] = []
    try:
        for rep in range(args.reps):
            for name in order if rep % 2 == 0 else order[::-1]:
                out = base / f"{name}-{rep}"
                out.mkdir()
                t0 = time.monotonic()
                try:
                    with EmulatedHosts(2) as hosts:
                        runs[name].append(sides[name](args, hosts, out, env))
                except Exception:
                    errors.append(f"{name} rep {rep}: {traceback.format_exc(limit=3)}")
                print(
                    f"# {name} rep {rep}: {time.monotonic() - t0:.1f}s, load {load()}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"# run directories kept in {base}", file=sys.stderr)
    rows = rows_of(runs)
    for row in rows:
        print(
            f"# {row['case']}: taiji {row['taiji']}  anchor {row['anchor']}  ratio {row['ratio']}  "
            f"load {row['load']}",
            file=sys.stderr,
        )
    for error in errors:
        print(f"# error: {error}", file=sys.stderr)
    print_result("ray_engine", rows, reps=args.reps, quick=args.quick, errors=len(errors), details=runs)


if __name__ == "__main__":
    main()
