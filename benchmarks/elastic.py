"""Membership changes: taiji's elastic transitions vs torchrun's restart path, side by side.

One training script (``_elastic_train.py``: an MLP of 1.05M parameters, SGD with momentum,
global batch 64) runs under ``taiji run`` as a ``taiji.Job`` and under torchrun as plain
DDP that checkpoints after every step and resumes from the checkpoint when it starts. Every
process logs each committed step with its wall-clock time; all figures come from those logs.

- **grow 1->2, grow 2->4, shrink 4->2**: the stall of the workers that keep running, i.e.
  (first commit at the new size - last commit at the old size) - one normal step at the new
  size. taiji: one job; the parent asks its store for a new size (what ``taiji resize`` does);
  joiners boot while the others keep training, so their boot is not a stall. torchrun: the
  measured anchor is its restart path: stop the job (SIGTERM to torchrun) and start it again
  with the new size from the last checkpoint. Its own elastic scale-up (two agents, c10d
  rendezvous) is tried once in full mode and reported as what happened.
- **crash**: SIGKILL one of 2 workers; seconds from the kill to the next committed step of
  a survivor. taiji: the survivor retries the failed step alone (full mode also kills one of
  3). torchrun: ``--max-restarts 1`` restarts both workers from the checkpoint.
- **hang**: SIGSTOP one of 2 workers, collective timeout 2 s; seconds from the SIGSTOP to the
  next committed step. torchrun (full mode): the survivor's gloo timeout fails it, the agent
  stops the group (the stopped worker gets SIGKILL only after torchrun's shutdown timeout,
  30 s by default) and restarts. Quick mode reports a lower bound instead: timeout + the
  measured crash restart.

Repetitions alternate which side runs first; each row gives medians, every repetition's value
(``*_all``) and the parts the anchor's time is made of. Every launched job has a hard timeout
and is killed with its session (and any worker torchrun started) and reaped in ``finally``.

    .venv/bin/python benchmarks/elastic.py --quick      # one repetition, <= 90 s
    .venv/bin/python benchmarks/elastic.py              # 3 repetitions + extras, 7-9 min
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import median, print_result  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRAIN = HERE / "_elastic_train.py"
POLL_S = 0.01  # how often the parent re-reads the step logs while it waits


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, fewer extras (<= 90 s)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default: 1 quick, 3 full)")
    parser.add_argument("--warm", type=int, default=None, help="steps before the first change (default: 10 quick, 20 full)")
    parser.add_argument("--settle", type=int, default=None,
                        help="steps at a new size before the next change; their median is 'one normal step' "
                             "(default: 8 quick, 15 full)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--step-delay", type=float, default=0.01, help="simulated compute per step, seconds")
    parser.add_argument("--collective-timeout", type=float, default=30.0,
                        help="collective timeout of the resize and crash runs, both sides")
    parser.add_argument("--hang-timeout", type=float, default=2.0, help="collective timeout of the hang runs")
    parser.add_argument("--timeout", type=float, default=None,
                        help="hard limit per launched job, seconds (default: 45 quick, 150 full)")
    parser.add_argument("--elastic-wait", type=float, default=None,
                        help="how long to wait for torchrun's own elastic scale-up (default: 0 = not tried "
                             "in --quick, 75 in full mode, enough for its 60 s store timeout to fire)")
    parser.add_argument("--torchrun-hang", action=argparse.BooleanOptionalAction, default=None,
                        help="measure torchrun's hang recovery (default: full mode only)")
    parser.add_argument("--crash3", action=argparse.BooleanOptionalAction, default=None,
                        help="also kill one of 3 taiji workers (default: full mode only)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (step logs, launcher output)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.reps = args.reps or (1 if quick else 3)
    args.warm = args.warm or (10 if quick else 20)
    args.settle = args.settle or (8 if quick else 15)
    args.timeout = args.timeout or (45.0 if quick else 150.0)
    args.elastic_wait = (0.0 if quick else 75.0) if args.elastic_wait is None else args.elastic_wait
    args.torchrun_hang = (not quick) if args.torchrun_hang is None else args.torchrun_hang
    args.crash3 = (not quick) if args.crash3 is None else args.crash3
    if args.batch % 4 or args.settle < 3 or args.warm < 3:
        parser.error("--batch must divide by 4 (sizes 1, 2, 4); --settle and --warm at least 3")
    return args


# -- processes and their logs -------------------------------------------------------------

class StepLog:
    """Reads the JSON lines of ``OUT/<side>-<pid>.jsonl`` (complete lines only) while jobs run."""

    def __init__(self, out: Path, side: str):
        self.out, self.side = out, side
        self._offsets: dict[Path, int] = {}
        self.records: list[dict] = []
        self.pids: set[int] = set()

    def poll(self) -> None:
        for path in sorted(self.out.glob(f"{self.side}-*.jsonl")):
            self.pids.add(int(path.stem.rsplit("-", 1)[1]))
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            if end:
                self._offsets[path] = self._offsets.get(path, 0) + end
                self.records += [json.loads(line) for line in data[:end].splitlines() if line.strip()]

    def select(self, event: str, **match) -> list[dict]:
        found = [r for r in self.records if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]
        return sorted(found, key=lambda r: r.get("time", r.get("ready", 0.0)))


class Tree:
    """A launcher (``taiji run`` or torchrun) in its own session, output to a file.

    ``close()`` SIGKILLs its session and reaps it, then SIGKILLs any worker it started that is
    still alive (torchrun puts workers in sessions of their own), identified by pid from the
    step-log file names and checked against the command line before the signal."""

    def __init__(self, name: str, cmd: list[str], out: Path, env: dict, log: StepLog):
        self.name, self.log = name, log
        self.output = out / f"{name}.out"
        self._file = open(self.output, "w")
        self.started = time.time()
        self.popen = subprocess.Popen(cmd, stdout=self._file, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                      start_new_session=True)

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        return "".join(self.output.read_text(errors="replace").splitlines(keepends=True)[-lines:])

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=max(timeout, 0.001))

    def terminate(self, timeout: float) -> None:
        """SIGTERM the launcher (it stops its workers); SIGKILL its session after ``timeout``."""
        if self.running():
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.close()

    def close(self) -> None:
        if self.running():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait()
        self._file.close()
        self.log.poll()
        for pid in self.log.pids:
            kill_worker(pid, signal.SIGKILL)


def kill_worker(pid: int, sig: int) -> None:
    """Signal a training-script process of ours by pid (never anything else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if str(TRAIN).encode() not in f.read():
                return
        os.kill(pid, sig)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass


def wait_for(cond: Callable[[], object], log: StepLog, trees: list[Tree], deadline: float, what: str):
    """Poll the step logs until ``cond()`` is truthy (returned); fail if a launcher exits or
    the deadline passes."""
    while True:
        log.poll()
        value = cond()
        if value:
            return value
        for tree in trees:
            if not tree.running():
                raise RuntimeError(f"{tree.name} exited with {tree.popen.returncode} while waiting for {what}; "
                                   f"its output:\n{tree.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in time; output of {trees[-1].name if trees else '?'}:\n"
                               f"{trees[-1].tail() if trees else ''}")
        time.sleep(POLL_S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_args(args: argparse.Namespace, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAIN), str(out), "--batch", str(args.batch), "--step-delay", str(args.step_delay),
            *extra]


def taiji_cmd(args: argparse.Namespace, out: Path, nproc: int, timeout: float, job_id: str, *launcher: str) -> list[str]:
    return [sys.executable, "-m", "taiji.launch.cli", "run", "-np", str(nproc), "--timeout", str(timeout),
            "--job-id", job_id, "--run-dir", str(out / "run"), *launcher, "--", *train_args(args, out)]


def torchrun_cmd(nproc: int, *options: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--monitor-interval", "0.1", *options]


def steps(records: list[dict]) -> list[float]:
    """Seconds between consecutive commits."""
    return [b["time"] - a["time"] for a, b in zip(records, records[1:])]


def normal_step(after: list[dict], settle: int) -> float:
    """One normal step at a new size: the median interval between its commits, leaving out
    the first commit (which carries the change)."""
    return median(steps(after[:settle + 1])[1:])


# -- taiji ------------------------------------------------------------------------------------

def taiji_job_store(home: Path, job_id: str):
    from taiji.cluster.store import JobStore, connect_store
    info = json.loads((home / "jobs" / f"{job_id}.json").read_text())
    return JobStore(connect_store(info["host"], int(info["port"]), timeout=10.0), job_id)


def finish_taiji(tree: Tree, out: Path, deadline: float) -> int:
    (out / "stop").touch()  # rank 0 asks the Job to stop; every worker stops at the same step
    try:
        return tree.wait(deadline - time.monotonic())
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{tree.name} did not finish after the stop request:\n{tree.tail()}") from None


def taiji_resize(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """One job: 1 worker, grow to 2, grow to 4, shrink to 2."""
    job_id = f"bench{os.getpid()}{out.name}"
    home = out / "home"
    log = StepLog(out, "taiji")
    deadline = time.monotonic() + args.timeout
    tree = Tree("taiji-resize", taiji_cmd(args, out, 1, args.collective_timeout, job_id, "--max-np", "4"), out,
                dict(env, TAIJI_HOME=str(home)), log)
    try:
        w0 = lambda: log.select("commit", worker="w0")  # noqa: E731
        wait_for(lambda: len(w0()) >= args.warm, log, [tree], deadline, "warm-up steps")
        store = taiji_job_store(home, job_id)
        changes, version = [], w0()[-1]["version"]
        for size in (2, 4, 2):
            requested = time.time()
            store.propose(size, "benchmark")

            def landed() -> int | None:
                at = [c for c in w0() if c["version"] > version and c["size"] == size]
                return at[0]["version"] if len(at) >= args.settle else None
            new = wait_for(landed, log, [tree], deadline, f"{args.settle} steps at size {size}")
            changes.append({"to_version": new, "to_size": size, "requested": requested})
            version = new
        code = finish_taiji(tree, out, deadline)
        log.poll()
        return {"changes": [taiji_change(log, c, args.settle) for c in changes], "exit_code": code}
    finally:
        tree.close()


def taiji_change(log: StepLog, change: dict, settle: int) -> dict:
    to_v = change["to_version"]
    commits = log.select("commit")
    workers = sorted({c["worker"] for c in commits})
    stalls, transitions, firsts, per_worker, first_parts = [], [], [], {}, []
    joiners = []
    for w in workers:
        mine = [c for c in commits if c["worker"] == w]
        before = [c for c in mine if c["version"] < to_v]
        after = [c for c in mine if c["version"] == to_v]
        if not after:
            continue
        if not before:
            joiners.append(w)
            continue
        stall = after[0]["time"] - before[-1]["time"] - normal_step(after, settle)
        record = (after[0].get("transitions") or [{}])[-1]
        # where the first step at the new size spent its time, against a normal step there
        body = [c["time"] - c["began"] for c in after[1:settle + 1]]
        first_parts.append({"to_loop_s": after[0]["began"] - before[-1]["time"],
                            "first_step_body_s": after[0]["time"] - after[0]["began"],
                            "normal_step_body_s": median(body)})
        stalls.append(stall)
        firsts.append(after[0]["time"])
        transitions.append(record)
        per_worker[w] = round(stall, 4)
    boots = [b for b in log.select("boot") if b["worker"] in joiners]
    w0 = [c for c in commits if c["worker"] == "w0"]
    old = [c for c in w0 if c["version"] < to_v][-(settle + 1):]
    new = [c for c in w0 if c["version"] == to_v]
    return {
        "to_size": change["to_size"],
        "stall_s": max(stalls),
        "stall_s_by_worker": per_worker,
        "transition_total_s": max(t.get("total_s", 0.0) for t in transitions),
        "transition_switch_s": max(t.get("switch_s", 0.0) for t in transitions),
        "transition_sync_s": max(t.get("sync_s", 0.0) for t in transitions),
        # commit -> next step handed to the loop (transition included), and that step's own time
        "to_loop_s": max(f["to_loop_s"] for f in first_parts),
        "first_step_extra_s": max(f["first_step_body_s"] - f["normal_step_body_s"] for f in first_parts),
        # not a stall: joiners boot while the running workers keep training
        "request_to_new_size_s": min(firsts) - change["requested"],
        "steps_while_joiners_booted": sum(1 for c in w0 if change["requested"] < c["time"] < min(firsts)),
        "joiner_import_s": max((b["imported"] - b["exec"] for b in boots), default=None),
        "step_ms_before": median(steps(old)) * 1e3,
        "step_ms_after": normal_step(new, settle) * 1e3,
    }


def taiji_fault(args: argparse.Namespace, out: Path, env: dict, nproc: int, action: str) -> dict:
    """``nproc`` workers; SIGKILL (crash) or SIGSTOP (hang) w1; time until a survivor commits
    a step in the next cluster version."""
    timeout = args.hang_timeout if action == "hang" else args.collective_timeout
    job_id = f"bench{os.getpid()}{out.name}"
    log = StepLog(out, "taiji")
    deadline = time.monotonic() + args.timeout + timeout
    tree = Tree(f"taiji-{action}", taiji_cmd(args, out, nproc, timeout, job_id), out,
                dict(env, TAIJI_HOME=str(out / "home")), log)
    victim_pid = None
    try:
        def warm() -> bool:
            return all(len(log.select("commit", worker=f"w{r}")) >= args.warm for r in range(nproc))
        wait_for(warm, log, [tree], deadline, "warm-up steps")
        victim_pid = log.select("boot", worker="w1")[0]["pid"]
        survivors = [f"w{r}" for r in range(nproc) if r != 1]
        hit = time.time()
        kill_worker(victim_pid, signal.SIGSTOP if action == "hang" else signal.SIGKILL)

        def resumed() -> bool:
            return len([c for c in log.select("commit", worker="w0") if c["version"] > 1]) >= args.settle
        wait_for(resumed, log, [tree], deadline, "steps after the failure")
        code = finish_taiji(tree, out, deadline)
        log.poll()
        commits = [c for c in log.select("commit") if c["worker"] in survivors]
        after = [c for c in commits if c["version"] > 1]
        first = min(after, key=lambda c: c["time"])
        done = [c["step"] for c in commits if c["version"] == 1 and c["worker"] == "w0"]
        record = next((t for c in after for t in c.get("transitions", []) if t["reason"] == "failure"), {})
        w0_steps = [c["step"] for c in commits if c["worker"] == "w0"]
        return {
            "resume_s": first["time"] - hit,
            "to_size": first["size"],
            "last_committed_before": max(done),
            "retried_step": record.get("step"),
            "transition_total_s": record.get("total_s"),
            "committed_steps_redone": len(w0_steps) - len(set(w0_steps)),
            "step_ms": median(steps([c for c in commits if c["worker"] == "w0" and c["version"] == 1])) * 1e3,
            "exit_code": code,
        }
    finally:
        tree.close()
        if victim_pid is not None:
            kill_worker(victim_pid, signal.SIGKILL)


# -- torchrun ---------------------------------------------------------------------------------

def torchrun_resize(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """The restart path: run at 1, 2, 4, 2 workers in turn, each resuming from the checkpoint."""
    ckpt = out / "ckpt.pt"
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + 3 * args.timeout
    trees: list[Tree] = []
    changes: list[dict] = []
    try:
        for i, size in enumerate((1, 2, 4, 2)):
            change: dict = {"to_size": size, "tag": str(i)}
            if trees:
                change["requested"] = time.time()
                trees[-1].terminate(timeout=20.0)
                change["stopped"] = time.time()
            bcast = ["--measure-broadcast", "5"] if size > 1 else []
            cmd = torchrun_cmd(size, "--standalone", "--max-restarts", "0") + train_args(
                args, out, "--checkpoint", str(ckpt), "--tag", str(i), "--timeout", str(args.collective_timeout),
                *bcast)[1:]
            trees.append(Tree(f"torchrun-resize-{i}", cmd, out, env, log))
            change["agent_started"] = trees[-1].started
            need = args.warm if i == 0 else args.settle

            def ready() -> bool:
                return (len(log.select("commit", tag=str(i), rank=0)) >= need
                        and (size == 1 or bool(log.select("broadcast", tag=str(i)))))
            wait_for(ready, log, [trees[-1]], deadline, f"{need} steps at size {size}")
            changes.append(change)
        trees[-1].terminate(timeout=20.0)
        log.poll()
        return {"changes": [torchrun_change(log, c, args.settle) for c in changes[1:]]}
    finally:
        for tree in trees:
            tree.close()


def torchrun_change(log: StepLog, change: dict, settle: int) -> dict:
    tag, old_tag = change["tag"], str(int(change["tag"]) - 1)
    old = log.select("commit", tag=old_tag, rank=0)
    new = log.select("commit", tag=tag, rank=0)
    boots = log.select("boot", tag=tag)
    bcast = log.select("broadcast", tag=tag)
    first = new[0]["time"]
    exec_ = min(b["exec"] for b in boots)
    agent_boot = exec_ - change["agent_started"]
    request_to_first = first - change["requested"]
    return {
        "to_size": change["to_size"],
        "stall_s": first - old[-1]["time"] - normal_step(new, settle),
        "request_to_first_step_s": request_to_first,
        # what its pieces cost (seconds)
        "stop_s": change["stopped"] - change["requested"],
        "agent_boot_s": agent_boot,
        "worker_import_s": max(b["imported"] - b["exec"] for b in boots),
        "rendezvous_s": max(b["joined"] for b in boots) - max(b["imported"] for b in boots),
        "build_model_optimizer_s": max(b["built"] for b in boots) - max(b["joined"] for b in boots),
        "checkpoint_load_s": max(b["loaded"] for b in boots) - max(b["built"] for b in boots),
        "ddp_init_s": max(b["ready"] for b in boots) - max(b["loaded"] for b in boots),
        "first_step_s": first - max(b["ready"] for b in boots),
        # a resident elastic agent would not boot itself again
        "without_agent_boot_s": request_to_first - agent_boot,
        "resumed_at": boots[0]["resumed_at"],
        "last_committed_before": old[-1]["step"],
        "step_ms_before": median(steps(old[-(settle + 1):])) * 1e3,
        "step_ms_after": normal_step(new, settle) * 1e3,
        "broadcast_s": median(bcast[0]["seconds"]) if bcast else None,
        "broadcast_bytes": bcast[0]["bytes"] if bcast else None,
    }


def torchrun_fault(args: argparse.Namespace, out: Path, env: dict, action: str) -> dict:
    """2 workers, ``--max-restarts 1``; SIGKILL (crash) or SIGSTOP (hang) rank 1; time until
    the restarted group commits a step."""
    timeout = args.hang_timeout if action == "hang" else args.collective_timeout
    ckpt = out / "ckpt.pt"
    log = StepLog(out, "torchrun")
    deadline = time.monotonic() + args.timeout + timeout + (35.0 if action == "hang" else 0.0)
    cmd = torchrun_cmd(2, "--standalone", "--max-restarts", "1") + train_args(
        args, out, "--checkpoint", str(ckpt), "--timeout", str(timeout))[1:]
    tree = Tree(f"torchrun-{action}", cmd, out, env, log)
    victim_pid = None
    try:
        def warm() -> bool:
            return (len(log.select("commit", restart=0, rank=0)) >= args.warm
                    and bool(log.select("boot", restart=0, rank=1)))
        wait_for(warm, log, [tree], deadline, "warm-up steps")
        victim_pid = log.select("boot", restart=0, rank=1)[0]["pid"]
        hit = time.time()
        kill_worker(victim_pid, signal.SIGSTOP if action == "hang" else signal.SIGKILL)
        wait_for(lambda: len(log.select("commit", restart=1, rank=0)) >= args.settle, log, [tree], deadline,
                 "steps after the restart")
        tree.terminate(timeout=20.0)
        log.poll()
        before = log.select("commit", restart=0)
        after = log.select("commit", restart=1)
        boots = log.select("boot", restart=1)
        last = max(c["step"] for c in before)
        return {
            "resume_s": after[0]["time"] - hit,
            "last_committed_before": last,
            "resumed_at": boots[0]["resumed_at"],
            "committed_steps_redone": last + 1 - boots[0]["resumed_at"],
            "workers_restarted": len(boots),
            "kill_to_worker_exec_s": min(b["exec"] for b in boots) - hit,
            "worker_import_s": max(b["imported"] - b["exec"] for b in boots),
            "rendezvous_s": max(b["joined"] for b in boots) - max(b["imported"] for b in boots),
            "build_model_optimizer_s": max(b["built"] for b in boots) - max(b["joined"] for b in boots),
            "checkpoint_load_s": max(b["loaded"] for b in boots) - max(b["built"] for b in boots),
            "ddp_init_s": max(b["ready"] for b in boots) - max(b["loaded"] for b in boots),
            "first_step_s": after[0]["time"] - max(b["ready"] for b in boots),
            "step_ms": median(steps(log.select("commit", restart=0, rank=0))) * 1e3,
        }
    finally:
        tree.close()
        if victim_pid is not None:
            kill_worker(victim_pid, signal.SIGKILL)


def torchrun_elastic(args: argparse.Namespace, out: Path, env: dict) -> dict:
    """torchrun's own scale-up: agent A (--nnodes 1:2) trains alone; agent B joins through the
    c10d rendezvous. Reports what happened within ``--elastic-wait`` seconds."""
    log = StepLog(out, "torchrun")
    port = free_port()
    cmd = torchrun_cmd(1, "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                       "--rdzv-id", "bench", "--rdzv-conf", "last_call_timeout=1", "--max-restarts", "3") + \
        train_args(args, out, "--checkpoint", str(out / "ckpt.pt"), "--timeout", str(args.collective_timeout))[1:]
    env = dict(env, LOGLEVEL="INFO")
    deadline = time.monotonic() + args.timeout
    trees = [Tree("torchrun-elastic-A", cmd, out, env, log)]
    try:
        wait_for(lambda: len(log.select("commit", size=1)) >= args.warm, log, trees, deadline, "warm-up steps")
        requested = time.time()
        trees.append(Tree("torchrun-elastic-B", cmd, out, env, log))
        result: dict = {"config": "two agents, --nnodes 1:2 --nproc-per-node 1, c10d rendezvous on 127.0.0.1, "
                                  "last_call_timeout=1, --max-restarts 3", "waited_s": args.elastic_wait}
        try:
            wait_for(lambda: log.select("commit", size=2), log, trees, time.monotonic() + args.elastic_wait,
                     "step at size 2")
            first = log.select("commit", size=2)[0]["time"]
            result.update(outcome="scaled up", request_to_first_step_s=first - requested,
                          stall_s=first - max(c["time"] for c in log.select("commit", size=1)))
        except (TimeoutError, RuntimeError) as exc:
            last = max(c["time"] for c in log.select("commit", size=1))
            texts = {t.name: t.output.read_text(errors="replace") for t in trees}
            result.update(
                outcome="no step at size 2" + (" (an agent exited)" if isinstance(exc, RuntimeError) else ""),
                agent_a_detected_new_node="Detected 1 new nodes" in texts[trees[0].name],
                training_stopped_after_s=round(last - requested, 3),
                errors={name: [ln.strip()[-220:] for ln in text.splitlines() if "Error" in ln][-2:]
                        for name, text in texts.items()})
        return result
    finally:
        for tree in trees:
            tree.close()


# -- the report -------------------------------------------------------------------------------

def med(runs: list[dict], *path) -> float | None:
    values = []
    for run in runs:
        value = run
        for key in path:
            value = value[key] if value is not None else None
        if value is not None:
            values.append(value)
    return median(values) if values else None


def r(value, digits=4):
    return None if value is None else round(value, digits)


def every(runs: list[dict], *path) -> list:
    """Each repetition's value (rounded), to show the spread behind a median."""
    values = []
    for run in runs:
        value = run
        for key in path:
            value = value[key] if value is not None else None
        values.append(r(value))
    return values


def ratio(anchor, taiji):
    return None if anchor is None or taiji is None or taiji <= 0 else round(anchor / taiji, 2)


def build_rows(res: dict, elastic: dict | None, model: dict, args) -> list[dict]:
    rows = []
    tr, ar = res["taiji_resize"], res["torchrun_resize"]
    for i, (case, name) in enumerate([("grow 1->2", "grow"), ("grow 2->4", "grow"), ("shrink 4->2", "shrink")]):
        taiji = med(tr, "changes", i, "stall_s")
        anchor = med(ar, "changes", i, "stall_s")
        bcast = med(ar, "changes", i, "broadcast_s")
        row = {"case": f"{case}: stall of running workers (s)", "taiji": r(taiji), "anchor": r(anchor),
               "ratio": ratio(anchor, taiji), "taiji_all": every(tr, "changes", i, "stall_s"),
               "anchor_all": every(ar, "changes", i, "stall_s")}
        if name == "grow":
            target = None if bcast is None else 0.1 + bcast
            row.update(target_s=r(target), target="<= 0.1 s + state transfer at broadcast bandwidth",
                       state_transfer_s=r(bcast), state_bytes=model.get("train_state_bytes"),
                       broadcast_GBps=r(model.get("train_state_bytes", 0) / bcast / 1e9, 3) if bcast else None)
        else:
            target = 0.020
            row.update(target_s=target, target="<= 20 ms")
        row["target_met"] = None if taiji is None or target is None else taiji <= target
        row.update({
            "taiji_transition_total_s": r(med(tr, "changes", i, "transition_total_s")),
            "taiji_transition_sync_s": r(med(tr, "changes", i, "transition_sync_s")),
            "taiji_commit_to_next_step_s": r(med(tr, "changes", i, "to_loop_s")),
            "taiji_first_step_extra_s": r(med(tr, "changes", i, "first_step_extra_s")),
            "taiji_request_to_new_size_s": r(med(tr, "changes", i, "request_to_new_size_s"), 3),
            "taiji_steps_while_joiners_booted": med(tr, "changes", i, "steps_while_joiners_booted"),
            "taiji_step_ms_before_after": [r(med(tr, "changes", i, "step_ms_before"), 1),
                                           r(med(tr, "changes", i, "step_ms_after"), 1)],
            "anchor_kind": "torchrun restart path: SIGTERM the job, start it at the new size from the checkpoint",
            "anchor_request_to_first_step_s": r(med(ar, "changes", i, "request_to_first_step_s"), 3),
            "anchor_without_agent_boot_s": r(med(ar, "changes", i, "without_agent_boot_s"), 3),
            "ratio_without_agent_boot": ratio(med(ar, "changes", i, "without_agent_boot_s"), taiji),
            "anchor_parts_s": {k: r(med(ar, "changes", i, k), 3) for k in
                               ("stop_s", "agent_boot_s", "worker_import_s", "rendezvous_s",
                                "build_model_optimizer_s", "checkpoint_load_s", "ddp_init_s", "first_step_s")},
            "anchor_step_ms_before_after": [r(med(ar, "changes", i, "step_ms_before"), 1),
                                            r(med(ar, "changes", i, "step_ms_after"), 1)],
        })
        if i == 0:
            row["anchor_torchrun_elastic_scale_up"] = (elastic or {}).get("outcome", "not tried (--elastic-wait 0)")
        rows.append(row)

    tc, ac = res["taiji_crash"], res["torchrun_crash"]
    taiji, anchor = med(tc, "resume_s"), med(ac, "resume_s")
    row = {"case": "crash: SIGKILL 1 of 2 workers -> next committed step (s)", "taiji": r(taiji),
           "anchor": r(anchor), "ratio": ratio(anchor, taiji), "taiji_all": every(tc, "resume_s"),
           "anchor_all": every(ac, "resume_s"),
           "target_s": 0.3, "target": "<= 0.3 s, at most one step redone",
           "target_met": None if taiji is None else taiji <= 0.3,
           "taiji_continues_with": med(tc, "to_size"),
           "taiji_committed_steps_redone": med(tc, "committed_steps_redone"),
           "taiji_inflight_step_retried": all(run["retried_step"] == run["last_committed_before"] + 1 for run in tc)
           if tc else None,
           "taiji_step_ms": r(med(tc, "step_ms"), 1),
           "anchor_kind": "torchrun --max-restarts 1, checkpoint every step: both workers restart",
           "anchor_committed_steps_redone": med(ac, "committed_steps_redone"),
           "anchor_workers_restarted": med(ac, "workers_restarted"),
           "anchor_parts_s": {k: r(med(ac, k), 3) for k in
                              ("kill_to_worker_exec_s", "worker_import_s", "rendezvous_s",
                               "build_model_optimizer_s", "checkpoint_load_s", "ddp_init_s", "first_step_s")},
           "anchor_step_ms": r(med(ac, "step_ms"), 1)}
    if res["taiji_crash3"]:
        row["taiji_1_of_3_s"] = r(med(res["taiji_crash3"], "resume_s"))
        row["taiji_1_of_3_all_s"] = every(res["taiji_crash3"], "resume_s")
        row["taiji_1_of_3_continues_with"] = med(res["taiji_crash3"], "to_size")
    rows.append(row)

    th, ah = res["taiji_hang"], res["torchrun_hang"]
    taiji = med(th, "resume_s")
    target = args.hang_timeout + 0.3
    if ah:
        anchor, kind = med(ah, "resume_s"), ("torchrun --max-restarts 1, gloo timeout as taiji's; the agent "
                                             "SIGKILLs the stopped worker only after --shutdown-timeout (30 s)")
    else:
        crash = med(ac, "resume_s")
        anchor = None if crash is None else args.hang_timeout + crash
        kind = ("lower bound, not run: collective timeout + torchrun's measured crash restart (a real run also "
                "waits --shutdown-timeout, 30 s by default, before it SIGKILLs the stopped worker)")
    rows.append({"case": f"hang: SIGSTOP 1 of 2 workers, collective timeout {args.hang_timeout:g} s -> "
                         "next committed step (s)", "taiji": r(taiji), "anchor": r(anchor),
                 "ratio": ratio(anchor, taiji), "taiji_all": every(th, "resume_s"),
                 "anchor_all": every(ah, "resume_s"), "target_s": target,
                 "target": "<= collective timeout + 0.3 s", "target_met": None if taiji is None else taiji <= target,
                 "taiji_over_timeout_s": r(None if taiji is None else taiji - args.hang_timeout),
                 "anchor_kind": kind})
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAIJI_", "TORCHELASTIC_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    base = Path(tempfile.mkdtemp(prefix="taiji-bench-elastic-"))
    runners: dict[str, Callable[[Path], dict]] = {
        "taiji_resize": lambda out: taiji_resize(args, out, env),
        "torchrun_resize": lambda out: torchrun_resize(args, out, env),
        "taiji_crash": lambda out: taiji_fault(args, out, env, 2, "crash"),
        "torchrun_crash": lambda out: torchrun_fault(args, out, env, "crash"),
        "taiji_hang": lambda out: taiji_fault(args, out, env, 2, "hang"),
        "torchrun_hang": lambda out: torchrun_fault(args, out, env, "hang"),
        "taiji_crash3": lambda out: taiji_fault(args, out, env, 3, "crash"),
    }
    res: dict[str, list[dict]] = {name: [] for name in runners}
    errors: list[str] = []
    model: dict = {}

    def run(name: str, rep: int) -> None:
        out = base / f"{name}-{rep}"
        out.mkdir()
        t0 = time.monotonic()
        try:
            res[name].append(runners[name](out))
            print(f"# {name} rep {rep}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        except Exception as exc:  # one bad run must not hide the others: reported in the JSON
            errors.append(f"{name} rep {rep}: {type(exc).__name__}: {str(exc)[:1500]}")
            print(f"# {name} rep {rep} FAILED after {time.monotonic() - t0:.1f}s:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
        if not model:
            for path in sorted(out.glob("*-*.jsonl")):
                for line in path.read_text().splitlines():
                    record = json.loads(line)
                    if record.get("event") == "boot":
                        model.update({k: record[k] for k in ("params", "model_state_bytes", "train_state_bytes")})
                        break
                if model:
                    break

    elastic = None
    try:
        for rep in range(args.reps):
            pairs = [("taiji_resize", "torchrun_resize"), ("taiji_crash", "torchrun_crash"),
                     ("taiji_hang", "torchrun_hang" if args.torchrun_hang else None)]
            for pair in pairs:  # taiji first on even repetitions, the anchor first on odd ones
                for name in (pair if rep % 2 == 0 else pair[::-1]):
                    if name:
                        run(name, rep)
            if args.crash3:
                run("taiji_crash3", rep)
        if args.elastic_wait > 0:
            out = base / "torchrun_elastic"
            out.mkdir()
            t0 = time.monotonic()
            try:
                elastic = torchrun_elastic(args, out, env)
            except Exception as exc:
                elastic = {"outcome": f"attempt failed: {type(exc).__name__}: {str(exc)[:500]}"}
            print(f"# torchrun elastic scale-up attempt: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        rows = build_rows(res, elastic, model, args)
    finally:
        if args.keep:
            print(f"# run directories kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(f"# total {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print_result("elastic", rows, model={"mlp": "512-1024-512-10", **model, "global_batch": args.batch,
                                         "step_delay_s": args.step_delay},
                 torchrun_elastic_scale_up=elastic, errors=errors, reps=args.reps, quick=args.quick,
                 cpus=os.cpu_count(), raw=res if not args.quick else None)


if __name__ == "__main__":
    main()
