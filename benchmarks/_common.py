"""Shared plumbing for the benchmarks: spawn N worker processes of the calling script
around one parent-hosted TCPStore, wait for them under a hard deadline, always reap
them, and hand back rank 0's JSON result.

A benchmark script re-invokes itself as ``script --worker --rank R --world-size N
--port P [args]``; the worker prints its result as the last line of its stdout.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

HOST = "127.0.0.1"


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags the parent passes to each worker it spawns."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)


def _tail(handle, lines: int = 25) -> str:
    handle.seek(0)
    return "".join(handle.readlines()[-lines:])


def run_workers(script: str, nproc: int, extra_args: Sequence[str], timeout: float) -> dict:
    """Run ``nproc`` copies of ``script --worker``; return rank 0's result (its last stdout line).

    Raises RuntimeError with the failing worker's output tail if any worker fails or the
    whole run exceeds ``timeout`` seconds. Every worker is killed and reaped on the way out.
    """
    import torch.distributed as dist  # the parent only needs torch for the store

    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1",        # one compute thread per worker: no oversubscription
               GLOO_SOCKET_IFNAME="lo")    # raw default group on loopback, as taiji's groups are
    procs: list[subprocess.Popen] = []
    outputs = []
    pidfds: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    try:
        for rank in range(nproc):
            out = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker can't block
            outputs.append(out)
            cmd = [sys.executable, script, "--worker", "--rank", str(rank), "--world-size", str(nproc),
                   "--port", str(store.port), "--parent-pid", str(os.getpid()), *extra_args]
            # own session: killing its process group cannot touch anything we did not start
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))
            pidfds[os.pidfd_open(procs[-1].pid)] = rank
        # block on the workers' pidfds (no polling): return as soon as all exit, or one fails
        pending = dict(pidfds)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{script}: workers still running after {timeout:.0f}s; killed. "
                                   f"rank 0 output:\n{_tail(outputs[0])}")
            ready, _, _ = select.select(list(pending), [], [], remaining)
            for fd in ready:
                rank = pending.pop(fd)
                code = procs[rank].wait()
                if code != 0:
                    raise RuntimeError(f"{script}: worker rank {rank} exited with {code}; "
                                       f"its output:\n{_tail(outputs[rank])}")
        lines = [ln for ln in _tail(outputs[0], 5).splitlines() if ln.strip()]
        if not lines:
            raise RuntimeError(f"{script}: rank 0 printed no result")
        return json.loads(lines[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()  # reap: no zombies, whatever happened above
        for fd in pidfds:
            os.close(fd)
        for out in outputs:
            out.close()
        del store


def watch_parent(pid: int) -> None:
    """In a worker: exit at once if the benchmark parent dies, so no worker is orphaned."""
    if not pid:
        return
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return

    def wait() -> None:
        select.select([fd], [], [])
        os._exit(1)
    threading.Thread(target=wait, daemon=True).start()


def connect_store(port: int, timeout: float):
    import torch.distributed as dist
    return dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_result(benchmark: str, rows: list[dict], **extra) -> None:
    """The contract: the last line of stdout is one JSON object."""
    print(json.dumps({"benchmark": benchmark, "rows": rows, **extra}), flush=True)


def run_launcher(cmd: Sequence[str], log_path, timeout: float, *, name: str,
                 env_drop: Sequence[str] = ()) -> tuple[int, str]:
    """Run a ``taiji run ...`` command in its own session with a private job registry, output to
    ``log_path``; on timeout the session (launcher and workers) is killed and reaped. Returns the
    exit code and the output's tail; raises RuntimeError on timeout."""
    import shutil
    from pathlib import Path
    home = tempfile.mkdtemp(prefix="taiji-bench-")  # job registry of this run only
    env = dict(os.environ, TAIJI_HOME=home, PYTHONUNBUFFERED="1")
    for key in env_drop:
        env.pop(key, None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher's session: it and its workers
            proc.wait()
            shutil.rmtree(home, ignore_errors=True)
    tail = Path(log_path).read_text()[-3000:]
    if code is None:
        raise RuntimeError(f"{name}: still running after {timeout:.0f}s; killed. Output tail:\n{tail}")
    return code, tail
