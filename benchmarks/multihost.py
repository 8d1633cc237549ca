"""Membership changes across hosts: taiji's agents vs torchrun multi-node, side by side, on
emulated hosts (network namespaces behind a bridge, taiji_harness/netns.py; needs root).

The same training script as ``benchmarks/elastic.py`` (``_elastic_train.py``: an MLP of 1.05M
parameters; taiji.Job under ``taiji run``, DDP with a checkpoint after every step under torchrun)
runs on host 0, then on hosts 0 and 1, one worker per host; gloo goes over each host's ``eth0``
(``GLOO_SOCKET_IFNAME``). All figures come from the processes' step logs.

- **grow onto a new host** — the stall of the worker that keeps running: (first commit at 2 workers
  - last commit at 1) - one normal step at 2. taiji: `taiji join` on host 1; the job grows when
  the joiner is ready. torchrun: its restart path across nodes: stop the one-node job and start a
  two-node one (c10d rendezvous hosted by host 0's agent), resuming from the checkpoint.
- **host loss** — seconds from SIGKILL of host 1's agent (its workers die with it) to the next
  committed step on host 0. taiji: the host is dropped in one version and the survivor retries
  the step. torchrun: `--nnodes 1:2 --max-restarts 1`: the surviving agent restarts its worker
  in a new rendezvous round, from the checkpoint. If it does not commit a step within
  ``--fault-wait`` seconds, the row reports that wait as a lower bound.
- **head loss** — SIGKILL of the launcher on host 0 (its worker dies with it) to the next
  committed step on host 1. taiji: the job store is an etcd server on host 2; host 1's agent takes
  over the controller and the survivor retries. torchrun: the same two-node job loses the agent
  that hosts its c10d rendezvous store; the row reports what happened within ``--fault-wait``.

- **agent loss / cut link at 5 workers** (``--cases faults``) — 5 workers on 3 hosts (1 + 2 + 2),
  collective timeout ``--fault-timeout`` (30 s) on both sides: SIGKILL of host 2's agent (2
  workers) → next committed step at 3; then host 1's link goes down → next committed step at 1.
  taiji with the TCP store and with ``--store etcd``; torchrun ``--nnodes 1:3`` restarting from
  its checkpoint (one anchor for both stores).

    .venv/bin/python benchmarks/multihost.py --quick     # one repetition, ~8 min
    .venv/bin/python benchmarks/multihost.py --quick --cases faults
    .venv/bin/python benchmarks/multihost.py --quick --cases preempt

- **preemption notice** (``--cases preempt``) — the same 5 workers on 3 hosts; host 2 is being
  reclaimed: SIGTERM to its agent (taiji: what `taiji drain` sends, ``--grace 30``; its workers
  leave at a step boundary as a planned shrink. torchrun: its agent stops its workers, the others
  restart without it from their checkpoint). Rows: the running workers' stall (the longest gap
  between rank 0's commits from the notice on, less one normal step) with the steps redone, and
  notice -> the host's agent gone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from taiji_harness.bench import contract_row, median, print_result, reap_on_sigterm  # noqa: E402
from taiji_harness.elastic_analysis import taiji_change_figures, torchrun_change_figures  # noqa: E402
from taiji_harness.elastic_runs import LaunchedJob, StepLog, train_args, wait_for  # noqa: E402
from taiji_harness.netns import EmulatedHosts, etcd_command, unavailable  # noqa: E402

PORT = 29400


def in_host(hosts: EmulatedHosts, i: int, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", hosts.ns(i), *argv]


def _kill_session(job: LaunchedJob) -> float:
    hit = time.time()
    os.killpg(job.session.popen.pid, signal.SIGKILL)
    return hit


CLI = [sys.executable, "-m", "taiji.launch.cli"]


def taiji_head(
    args: argparse.Namespace,
    hosts: EmulatedHosts,
    out: Path,
    env: dict,
    log: StepLog,
    job_id: str,
    *store: str,
    max_np: int = 2,
    timeout: float | None = None,
) -> LaunchedJob:
    """`taiji run` on host 0: one worker there, up to ``max_np`` in all."""
    return LaunchedJob(
        "taiji-head",
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
                str(max_np),
                "--host",
                hosts.address(0),
                *store,
                "--job-id",
                job_id,
                "--timeout",
                str(timeout or args.collective_timeout),
                "--liveness-timeout",
                "2",
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


def taiji_agent(
    hosts: EmulatedHosts,
    out: Path,
    env: dict,
    log: StepLog,
    job_id: str,
    store: str,
    host: int = 1,
    slots: int = 1,
    extra: tuple[str, ...] = (),
) -> LaunchedJob:
    """`taiji join` on ``host`` with ``slots`` slots."""
    return LaunchedJob(
        f"taiji-agent{host}",
        in_host(
            hosts,
            host,
            [
                *CLI,
                "join",
                f"{job_id}@{store}",
                "--secret-file",
                str(out / "home" / "jobs" / f"{job_id}.secret"),
                "--nproc-per-node",
                str(slots),
                "--host",
                hosts.address(host),
                "--timeout",
                "5",
                *extra,
            ],
        ),
        out,
        env,
        log,
    )


def taiji_side(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    log = StepLog(out, "taiji")
    job_id = "jbench"
    env = dict(env, TAIJI_HOME=str(out / "home"))
    deadline = time.monotonic() + args.timeout
    head = taiji_head(args, hosts, out, env, log, job_id, "--port", str(PORT))
    jobs = [head]
    try:

        def w0(version: int | None = None) -> list[dict]:
            return [
                c for c in log.select("commit", worker="w0") if version is None or c["version"] == version
            ]

        wait_for(lambda: len(w0()) >= args.warm, log, jobs, deadline, "warm-up steps")
        requested = time.time()
        agent = taiji_agent(hosts, out, env, log, job_id, f"{hosts.address(0)}:{PORT}")
        jobs.append(agent)
        wait_for(lambda: len(w0(2)) >= args.settle, log, jobs, deadline, f"{args.settle} steps on two hosts")
        grow = taiji_change_figures(
            log.records, {"to_version": 2, "to_size": 2, "requested": requested}, args.settle
        )
        hit = _kill_session(agent)
        first = wait_for(
            lambda: [c for c in w0() if c["version"] > 2 and c["time"] > hit],
            log,
            [head],
            deadline,
            "a step after the host loss",
        )[0]
        (out / "stop").touch()
        head.session.wait(max(deadline - time.monotonic(), 1.0))
        return {
            "grow": grow,
            "host_loss": {
                "resume_s": first["time"] - hit,
                "to_size": first["size"],
                "step_ms": median(b["time"] - a["time"] for a, b in zip(w0(1), w0(1)[1:])) * 1e3,
            },
        }
    finally:
        for job in jobs:
            job.close()


def taiji_head_loss(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    log = StepLog(out, "taiji")
    job_id = "jhead"
    env = dict(env, TAIJI_HOME=str(out / "home"))
    deadline = time.monotonic() + args.timeout
    store = f"etcd://{hosts.address(2)}:2379"
    etcd = LaunchedJob(
        "etcd", in_host(hosts, 2, etcd_command(hosts.address(2), str(out / "etcd-data"))), out, env, log
    )
    jobs = [etcd]
    try:
        head = taiji_head(args, hosts, out, env, log, job_id, "--store", store)
        jobs.append(head)
        wait_for(
            lambda: len(log.select("commit", worker="w0")) >= args.warm, log, jobs, deadline, "warm-up steps"
        )
        agent = taiji_agent(hosts, out, env, log, job_id, store)
        jobs.append(agent)
        wait_for(
            lambda: len(log.select("commit", worker="w1")) >= args.settle,
            log,
            jobs,
            deadline,
            f"{args.settle} steps on two hosts",
        )
        hit = _kill_session(head)  # closed at the end only: closing kills every pid in the step logs
        # a step already past its allreduce may still commit after the kill: count the new version's
        first = wait_for(
            lambda: [c for c in log.select("commit", worker="w1") if c["version"] > 2],
            log,
            [etcd, agent],
            deadline,
            "a step after the head's loss",
        )[0]
        (out / "stop").touch()
        agent.session.wait(max(deadline - time.monotonic(), 1.0))
        return {"resume_s": first["time"] - hit, "to_size": first["size"]}
    finally:
        for job in jobs:
            job.close()


def torchrun_head_loss(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + args.timeout
    jobs = [
        LaunchedJob(
            f"torchrun-h{i}", torchrun_cmd(hosts, i, "1:2", PORT + 3, args, out, "h", 1), out, env, log
        )
        for i in (0, 1)
    ]
    try:
        wait_for(
            lambda: len(log.select("commit", tag="h", rank=0, size=2)) >= args.settle,
            log,
            jobs,
            deadline,
            f"{args.settle} steps on two hosts",
        )
        hit = _kill_session(jobs[0])  # closed at the end only: closing kills every pid in the step logs
        try:
            first = wait_for(
                lambda: [c for c in log.select("commit", tag="h") if c.get("restart", 0) > 0],
                log,
                jobs[1:],
                time.monotonic() + args.fault_wait,
                "a step after the head's loss",
            )[0]
            return {"resume_s": first["time"] - hit, "outcome": "resumed"}
        except (TimeoutError, RuntimeError) as exc:
            died = isinstance(exc, RuntimeError)
            return {
                "resume_s": None,
                "lower_bound_s": args.fault_wait,
                "outcome": "the job died with its rendezvous host (host 1's agent exited)"
                if died
                else f"no step within {args.fault_wait:g}s",
            }
    finally:
        for job in jobs:
            job.close()


def torchrun_cmd(
    hosts: EmulatedHosts,
    i: int,
    nnodes: str,
    rdzv_port: int,
    args: argparse.Namespace,
    out: Path,
    tag: str,
    restarts: int,
    nproc: int = 1,
    timeout: float | None = None,
) -> list[str]:
    conf = "is_host=1,last_call_timeout=3" if i == 0 else "is_host=0,last_call_timeout=3"
    return in_host(
        hosts,
        i,
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{hosts.address(0)}:{rdzv_port}",
            "--rdzv-id",
            f"b{tag}",
            "--rdzv-conf",
            conf,
            "--local-addr",
            hosts.address(i),
            "--max-restarts",
            str(restarts),
            "--monitor-interval",
            "0.1",
            *train_args(
                args,
                out,
                "--checkpoint",
                str(out / "ckpt.pt"),
                "--tag",
                tag,
                "--timeout",
                str(timeout or args.collective_timeout),
            )[1:],
        ],
    )


# 5 workers on 3 hosts: host 0 runs 1 (the launcher's, rank 0), hosts 1 and 2 run 2 each
FAULT_SLOTS = (1, 2, 2)


def _after(commits: list[dict], since: float, size: int) -> list[dict]:
    return [c for c in commits if c["time"] > since and c["size"] == size]


def taiji_faults(
    args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict, store: str = "tcp"
) -> dict:
    """5 workers on 3 hosts (collective timeout ``--fault-timeout``): SIGKILL host 2's agent (2
    workers) -> next commit at 3; then host 1's link goes down -> next commit at 1. ``store``: the
    launcher's TCPStore, or ``etcd`` (an etcd server beside the launcher)."""
    log = StepLog(out, "taiji")
    job_id = "jfault"
    env = dict(env, TAIJI_HOME=str(out / "home"))
    deadline = time.monotonic() + args.timeout
    jobs = [
        taiji_head(
            args,
            hosts,
            out,
            env,
            log,
            job_id,
            "--port",
            str(PORT),
            "--store",
            store,
            max_np=sum(FAULT_SLOTS),
            timeout=args.fault_timeout,
        )
    ]
    where = f"etcd://{hosts.address(0)}:{PORT}" if store == "etcd" else f"{hosts.address(0)}:{PORT}"
    try:

        def w0() -> list[dict]:
            return log.select("commit", worker="w0")

        wait_for(lambda: len(w0()) >= args.warm, log, jobs, deadline, "warm-up steps")
        agents = {
            i: taiji_agent(hosts, out, env, log, job_id, where, host=i, slots=FAULT_SLOTS[i]) for i in (1, 2)
        }
        jobs += list(agents.values())
        wait_for(
            lambda: len(_after(w0(), 0, 5)) >= args.settle, log, jobs, deadline, f"{args.settle} steps at 5"
        )
        step_ms = (
            median(b["time"] - a["time"] for a, b in zip(_after(w0(), 0, 5), _after(w0(), 0, 5)[1:])) * 1e3
        )
        killed = _kill_session(agents[2])
        lost = wait_for(
            lambda: _after(w0(), killed, 3), log, jobs[:2], deadline, "a step at 3 after the agent loss"
        )[0]
        wait_for(
            lambda: len(_after(w0(), killed, 3)) >= args.settle,
            log,
            jobs[:2],
            deadline,
            f"{args.settle} steps at 3",
        )
        cut = time.time()
        hosts.link_down(1)
        first = wait_for(
            lambda: _after(w0(), cut, 1), log, jobs[:1], deadline, "a step at 1 after the cut link"
        )[0]
        (out / "stop").touch()
        jobs[0].session.wait(max(deadline - time.monotonic(), 1.0))
        recoveries = recovery_phases(out / "run" / "events.jsonl")
        return {
            "agent_loss": {"resume_s": lost["time"] - killed, "killed": killed, "phases": recoveries.get(3)},
            "cut_link": {"resume_s": first["time"] - cut, "phases": recoveries.get(1)},
            "step_ms": step_ms,
        }
    finally:
        for job in jobs:
            job.close()


def recovery_phases(events: Path, kind: str = "recovery") -> dict[int, dict]:
    """Rank 0's recoveries (or ``kind="resize"``: planned resizes) in the run log, by the size
    moved to: where each one's time went (a recovery: the failed attempt -> failure seen -> next
    config; both: -> switch -> groups -> state sync)."""
    found = {}
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        if event.get("kind") == kind:
            found[event["size"]] = dict(event.get("phases", {}), total=round(event["seconds"], 4))
    return found


def _stall(commits: list[dict], since: float, step_ms: float) -> tuple[float, int]:
    """The longest gap between two of rank 0's commits from the last one before ``since`` on,
    less one normal step (ms); and how many step indices were committed more than once."""
    before = [c for c in commits if c["time"] <= since][-1:]
    around = before + [c for c in commits if c["time"] > since]
    gap = max((b["time"] - a["time"] for a, b in zip(around, around[1:])), default=0.0) * 1e3
    steps = [c["step"] for c in commits]
    return round(gap - step_ms, 2), len(steps) - len(set(steps))


def taiji_preempt(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    """5 workers on 3 hosts; host 2 is being reclaimed: SIGTERM to its agent (what `taiji drain`
    sends) with ``--grace 30``. Notice -> the agent gone; the running workers' stall; steps redone."""
    log = StepLog(out, "taiji")
    job_id = "jpre"
    env = dict(env, TAIJI_HOME=str(out / "home"))
    deadline = time.monotonic() + args.timeout
    jobs = [
        taiji_head(
            args,
            hosts,
            out,
            env,
            log,
            job_id,
            "--port",
            str(PORT),
            max_np=sum(FAULT_SLOTS),
            timeout=args.fault_timeout,
        )
    ]
    try:

        def w0() -> list[dict]:
            return log.select("commit", worker="w0")

        wait_for(lambda: len(w0()) >= args.warm, log, jobs, deadline, "warm-up steps")
        agents = {
            i: taiji_agent(
                hosts,
                out,
                env,
                log,
                job_id,
                f"{hosts.address(0)}:{PORT}",
                host=i,
                slots=FAULT_SLOTS[i],
                extra=("--grace", "30"),
            )
            for i in (1, 2)
        }
        jobs += list(agents.values())
        wait_for(
            lambda: len(_after(w0(), 0, 5)) >= args.settle, log, jobs, deadline, f"{args.settle} steps at 5"
        )
        at5 = _after(w0(), 0, 5)
        step_ms = median(b["time"] - a["time"] for a, b in zip(at5, at5[1:])) * 1e3
        noticed = time.time()
        os.kill(agents[2].session.pid, signal.SIGTERM)
        code = agents[2].session.wait(max(deadline - time.monotonic(), 1.0))
        gone = time.time()
        wait_for(
            lambda: len(_after(w0(), noticed, 3)) >= args.settle,
            log,
            jobs[:2],
            deadline,
            f"{args.settle} steps at 3",
        )
        stall_ms, redone = _stall(w0(), noticed, step_ms)
        (out / "stop").touch()
        jobs[0].session.wait(max(deadline - time.monotonic(), 1.0))
        return {
            "gone_s": gone - noticed,
            "agent_exit": code,
            "stall_ms": stall_ms,
            "redone": redone,
            "step_ms": step_ms,
            "phases": recovery_phases(out / "run" / "events.jsonl", "resize").get(3),
        }
    finally:
        for job in jobs:
            job.close()


def torchrun_preempt(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    """The same notice under torchrun (`--nnodes 1:3`, a checkpoint every step): SIGTERM to host
    2's agent; the others restart in a new rendezvous round without it."""
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + args.timeout + args.fault_wait
    jobs = [
        LaunchedJob(
            f"torchrun-p{i}",
            torchrun_cmd(hosts, i, "1:3", PORT + 5, args, out, "p", 3, FAULT_SLOTS[i], args.fault_timeout),
            out,
            env,
            log,
        )
        for i in range(3)
    ]
    try:

        def r0() -> list[dict]:
            return log.select("commit", tag="p", rank=0)

        wait_for(
            lambda: len(_after(r0(), 0, 5)) >= args.settle, log, jobs, deadline, f"{args.settle} steps at 5"
        )
        at5 = _after(r0(), 0, 5)
        step_ms = median(b["time"] - a["time"] for a, b in zip(at5, at5[1:])) * 1e3
        noticed = time.time()
        os.kill(jobs[2].session.pid, signal.SIGTERM)
        jobs[2].session.wait(max(deadline - time.monotonic(), 1.0))
        gone = time.time()
        try:
            wait_for(
                lambda: len(_after(r0(), noticed, 3)) >= args.settle,
                log,
                jobs[:2],
                min(deadline, time.monotonic() + args.fault_wait),
                f"{args.settle} steps at 3",
            )
        except (TimeoutError, RuntimeError):
            return {
                "gone_s": gone - noticed,
                "stall_ms": None,
                "lower_bound_ms": args.fault_wait * 1e3,
                "outcome": f"no step at 3 within {args.fault_wait:g}s",
            }
        stall_ms, redone = _stall(r0(), noticed, step_ms)
        return {
            "gone_s": gone - noticed,
            "stall_ms": stall_ms,
            "redone": redone,
            "step_ms": step_ms,
            "outcome": "restarted at 3",
        }
    finally:
        for job in jobs:
            job.close()


def torchrun_faults(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    """The same 5 workers on 3 hosts under torchrun (`--nnodes 1:3`, restarts from a checkpoint
    written every step, the same collective timeout): host 2's agent killed, then host 1's link
    down; each row waits ``--fault-wait`` seconds at most for the next commit."""
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + args.timeout + 2 * args.fault_wait
    jobs = [
        LaunchedJob(
            f"torchrun-f{i}",
            torchrun_cmd(hosts, i, "1:3", PORT + 4, args, out, "f", 3, FAULT_SLOTS[i], args.fault_timeout),
            out,
            env,
            log,
        )
        for i in range(3)
    ]
    result: dict = {}
    try:

        def r0() -> list[dict]:
            return log.select("commit", tag="f", rank=0)

        wait_for(
            lambda: len(_after(r0(), 0, 5)) >= args.settle, log, jobs, deadline, f"{args.settle} steps at 5"
        )
        cases = [
            ("agent_loss", 3, lambda: _kill_session(jobs[2]), jobs[:2]),
            ("cut_link", 1, lambda: (hosts.link_down(1), time.time())[1], jobs[:1]),
        ]
        for name, size, fault, alive in cases:
            hit = fault()
            try:
                first = wait_for(
                    lambda hit=hit, size=size: _after(r0(), hit, size),
                    log,
                    alive,
                    min(deadline, time.monotonic() + args.fault_wait),
                    f"a step at {size} after {name}",
                )[0]
                result[name] = {"resume_s": first["time"] - hit, "outcome": f"restarted at {size}"}
            except (TimeoutError, RuntimeError) as exc:
                result[name] = {
                    "resume_s": None,
                    "lower_bound_s": args.fault_wait,
                    "outcome": f"no step at {size} within {args.fault_wait:g}s"
                    + (" (the surviving agents exited)" if isinstance(exc, RuntimeError) else ""),
                }
                break
            wait_for(
                lambda hit=hit, size=size: len(_after(r0(), hit, size)) >= args.settle,
                log,
                alive,
                deadline,
                f"{args.settle} steps at {size}",
            )
        return result
    finally:
        for job in jobs:
            job.close()


def torchrun_side(args: argparse.Namespace, hosts: EmulatedHosts, out: Path, env: dict) -> dict:
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + args.timeout + args.fault_wait
    jobs: list[LaunchedJob] = []
    try:
        jobs.append(
            LaunchedJob("torchrun-0", torchrun_cmd(hosts, 0, "1", PORT + 1, args, out, "0", 0), out, env, log)
        )
        wait_for(
            lambda: len(log.select("commit", tag="0", rank=0)) >= args.warm,
            log,
            jobs,
            deadline,
            "warm-up steps",
        )
        change = {"to_size": 2, "tag": "1", "requested": time.time()}
        jobs[0].session.terminate(20.0)
        change["stopped"] = time.time()
        jobs.pop(0).close()
        # two agents; 1:2 nodes and one restart allowed, so the same job can then lose host 1
        jobs = [
            LaunchedJob(
                f"torchrun-1-h{i}", torchrun_cmd(hosts, i, "1:2", PORT + 2, args, out, "1", 1), out, env, log
            )
            for i in (0, 1)
        ]
        change["agent_started"] = jobs[0].started
        wait_for(
            lambda: len([c for c in log.select("commit", tag="1", rank=0, size=2)]) >= args.settle,
            log,
            jobs,
            deadline,
            f"{args.settle} steps on two hosts",
        )
        grow = torchrun_change_figures(log.records, change, args.settle)
        hit = _kill_session(jobs[1])  # closed at the end only: closing kills every pid in the step logs
        loss: dict = {}
        try:
            first = wait_for(
                lambda: [
                    c for c in log.select("commit", tag="1", rank=0) if c["time"] > hit and c.get("size") == 1
                ],
                log,
                jobs[:1],
                time.monotonic() + args.fault_wait,
                "a step after the host loss",
            )[0]
            loss = {"resume_s": first["time"] - hit, "outcome": "restarted on one host"}
        except (TimeoutError, RuntimeError) as exc:
            loss = {
                "resume_s": None,
                "lower_bound_s": args.fault_wait,
                "outcome": f"no step within {args.fault_wait:g}s"
                + (" (the surviving agent exited)" if isinstance(exc, RuntimeError) else ""),
            }
        jobs[0].session.terminate(10.0)
        return {"grow": grow, "host_loss": loss}
    finally:
        for job in jobs:
            job.close()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition (~2 min)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default: 1 quick, 3 full)")
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--settle", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.01)
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=5.0,
        help="collective timeout, both sides (a lost host is noticed within it at worst)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="hard limit per side, seconds")
    parser.add_argument(
        "--fault-wait",
        type=float,
        default=60.0,
        help="how long to wait for torchrun to commit a step after the host loss",
    )
    parser.add_argument(
        "--fault-timeout",
        type=float,
        default=30.0,
        help="collective timeout, both sides, in the 5-worker agent-loss and cut-link runs",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--cases",
        default="grow,head,faults,preempt",
        help="which runs (comma-separated): grow (grow + host loss), head (head loss, needs "
        "etcd), faults (agent loss and cut link at 5 workers), faults_etcd (taiji's side of faults "
        "on the etcd store alone), faults_tcp (taiji's side on the TCP store alone), preempt "
        "(a notice to one of 3 hosts)",
    )
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    return args


def skipped_without_hosts(benchmark: str) -> bool:
    """Where no emulated hosts can be made (not root, no iproute2): say so, print an empty result."""
    why = unavailable()
    if why:
        print(f"# {benchmark}: no emulated hosts here ({why}); nothing measured", file=sys.stderr)
        print_result(benchmark, [], skipped=why)
    return bool(why)


def main(argv=None) -> None:
    args = parse_args(argv)
    reap_on_sigterm()
    if skipped_without_hosts("multihost"):
        return
    base = Path(tempfile.mkdtemp(prefix="taiji-multihost-"))
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        GLOO_SOCKET_IFNAME="eth0",
        OMP_NUM_THREADS="1",
    )
    runs: dict[str, list[dict]] = {
        "taiji": [],
        "torchrun": [],
        "taiji_head": [],
        "torchrun_head": [],
        "taiji_faults": [],
        "torchrun_faults": [],
        "taiji_faults_etcd": [],
        "taiji_preempt": [],
        "torchrun_preempt": [],
    }
    errors: list[str] = []
    try:
        for rep in range(args.reps):
            cases = args.cases.split(",")
            order = [("taiji", taiji_side), ("torchrun", torchrun_side)] if "grow" in cases else []
            if "faults" in cases:
                order += [("taiji_faults", taiji_faults), ("torchrun_faults", torchrun_faults)]
            elif "faults_tcp" in cases:
                order += [("taiji_faults", taiji_faults)]
            if ("faults" in cases or "faults_etcd" in cases) and shutil.which("etcd"):
                order += [("taiji_faults_etcd", lambda *a: taiji_faults(*a, store="etcd"))]
            if "head" in cases and shutil.which("etcd"):
                order += [("taiji_head", taiji_head_loss), ("torchrun_head", torchrun_head_loss)]
            if "preempt" in cases:
                order += [("taiji_preempt", taiji_preempt), ("torchrun_preempt", torchrun_preempt)]
            for name, side in order if rep % 2 == 0 else order[::-1]:
                out = base / f"{name}-{rep}"
                out.mkdir()
                t0 = time.monotonic()
                try:
                    with EmulatedHosts(3) as hosts:
                        runs[name].append(side(args, hosts, out, env))
                except Exception:
                    errors.append(f"{name} rep {rep}: {traceback.format_exc(limit=3)}")
                print(f"# {name} rep {rep}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"# run directories kept in {base}", file=sys.stderr)

    def med(side: str, *path: str) -> float | None:
        values = []
        for run in runs[side]:
            value = run
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                values.append(value)
        return round(median(values), 4) if values else None

    rows = []
    if runs["taiji"] or runs["torchrun"]:
        rows += [
            contract_row(
                "grow onto a new host: stall of running workers (s)",
                med("taiji", "grow", "stall_s"),
                med("torchrun", "grow", "stall_s"),
                higher_is_better=False,
                taiji_all=[r["grow"]["stall_s"] for r in runs["taiji"]],
                anchor_all=[r["grow"]["stall_s"] for r in runs["torchrun"]],
            ),
            contract_row(
                "host loss: kill -> next committed step (s)",
                med("taiji", "host_loss", "resume_s"),
                med("torchrun", "host_loss", "resume_s") or med("torchrun", "host_loss", "lower_bound_s"),
                higher_is_better=False,
                anchor_outcome=[r["host_loss"]["outcome"] for r in runs["torchrun"]],
                anchor_is_lower_bound=med("torchrun", "host_loss", "resume_s") is None,
            ),
        ]
    for side, case, label in (
        (
            "taiji_faults",
            "agent_loss",
            "agent loss, 2 of 5 workers on 3 hosts: kill -> next committed step (s)",
        ),
        ("taiji_faults", "cut_link", "cut link, host of 2 workers: link down -> next committed step (s)"),
        (
            "taiji_faults_etcd",
            "agent_loss",
            "agent loss, 2 of 5 workers, etcd store: kill -> next committed step (s)",
        ),
        (
            "taiji_faults_etcd",
            "cut_link",
            "cut link, host of 2 workers, etcd store: link down -> next committed step (s)",
        ),
    ):
        anchor = med("torchrun_faults", case, "resume_s")
        if not runs[side]:
            continue
        rows.append(
            contract_row(
                label,
                med(side, case, "resume_s"),
                anchor or med("torchrun_faults", case, "lower_bound_s"),
                higher_is_better=False,
                anchor_outcome=[r.get(case, {}).get("outcome") for r in runs["torchrun_faults"]],
                anchor_is_lower_bound=anchor is None,
                collective_timeout_s=args.fault_timeout,
            )
        )
    if runs["taiji_head"] or runs["torchrun_head"]:
        rows.append(
            contract_row(
                "head loss (etcd store on a third host): kill -> next committed step (s)",
                med("taiji_head", "resume_s"),
                med("torchrun_head", "resume_s") or med("torchrun_head", "lower_bound_s"),
                higher_is_better=False,
                anchor_outcome=[r["outcome"] for r in runs["torchrun_head"]],
                anchor_is_lower_bound=med("torchrun_head", "resume_s") is None,
            )
        )
    if runs["taiji_preempt"] or runs["torchrun_preempt"]:
        anchor = med("torchrun_preempt", "stall_ms")
        rows.append(
            contract_row(
                "preemption notice on one of 3 hosts: running workers' stall (ms)",
                med("taiji_preempt", "stall_ms"),
                anchor or med("torchrun_preempt", "lower_bound_ms"),
                higher_is_better=False,
                target="taiji <= 50 ms, 0 steps redone",
                steps_redone=[r["redone"] for r in runs["taiji_preempt"]],
                anchor_steps_redone=[r.get("redone") for r in runs["torchrun_preempt"]],
                anchor_outcome=[r.get("outcome") for r in runs["torchrun_preempt"]],
                anchor_is_lower_bound=anchor is None,
            )
        )
        rows.append(
            contract_row(
                "preemption notice on one of 3 hosts: notice -> host gone (s)",
                med("taiji_preempt", "gone_s"),
                med("torchrun_preempt", "gone_s"),
                higher_is_better=False,
                agent_exit=[r["agent_exit"] for r in runs["taiji_preempt"]],
            )
        )
    for row in rows:
        print(
            f"# {row['case']}: taiji {row['taiji']}  torchrun {row['anchor']}  ratio {row['ratio']}",
            file=sys.stderr,
        )
    for error in errors:
        print(f"# error: {error}", file=sys.stderr)
    print_result("multihost", rows, reps=args.reps, quick=args.quick, errors=len(errors), details=runs)


if __name__ == "__main__":
    main()
