"""A configurable worker for the launcher tests (tests/integration/test_launcher.py).

Started by ``taiji run``; reads its rank from ``RANK``. Options that take RANKS apply to the
listed ranks only ("0,2", or "*" for every rank); options that take RANK=VALUE apply VALUE to
that rank. In this order, a worker:

  1. ignores SIGTERM (--ignore-term RANKS) and/or clears its parent-death signal
     (--no-pdeathsig RANKS), so that only taiji.init()'s launcher watchdog can stop it;
  2. joins the job with taiji.init() (--taiji-init RANKS; the only option that imports torch);
  3. prints "ENV NAME=VALUE" for the launcher's variables (--print-env);
  4. starts a grandchild process that blocks forever (--grandchild RANKS), which shares the
     worker's output unless --grandchild-stdout devnull;
  5. prints READY and writes "PID STARTTIME" of itself (worker-R.pid) and of its grandchild
     (grandchild-R.pid) into --pid-dir; STARTTIME (from /proc) tells a pid from a reused one;
  6. waits until every rank has written its pid file (--barrier), so that a failure below
     happens while all the other workers are running;
  7. prints N lines "rR line NNN" (--lines RANK=N);
  8. exits with a code (--exit RANK=CODE) or kills itself with a signal (--signal RANK=NAME);
  9. blocks forever (--block), else exits 0.

Plain Python unless --taiji-init is given, so that it starts in milliseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time

RANK = int(os.environ["RANK"])
WORLD_SIZE = int(os.environ["WORLD_SIZE"])
ENV_NAMES = (
    "TAIJI_JOB_ID",
    "TAIJI_WORKER_ID",
    "TAIJI_STORE_HOST",
    "TAIJI_STORE_PORT",
    "TAIJI_SECRET",
    "TAIJI_LAUNCHER_PID",
    "TAIJI_TIMEOUT",
    "TAIJI_DEBUG_COLLECTIVES",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
BARRIER_TIMEOUT = 60.0

# the grandchild: blocks until a signal kills it (it handles none)
GRANDCHILD_CODE = "import signal\nwhile True:\n    signal.pause()\n"


def starttime(pid: int) -> str:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2 :].split()[19]


def selected(spec: list[str]) -> bool:
    ranks = {r.strip() for item in spec for r in item.split(",")}
    return "*" in ranks or str(RANK) in ranks


def value_for(spec: list[str]) -> str | None:
    found = None
    for item in spec:
        rank, _, value = item.partition("=")
        if rank == "*" or int(rank) == RANK:
            found = value
    return found


def write_pid_file(directory: str, name: str, pid: int) -> None:
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as f:
        f.write(f"{pid} {starttime(pid)}\n")
    os.replace(path + ".tmp", path)  # atomic: the test never reads half a file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", default="")
    parser.add_argument("--ignore-term", action="append", default=[], metavar="RANKS")
    parser.add_argument("--no-pdeathsig", action="append", default=[], metavar="RANKS")
    parser.add_argument("--taiji-init", action="append", default=[], metavar="RANKS")
    parser.add_argument("--print-env", action="store_true")
    parser.add_argument("--grandchild", action="append", default=[], metavar="RANKS")
    parser.add_argument(
        "--grandchild-stdout",
        choices=("inherit", "devnull"),
        default="inherit",
        help="devnull: the grandchild does not hold the launcher's output pipe open",
    )
    parser.add_argument("--barrier", action="store_true")
    parser.add_argument("--lines", action="append", default=[], metavar="RANK=N")
    parser.add_argument("--exit", action="append", default=[], metavar="RANK=CODE")
    parser.add_argument("--signal", action="append", default=[], metavar="RANK=NAME")
    parser.add_argument("--block", action="store_true")
    args = parser.parse_args()

    if selected(args.ignore_term):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if selected(args.no_pdeathsig):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(1, 0, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1, signal 0 = none
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG, 0) failed")
    if selected(args.taiji_init):
        import taiji

        taiji.init()
        print(f"taiji.init: rank {taiji.rank()} of {taiji.size()}", flush=True)
    if args.print_env:
        for name in ENV_NAMES:
            print(f"ENV {name}={os.environ.get(name, '<unset>')}", flush=True)
    grandchild = None
    if selected(args.grandchild):
        stdout = subprocess.DEVNULL if args.grandchild_stdout == "devnull" else None
        grandchild = subprocess.Popen(
            [sys.executable, "-c", GRANDCHILD_CODE], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stdout
        )
        print(f"started grandchild {grandchild.pid}", flush=True)

    print("READY", flush=True)
    if args.pid_dir:
        if grandchild is not None:  # not reaped yet, so its pid cannot have been reused
            write_pid_file(args.pid_dir, f"grandchild-{RANK}.pid", grandchild.pid)
        write_pid_file(args.pid_dir, f"worker-{RANK}.pid", os.getpid())

    if args.barrier:
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not all(
            os.path.exists(os.path.join(args.pid_dir, f"worker-{r}.pid")) for r in range(WORLD_SIZE)
        ):
            if time.monotonic() > deadline:
                print("barrier timed out", flush=True)
                sys.exit(99)
            time.sleep(0.02)

    for i in range(int(value_for(args.lines) or 0)):
        print(f"r{RANK} line {i:03d}")
    sys.stdout.flush()

    code = value_for(args.exit)
    if code is not None:
        sys.exit(int(code))
    name = value_for(args.signal)
    if name is not None:
        os.kill(os.getpid(), signal.Signals["SIG" + name])

    if args.block:
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
