"""The one harness of the benchmarks: processes, repetitions, statistics and the result line.

Processes. Everything a benchmark starts runs in a process session of its own (``Session``), so
signalling that session's process group reaches what the benchmark started and nothing else.
``Session.close()`` kills whatever of it still runs and reaps it; callers close sessions in a
``finally`` or a ``with``. On top of it: ``run_to_end`` (one command under a hard timeout),
``run_launcher`` (one ``taiji run`` job) and ``run_workers`` (N copies of a benchmark script
around one TCPStore that the parent hosts: ``script --worker --rank R --world-size N --port P``,
each printing its result as its last stdout line).

Repetitions. ``interleaved`` gives the order of the sides in one repetition (as given on even
repetitions, reversed on odd ones), so drifting load on a shared machine hits every side alike;
``time_on_all_ranks`` times one block of calls in every worker process.

Statistics. ``median``, ``spread`` and ``paired_ratio`` (the median over repetitions of the ratio
of two adjacent blocks, which cancels slow drift better than a ratio of medians).

The contract of docs/design.md#performance-targets. The last stdout line of every benchmark is
``{"benchmark": NAME, "rows": [{"case", "taiji", "anchor", "ratio", ...}], ...}``, with ratio > 1
meaning taiji is ahead; ``contract_row`` builds a row and ``print_result`` prints the line and
records it under benchmarks/results/ (``taiji_harness.results``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from taiji_harness import results

HOST = "127.0.0.1"
CONTRACT_KEYS = ("case", "taiji", "anchor", "ratio")
Side = TypeVar("Side")


# -- processes ---------------------------------------------------------------------------------


class Session:
    """One command in a process session of its own, its stdout and stderr in a file.

    With no ``output`` path the output goes to a temporary file, which ``close()`` reads into
    ``text()`` and deletes."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        output: Path | None = None,
        env: dict | None = None,
        cwd: Path | str | None = None,
        name: str | None = None,
    ):
        self.name = name or Path(cmd[0]).name
        self._temporary = output is None
        if output is None:
            handle, path = tempfile.mkstemp(prefix="taiji-bench-", suffix=".out")
            os.close(handle)
            output = Path(path)
        self.output = Path(output)
        self._closed_text: str | None = None
        self._exit_seen: int | None = None
        self.started = time.time()
        try:
            # the child keeps its own descriptor: the parent never reads through a shared offset
            with open(self.output, "wb") as sink:
                self.popen = subprocess.Popen(
                    list(cmd), stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
                )
        except BaseException:
            if self._temporary:
                self.output.unlink(missing_ok=True)
            raise

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The first process's exit code (minus the signal that killed it), once it has exited."""
        return self.popen.returncode if self.popen.returncode is not None else self._exit_seen

    def running(self) -> bool:
        """Whether the session's first process still runs. Does not reap it, so that ``close()``
        can still signal its process group by its id."""
        if self.returncode is not None:
            return False
        try:
            exited = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        if exited is None:
            return True
        self._exit_seen = exited.si_status if exited.si_code == os.CLD_EXITED else -exited.si_status
        return False

    def wait(self, timeout: float) -> int:
        """Its exit code; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        return self.popen.wait(timeout=max(timeout, 0.001))

    def text(self) -> str:
        if self._closed_text is not None:
            return self._closed_text
        return self.output.read_text(errors="replace")

    def tail(self, lines: int = 20) -> str:
        return "".join(self.text().splitlines(keepends=True)[-lines:])

    def terminate(self, grace: float) -> None:
        """SIGTERM the first process (a launcher stops its own workers), SIGKILL the session
        after ``grace`` seconds."""
        if self.running():
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.close()

    def close(self) -> None:
        """Kill what still runs of the session and reap its first process."""
        if self.popen.returncode is None:
            # not reaped yet (running, or a zombie): its pid is still the id of our process group
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait()
        if self._temporary and self._closed_text is None:
            self._closed_text = self.output.read_text(errors="replace")
            self.output.unlink(missing_ok=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@dataclass
class Finished:
    """How one command ended: its exit code (None: killed at its timeout) and its output."""

    name: str
    returncode: int | None
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 3000) -> str:
        return self.output[-chars:]


def run_to_end(
    cmd: Sequence[str],
    timeout: float,
    *,
    name: str,
    output: Path | None = None,
    env: dict | None = None,
    cwd: Path | str | None = None,
) -> Finished:
    """Run ``cmd`` in a session of its own; at ``timeout`` seconds kill the session. Always reaps."""
    started = time.monotonic()
    with Session(cmd, output=output, env=env, cwd=cwd, name=name) as session:
        try:
            code: int | None = session.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
    return Finished(name, code, session.text(), time.monotonic() - started)


def run_launcher(
    cmd: Sequence[str], log_path: Path, timeout: float, *, name: str, env_drop: Sequence[str] = ()
) -> Finished:
    """Run a ``taiji run ...`` command with a job registry of its own, output to ``log_path``.
    Raises RuntimeError, with the output's tail, when it times out or exits non-zero."""
    home = tempfile.mkdtemp(prefix="taiji-bench-")
    env = dict(os.environ, TAIJI_HOME=home, PYTHONUNBUFFERED="1")
    for key in env_drop:
        env.pop(key, None)
    try:
        finished = run_to_end(cmd, timeout, name=name, output=Path(log_path), env=env)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if finished.timed_out:
        raise RuntimeError(
            f"{name}: still running after {timeout:.0f}s; killed. Output tail:\n{finished.tail()}"
        )
    if finished.returncode != 0:
        raise RuntimeError(f"{name}: exited with {finished.returncode}. Output tail:\n{finished.tail()}")
    return finished


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``run_workers`` passes to each worker it starts."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)


def wait_all(sessions: Sequence[Session], timeout: float, what: str) -> None:
    """Block until every session's first process has exited with 0. Raises RuntimeError, with
    the failing one's output, as soon as one fails, or when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    exit_fds = {os.pidfd_open(s.pid): s for s in sessions}
    try:
        while exit_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                first = next(iter(exit_fds.values()))
                raise RuntimeError(
                    f"{what}: {len(exit_fds)} still running after {timeout:.0f}s; killed. "
                    f"{first.name}'s output:\n{first.tail(25)}"
                )
            ready, _, _ = select.select(list(exit_fds), [], [], remaining)  # no polling: woken by exits
            for fd in ready:
                session = exit_fds.pop(fd)
                os.close(fd)
                code = session.wait(0)
                if code != 0:
                    raise RuntimeError(
                        f"{what}: {session.name} exited with {code}; its output:\n{session.tail(25)}"
                    )
    finally:
        for fd in exit_fds:
            os.close(fd)


def run_workers(script: str, nproc: int, extra_args: Sequence[str], timeout: float) -> dict:
    """Run ``nproc`` copies of ``script --worker``; return rank 0's result (its last stdout line)."""
    import torch.distributed as dist  # the parent only needs torch for the store

    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout)
    )
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",  # one compute thread per worker: no oversubscription
        GLOO_SOCKET_IFNAME="lo",
    )  # raw default group on loopback, as taiji's groups are
    try:
        with ExitStack() as sessions:
            workers = [
                sessions.enter_context(
                    Session(
                        [
                            sys.executable,
                            script,
                            "--worker",
                            "--rank",
                            str(rank),
                            "--world-size",
                            str(nproc),
                            "--port",
                            str(store.port),
                            "--parent-pid",
                            str(os.getpid()),
                            *extra_args,
                        ],
                        env=env,
                        name=f"worker rank {rank}",
                    )
                )
                for rank in range(nproc)
            ]
            wait_all(workers, timeout, script)
        lines = [line for line in workers[0].text().splitlines() if line.strip()]
        if not lines:
            raise RuntimeError(f"{script}: rank 0 printed no result")
        return json.loads(lines[-1])
    finally:
        del store


def watch_parent(pid: int) -> None:
    """In a worker: exit at once if the process ``pid`` dies, so that no worker is orphaned."""
    if not pid:
        return
    try:
        exit_fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return

    def wait() -> None:
        select.select([exit_fd], [], [])
        os._exit(1)

    threading.Thread(target=wait, daemon=True).start()


def connect_store(port: int, timeout: float):
    import torch.distributed as dist

    return dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))


@contextmanager
def side_by_side_groups(args: argparse.Namespace, channels: Sequence[str] | None = None):
    """In a worker of ``run_workers``: the raw default gloo group (the anchor's) and a taiji
    Communicator (taiji's), both on the parent's store under prefixes of their own; yields the
    Communicator and closes both when the body returns. One compute thread per worker."""
    import torch
    import torch.distributed as dist

    from taiji.comm.communicator import CommOptions, Communicator

    torch.set_num_threads(1)
    watch_parent(args.parent_pid)
    store = connect_store(args.port, args.timeout)
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("raw", store),
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    comm = Communicator(
        dist.PrefixStore("taiji", store),
        args.rank,
        args.world_size,
        version=1,
        options=CommOptions(timeout=args.timeout),
    )
    if channels is None:
        comm.connect()
    else:
        comm.connect(tuple(channels))
    yield comm
    # not on an error: the worker exits at once, and the parent reports its output
    comm.close()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def processes_mentioning(marker: str) -> list[int]:
    """Pids of the processes whose command line contains ``marker`` (a path private to one run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def signal_if_ours(pid: int, sig: int, marker: str) -> None:
    """Send ``sig`` to ``pid`` only if its command line still contains ``marker``: a pid read from
    a log may have exited and been reused by someone else's process since."""
    try:
        if marker.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        os.kill(pid, sig)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass


def reap_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that the ``finally`` blocks still kill and reap what the
    benchmark started."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# -- repetitions -------------------------------------------------------------------------------


def interleaved(sides: Sequence[Side], rep: int) -> list[Side]:
    """The order of the sides in repetition ``rep``: as given on even repetitions, reversed on
    odd ones."""
    return list(sides) if rep % 2 == 0 else list(reversed(sides))


def time_on_all_ranks(
    body: Callable[[], None], calls: int, finish: Callable[[], None] | None = None
) -> tuple[float, float]:
    """In every worker of the default process group: run ``body()`` ``calls`` times, all ranks
    starting together, then ``finish()`` (``torch.cuda.synchronize``: the queued kernels count).
    Returns the slowest rank's wall seconds and the CPU seconds of all ranks together
    (communication threads included: a clock that other jobs disturb far less)."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1))  # line the ranks up, untimed
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(calls):
        body()
    if finish is not None:
        finish()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu)
    return elapsed.item(), cpu.item()


# -- statistics --------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def spread(values: Iterable[float], digits: int = 4) -> list[float]:
    """[min, max]: how far the repetitions behind a median lie apart."""
    values = list(values)
    return [round(min(values), digits), round(max(values), digits)]


def paired_ratio(taiji_costs: Sequence[float], anchor_costs: Sequence[float]) -> float:
    """Median over repetitions of anchor/taiji for costs measured in adjacent blocks (seconds:
    lower is better), so > 1 means taiji is ahead."""
    if len(taiji_costs) != len(anchor_costs) or not taiji_costs:
        raise ValueError(
            f"paired costs must be non-empty and of one length: {len(taiji_costs)}, {len(anchor_costs)}"
        )
    return median([anchor / taiji for taiji, anchor in zip(taiji_costs, anchor_costs)])


def quartiles(values: Iterable[float], digits: int = 4) -> list[float]:
    """[25th, 75th percentile]: where the middle half of the paired ratios lies."""
    q1, _, q3 = statistics.quantiles(list(values), n=4)
    return [round(q1, digits), round(q3, digits)]


# -- the contract ------------------------------------------------------------------------------


def ahead_ratio(taiji: float | None, anchor: float | None, *, higher_is_better: bool) -> float | None:
    """How many times better taiji is than the anchor (> 1: taiji ahead); None if either is
    missing or the divisor is not positive."""
    if taiji is None or anchor is None:
        return None
    better, worse = (taiji, anchor) if higher_is_better else (anchor, taiji)
    return better / worse if worse > 0 else None


def contract_row(
    case: str,
    taiji: float | None,
    anchor: float | None,
    *,
    higher_is_better: bool,
    ratio: float | None = None,
    digits: int = 3,
    **details,
) -> dict:
    """One row of the result line. ``ratio`` defaults to ``ahead_ratio``; pass a paired ratio
    measured by the caller instead where there is one."""
    if ratio is None:
        ratio = ahead_ratio(taiji, anchor, higher_is_better=higher_is_better)
    return {
        "case": case,
        "taiji": taiji,
        "anchor": anchor,
        "ratio": None if ratio is None else round(ratio, digits),
        **details,
    }


def result_line(benchmark: str, rows: Sequence[dict], **extra) -> str:
    """The contract's JSON line; raises ValueError on a row without case/taiji/anchor/ratio."""
    for row in rows:
        missing = [key for key in CONTRACT_KEYS if key not in row]
        if missing:
            raise ValueError(f"{benchmark}: row {row.get('case', row)!r} lacks {missing}")
    return json.dumps({"benchmark": benchmark, "rows": list(rows), **extra})


def print_result(benchmark: str, rows: Sequence[dict], *, record: bool = True, **extra) -> None:
    """Print the contract's line: the benchmark's last line on stdout. With ``record`` (the
    default) the result is also written to ``benchmarks/results/<benchmark>.json`` with its date,
    commit, machine and command (``taiji_harness.results``); a benchmark's worker processes, whose
    lines go to their parent, pass ``record=False``."""
    line = result_line(benchmark, rows, **extra)
    print(line, flush=True)
    path = results.record(json.loads(line)) if record else None
    if path is not None:
        print(f"# result recorded in {path}", file=sys.stderr, flush=True)
