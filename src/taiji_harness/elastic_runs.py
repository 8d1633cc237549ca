"""What the sides of ``benchmarks/elastic.py`` share: the training script's command line (also
under torchrun), the step logs its processes write (read while a job runs), a launched job, and
waiting on its logs."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from taiji_harness.bench import Session, signal_if_ours
from taiji_harness.elastic_analysis import select

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "benchmarks" / "_elastic_train.py"
POLL_S = 0.01  # how often the parent re-reads the step logs while it waits


class StepLog:
    """The complete JSON lines of ``OUT/<side>-<pid>.jsonl`` so far (``side`` may be ``*``)."""

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
        return select(self.records, event, **match)


class LaunchedJob:
    """A launcher (``taiji run`` or torchrun) in a session of its own, output to ``OUT/<name>.out``.

    ``close()`` kills and reaps the session, then SIGKILLs every training process of this run
    that is still alive (torchrun starts its workers in sessions of their own), by the pids in
    the step logs' names, each checked to be a process of this run's directory first."""

    def __init__(self, name: str, cmd: list[str], out: Path, env: dict, log: StepLog):
        self.name, self.out, self.log = name, out, log
        self.session = Session(cmd, output=out / f"{name}.out", env=env, cwd=REPO, name=name)

    @property
    def started(self) -> float:
        return self.session.started

    def signal_worker(self, pid: int, sig: int) -> None:
        signal_if_ours(pid, sig, str(self.out))

    def close(self) -> None:
        self.session.close()
        self.log.poll()
        for pid in self.log.pids:
            self.signal_worker(pid, signal.SIGKILL)


def wait_for(
    condition: Callable[[], object], log: StepLog, jobs: list[LaunchedJob], deadline: float, what: str
):
    """Re-read the step logs until ``condition()`` is truthy, and return it; fail if a launcher
    exits or the deadline (``time.monotonic``) passes first."""
    while True:
        log.poll()
        value = condition()
        if value:
            return value
        for job in jobs:
            if not job.session.running():
                raise RuntimeError(
                    f"{job.name} exited with {job.session.returncode} while waiting for {what}; "
                    f"its output:\n{job.session.tail()}"
                )
        if time.monotonic() > deadline:
            last = jobs[-1] if jobs else None
            raise TimeoutError(
                f"no {what} in time; output of {last.name if last else '?'}:\n"
                f"{last.session.tail() if last else ''}"
            )
        time.sleep(POLL_S)


def steady_options(
    parser: argparse.ArgumentParser, quick_steps: int, full_steps: int, timeout: float, argv=None
) -> argparse.Namespace:
    """The options of a steady-state comparison of two ``taiji run -np 2`` sides (store_cost,
    metrics_overhead; each adds its own ``--quick``): repetitions, measured steps after a warm-up,
    batch, step delay, timeout."""
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run")
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=timeout)
    args = parser.parse_args(argv)
    args.reps = args.reps or (2 if args.quick else 5)
    args.steps = args.steps or (quick_steps if args.quick else full_steps)
    return args


def steady_commits(
    args: argparse.Namespace, job: LaunchedJob, log: StepLog, at: Callable[[str], None] = lambda mark: None
) -> list[dict]:
    """Wait for the job to commit ``warm + steps`` steps and end; rank 0's commits after the
    warm-up. ``at("warm")`` and ``at("end")`` are called as the warm-up and the last step are seen."""
    deadline = time.monotonic() + args.timeout
    for mark, count in (("warm", args.warm), ("end", args.warm + args.steps)):
        wait_for(
            lambda count=count: len(log.select("commit", worker="w0")) >= count,
            log,
            [job],
            deadline,
            f"{count} steps",
        )
        at(mark)
    job.session.wait(max(deadline - time.monotonic(), 1.0))
    return log.select("commit", worker="w0")[args.warm :]


def torchrun_cmd(
    args: argparse.Namespace, out: Path, nproc: int, options: list[str], *train: str
) -> list[str]:
    """The training script under torchrun (the torchrun and torchft sides)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--monitor-interval",
        "0.1",
        *options,
        *train_args(args, out, *train)[1:],
    ]


def train_args(args: argparse.Namespace, out: Path, *extra: str) -> list[str]:
    """The training script's command line (the run's directory is its first argument)."""
    return [
        sys.executable,
        str(TRAIN),
        str(out),
        "--batch",
        str(args.batch),
        "--step-delay",
        str(args.step_delay),
        *extra,
    ]


def joiner_steps(settle: int, victim_steps: int) -> int:
    """How many steps the joiner of a kill-and-join run commits before the run ends: enough to
    measure the stall, and more than the killed worker committed, so that a joiner that reads
    its predecessor's data again is seen doing all of it."""
    return max(settle, victim_steps + 2)
