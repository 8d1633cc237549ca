"""Test harness: ranks as threads against a real TCPStore, and real jobs via `taiji run`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence


from taiji.cluster import spec
from taiji.cluster.store import JobStore, connect_store, host_store
from taiji.runtime.peer import Peer, PeerOptions

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def run_threads(n: int, fn: Callable[[Peer], Any], *, timeout: float = 5.0,
                join_timeout: float = 60.0) -> list[Any]:
    """Run ``fn(peer)`` on ``n`` ranks as threads; return results by rank, re-raise the first error.

    Each rank gets its own store client and Peer (collective timeout ``timeout``), so a rank
    that never joins a collective makes the others time out rather than hang.
    """
    server = host_store()
    job = JobStore(server, "threads")
    config = spec.initial([spec.WorkerSpec(f"w{r}") for r in range(n)])
    assert job.publish(config)
    results: list[Any] = [None] * n
    errors: list[tuple[int, BaseException, str]] = []

    def body(rank: int) -> None:
        peer = Peer(connect_store("127.0.0.1", server.port), JobStore(server, "threads"), f"w{rank}",
                    config, PeerOptions(timeout=timeout))
        try:
            results[rank] = fn(peer)
        except BaseException as exc:  # reported to the test below
            errors.append((rank, exc, traceback.format_exc()))
        finally:
            peer.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        raise AssertionError(f"ranks {hung} did not finish within {join_timeout}s (a hang)")
    if errors:
        rank, exc, tb = sorted(errors, key=lambda e: e[0])[0]
        raise AssertionError(f"rank {rank} failed:\n{tb}") from exc
    return results


def taiji_run(nproc: int, command: Sequence[str], *, timeout: float = 120.0,
              extra: Sequence[str] = (), env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``taiji run -np nproc [extra] -- command`` and return its completed process.

    The launcher runs in its own session; on timeout (or any error) the whole session is
    killed, so no test leaves processes behind.
    """
    args = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", str(nproc), *extra, "--", *command]
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ, cwd=str(cwd or REPO), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"`taiji run` did not finish within {timeout}s:\n{out}\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def read_rank_files(directory: Path, n: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(n)]
