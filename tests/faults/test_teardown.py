"""Tearing closed cluster versions down (issue 17, item 0: a shrink that aborted the survivor).

A 100-run soak once ended with rank 0 printing ``terminate called without an active
exception`` and dying of SIGABRT (exit 134) right after ``v2 -> v3 (resize): 4 -> 1``. The
cause: ``Communicator.close()`` left the old version's gloo groups to a daemon
``threading.Timer`` and the exit hook did not wait for a timer that had already fired. torch
runs a ProcessGroup's (and a Work's) C++ destructor with the GIL released; when a process
exits while a daemon thread is inside one, CPython ends that thread with ``pthread_exit()`` as
it re-takes the GIL, the forced unwind meets the noexcept pybind11 destructor and
``std::terminate`` aborts the process.

The children below are real interpreters that exit normally (finalization, atexit), each rank a
thread with its own store client, as ``taiji_harness.testing.run_threads`` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent('''
    import datetime, random, sys, threading, time
    import torch
    import torch.distributed as dist
    from taiji.comm import communicator as cm
    from taiji.comm.communicator import CommOptions, Communicator

    MODE, SEED = sys.argv[1], int(sys.argv[2])
    REAP_DELAY = 0.05
    cm._REAP_DELAY_S = REAP_DELAY  # many teardowns in a short test
    rng = random.Random(SEED)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    KEEP = []  # lives until the interpreter tears __main__ down

    def client():
        return dist.TCPStore("127.0.0.1", master.port, is_master=False,
                             timeout=datetime.timedelta(seconds=30))

    def ranks(size, body):
        """``body(rank)`` on every rank, rank 0 on this (the main) thread."""
        errors = []
        def run(r):
            try:
                body(r)
            except BaseException as exc:
                errors.append(f"rank {r}: {exc!r}")
        threads = [threading.Thread(target=run, args=(r,)) for r in range(1, size)]
        for t in threads:
            t.start()
        run(0)
        for t in threads:
            t.join()
        if errors:
            raise SystemExit("; ".join(errors))

    def train_alone(version, seconds, since=None):
        """Shrunk to one worker: the steps need no network and go fast."""
        end = (time.monotonic() if since is None else since) + seconds
        solo = Communicator(master, 0, 1, version)
        x = torch.randn(64, 64)
        while True:
            solo.allreduce(x, "avg")
            x = torch.tanh(x @ x.T)
            if time.monotonic() >= end:
                break
        solo.close()

    def step_in_flight(comm, kept):
        """A step's buckets: some waited, one dropped unwaited (abort_step), one kept unwaited."""
        t = torch.ones(4096)
        comm.allreduce(t, "sum", channel="grad")
        comm.barrier()
        comm.allreduce(torch.ones(1024), "sum", channel="grad", async_op=True)
        kept.append(comm.allreduce(torch.ones(1024), "sum", channel="grad", async_op=True))

    if MODE == "stuck":
        # Rank 0 shrinks away from its peers with a collective still in flight that they never
        # join (a step it alone started and aborted). Its old group cannot finish being
        # destroyed until the peers' connections go away, which happens only when this
        # interpreter tears __main__ down at exit: a teardown still in progress then.
        def body(r):
            comm = Communicator(client(), r, 3, 1, CommOptions(timeout=3.0))
            comm.connect()
            step_in_flight(comm, KEEP)
            if r == 0:
                comm.allreduce(torch.ones(8), "sum", channel="grad", async_op=True)
                comm.close()
            else:
                KEEP.append(comm)  # still in the collective's version: never closed
        ranks(3, body)
        train_alone(2, 0.3 + 4 * REAP_DELAY)  # the old version's teardown has begun
    else:
        # Many versions: grow to 3-4 workers, a step with work in flight, shrink to one;
        # the job ends a few steps after the last shrink, about when its teardown starts.
        closed = []
        versions = int(sys.argv[3])
        for v in range(1, 2 * versions, 2):
            size = rng.choice([3, 4])
            def body(r, v=v, size=size):
                comm = Communicator(client(), r, size, v, CommOptions(timeout=10.0))
                comm.connect()
                kept = []
                step_in_flight(comm, kept)
                comm.close()
                closed.append(time.monotonic())
                del kept  # the next step's abort_step() lets go of the old handles
            ranks(size, body)
            last = v == 2 * versions - 1
            train_alone(v + 1, rng.uniform(0.8, 2.5 if last else 4) * REAP_DELAY, since=max(closed))
    print("clean exit", flush=True)
''')


def run_child(tmp_path, *args: str, timeout: float = 40.0) -> subprocess.CompletedProcess:
    script = tmp_path / "teardown_child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"child {args} hung (> {timeout:g}s):\n{out[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def check_clean(result: subprocess.CompletedProcess) -> None:
    rc = result.returncode
    aborted = rc in (-signal.SIGABRT, 128 + signal.SIGABRT) or "terminate called" in result.stdout
    assert not aborted, f"the process aborted at exit (rc {rc}):\n{result.stdout[-3000:]}"
    assert rc == 0 and "clean exit" in result.stdout, f"rc {rc}:\n{result.stdout[-3000:]}"


def test_exit_while_an_old_version_is_being_torn_down(tmp_path):
    """Deterministic: the teardown can only end during interpreter finalization."""
    check_clean(run_child(tmp_path, "stuck", "0"))


@pytest.mark.parametrize("seed", [1, 2])
def test_many_shrinks_to_one_worker_then_exit(tmp_path, seed):
    """Three versions of 3-4 workers, each shrinking to one; the job ends about when the last
    teardown runs (the old code aborted in 15 of 20 such runs)."""
    check_clean(run_child(tmp_path, "shrink", str(seed), "3"))


def _pair(port: int, version: int, timeout: float):
    import datetime

    import torch.distributed as dist

    from taiji.comm.communicator import CommOptions, Communicator

    comms = [None, None]

    def build(r):
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
        comms[r] = Communicator(store, r, 2, version, CommOptions(timeout=timeout))
        comms[r].connect()

    threads = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(c is not None for c in comms)
    return comms


@pytest.fixture
def store_port():
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield master.port
    from taiji.comm.communicator import reap_closed_groups

    reap_closed_groups()


def test_close_leaves_the_slow_teardown_to_the_reaper(store_port):
    """A group with a collective stuck in flight takes until its timeout to destroy: close()
    on the training thread must not wait for that."""
    a, b = _pair(store_port, 1, timeout=5.0)
    stuck = a.allreduce(torch.ones(4), "sum", async_op=True)  # b never joins it
    b.close()  # (its groups go first, a moment later: then a's collective fails at once)
    start = time.monotonic()
    a.close()
    elapsed = time.monotonic() - start
    del stuck
    assert elapsed < 0.5, f"close() took {elapsed:.2f}s on the calling thread"


def test_handle_waited_after_close_still_has_its_result(store_port):
    a, b = _pair(store_port, 2, timeout=10.0)
    ta, tb = torch.full((3,), 1.0), torch.full((3,), 2.0)
    ha = a.allreduce(ta, "sum", async_op=True)
    hb = b.allreduce(tb, "sum", async_op=True)
    a.close()
    b.close()
    assert ha.wait().tolist() == [3.0] * 3 and hb.wait().tolist() == [3.0] * 3
    assert ha.is_completed() and hb.is_completed()
