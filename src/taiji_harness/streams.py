"""The whole suite as two streams side by side (``make test``): the tests marked ``waits``
(tests/conftest.py: they mostly wait on daemons and assert no tight timing) in one pytest, every
other test in another, each stream one test at a time. The machine's cores are busy with the
first stream's jobs while the second's wait on the scheduler's rounds, Ray's and Slurm's services,
and no two timing-sensitive tests ever run together.

    python -m taiji_harness.streams [pytest options and paths]

The main stream (the pure tests first) prints as it runs; the waiting stream's output goes to a file named at
the start and is printed once both end. The exit status is the first failing stream's (pytest's "no tests
collected", 5, counts as success for a stream when the other ran tests)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

NO_TESTS = 5

# The test files (or tests, ``file::name``: all its parameters) that spend most of their time
# waiting on daemons (the scheduler's rounds, Ray's and Slurm's services, emulated hosts' timeouts, a
# browser) and assert no tight timing; tests/conftest.py marks them `waits`. The single tests used
# at most 0.7 of a core while they ran (CPU seconds of the test and its processes / wall seconds, on
# the 2-core machine), the others' 1.3-1.8: in the main stream the second core idled meanwhile.
WAITS = frozenset(
    {
        "tests/multihost/test_sched_hosts.py",
        "tests/multihost/test_sched_ray_nodes.py",
        "tests/multihost/test_ray.py",
        "tests/multihost/test_slurm.py",
        "tests/integration/test_sched_daemon_procs.py",
        "tests/integration/test_sched_suspend_procs.py",
        "tests/integration/test_metrics_procs.py",
        "tests/integration/test_docs.py",
        "tests/integration/test_launcher.py::test_signal_to_launcher_stops_all_workers",
        "tests/faults/test_elastic.py::test_resize_and_status_from_another_terminal",
        "tests/faults/test_teardown.py::test_exit_while_an_old_version_is_being_torn_down",
        "tests/multihost/test_hosts.py::test_a_store_nobody_serves_is_a_clear_error",
        "tests/multihost/test_hosts.py::test_etcd_head_killed_an_agent_takes_over_and_training_goes_on",
    }
)


def waits(nodeid: str) -> bool:
    """Whether a test (its pytest node id) runs in the waiting stream."""
    return nodeid.split("::")[0] in WAITS or nodeid.split("[")[0] in WAITS


def combined(main: int, side: int) -> int:
    """One exit status for both streams."""
    if main == side == NO_TESTS:
        return NO_TESTS
    return next((rc for rc in (main, side) if rc not in (0, NO_TESTS)), 0)


def _stop(proc: subprocess.Popen) -> None:
    """Interrupt a pytest like Ctrl-C (its fixtures clean up), then kill it if it does not end."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# The main stream's order when no path is given: the pure tests of tests/unit first, on one core,
# while the waiting stream starts its daemons on the other; the multi-process tests after them.
TESTS = Path(__file__).resolve().parents[2] / "tests"
MAIN_ORDER = tuple(str(TESTS / d) for d in ("unit", "faults", "integration", "multihost", "gpu"))


def main_paths(argv: list[str]) -> list[str]:
    """MAIN_ORDER, unless the arguments name tests of their own (a path, or a path::test)."""
    named = any(Path(a.split("::")[0]).exists() for a in argv if not a.startswith("-"))
    return [] if named else list(MAIN_ORDER)


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *argv]
    work = Path(tempfile.mkdtemp(prefix="taiji-waits-"))
    log = work / "waits.log"
    print(f"the tests marked `waits` run beside the others; their output: {log}", flush=True)
    with open(log, "w") as out:
        side = subprocess.Popen(
            [*pytest, "-m", "waits", "--basetemp", str(work / "tmp")], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            main_rc = subprocess.call([*pytest, "-m", "not waits", *main_paths(argv)])
            side_rc = side.wait()
        finally:
            _stop(side)
    print(f"\n{'=' * 30} the tests marked `waits` {'=' * 30}", flush=True)
    print(log.read_text(), flush=True)
    return combined(main_rc, side_rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
