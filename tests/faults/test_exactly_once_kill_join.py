"""benchmarks/elastic.py's kill-and-join case, audited for exactly-once data with the benchmark's
own analysis (``taiji_harness.elastic_analysis.exactly_once_figures``).

Two workers train with every step's sample indices logged; w1 is SIGKILLed, w0 retries the failed
step alone, then a new worker joins. The case once counted one worker's share (32 samples) lost in
about one run in four: w1 was killed after a step's last collective and before it logged its own
commit, so the audit saw its draw uncommitted while w0 had committed that step, with w1's share in
it. The first test puts the kill exactly in that window (fault phase ``commit``); the second
repeats the benchmark's own kill at a random moment, ``TAIJI_KILL_JOIN_RUNS`` times (default 2).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from taiji_harness.testing import BENCHMARKS, load_benchmark, load_file

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

# elastic.py imports its sides by their file names, as a script run from benchmarks/ does
sides = load_file(BENCHMARKS / "_elastic_taiji.py", "_elastic_taiji")
for name in ("_elastic_torchft", "_elastic_torchrun"):
    load_file(BENCHMARKS / f"{name}.py", name)
elastic = load_benchmark("elastic")


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAIJI_", "TORCHELASTIC_"))}
    return dict(env, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")


@pytest.fixture
def short_dir():
    """A run directory with a short path: the job's control socket lives under it (AF_UNIX paths
    are limited to 108 bytes, which pytest's short_dir can exceed)."""
    path = Path(tempfile.mkdtemp(prefix="kj-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def quick_args():
    return elastic.parse_args(["--quick", "--steady", "12", "--settle", "5", "--timeout", "90"])


def test_a_worker_killed_after_the_last_collective_loses_no_sample(short_dir):
    args = quick_args()
    at = args.steady + 3
    result = sides.taiji_kill_join(args, short_dir, environment(), kill_at_commit=at)
    log = sides.StepLog(short_dir, "taiji")
    log.poll()
    # the window was hit: w1 drew step `at`, logged no commit of it, and w0 committed it at 2 workers
    assert [d["step"] for d in log.select("draw", worker="w1")][-1] == at
    assert at not in [c["step"] for c in log.select("commit", worker="w1")]
    assert [c["size"] for c in log.select("commit", worker="w0") if c["step"] == at] == [2]
    figures = result["exactly_once"]
    assert figures["samples_lost"] == 0 and figures["samples_repeated"] == 0, figures
    assert figures["exactly_once_share"] == 1.0 and result["exit_code"] == 0


def test_kill_and_join_at_a_random_moment_is_exactly_once_every_time(short_dir):
    args = quick_args()
    for run in range(int(os.environ.get("TAIJI_KILL_JOIN_RUNS", "2"))):
        out = short_dir / f"run{run}"
        out.mkdir()
        result = sides.taiji_kill_join(args, out, environment())
        figures = result["exactly_once"]
        assert figures["exactly_once_share"] == 1.0 and result["exit_code"] == 0, (run, figures)
