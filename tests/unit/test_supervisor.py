"""The launcher's worker supervisor: two threads waiting on the same workers (an agent's main loop
and a stop from its tether) reap each worker once, report each exit once, and close each pidfd
once (closing one twice raised EBADF, or closed an unrelated descriptor that reused the number)."""

import io
import os
import signal
import subprocess
import sys
import threading

import pytest

from taiji.launch.supervisor import Supervisor

pytestmark = pytest.mark.timeout(120)


def test_two_threads_waiting_reap_each_worker_once():
    for _ in range(5):
        sup = Supervisor(output=io.StringIO())
        try:
            for i in range(4):
                sup.spawn(f"w{i}", i, [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
            reported: list[str] = []
            errors: list[BaseException] = []

            def waiter(
                sup: Supervisor = sup, reported: list[str] = reported, errors: list[BaseException] = errors
            ) -> None:
                try:
                    while sup.running():
                        exited, _ = sup.wait(timeout=5.0)
                        reported.extend(w.worker_id for w in exited)
                except BaseException as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)

            threads = [threading.Thread(target=waiter) for _ in range(2)]
            for t in threads:
                t.start()
            sup.signal_all(signal.SIGKILL)
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads), "a waiter did not see the last exit"
            assert not errors, errors
            assert sorted(reported) == ["w0", "w1", "w2", "w3"], reported
            assert all(w.exit_code == -signal.SIGKILL for w in sup.workers.values())
        finally:
            sup.signal_all(signal.SIGKILL)
            sup.close()


def test_a_worker_started_ahead_is_adopted_by_the_same_spawn_and_ended_by_any_other():
    """`taiji run` starts its first workers before it imports torch: the driver's spawn with the
    same arguments adopts each (one process, its exit seen as any other's); a spawn with other
    arguments, or none at all (``drop_ahead``), ends it."""
    sup = Supervisor(output=io.StringIO())
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        env = dict(os.environ)
        a = sup.start_ahead("w0", 0, sleep, env, local_rank=0)
        b = sup.start_ahead("w1", 1, sleep, env, local_rank=1)
        c = sup.start_ahead("w2", 2, sleep, env, local_rank=2)
        assert sup.free_local_rank() == 0, "a worker started ahead holds no local rank until adopted"
        assert sup.spawn("w0", 0, sleep, env, local_rank=sup.free_local_rank()) is a and a.running
        assert sup.free_local_rank() == 1
        other = sup.spawn("w1", 1, sleep, {**env, "RANK": "9"}, local_rank=1)
        assert other is not b and not b.running and b.exit_code == -signal.SIGKILL and other.running
        sup.drop_ahead()
        assert not c.running and "w2" not in sup.workers
        assert sorted(w.worker_id for w in sup.running()) == ["w0", "w1"]
    finally:
        sup.signal_all(signal.SIGKILL)
        while sup.running():
            sup.wait(timeout=5.0)
        sup.close()


def test_a_workers_heartbeat_reaches_its_supervisor_through_a_file_on_its_host():
    """A worker's heartbeat (runtime/liveness.py) goes to a file in the directory its supervisor
    gave it (TAIJI_BEAT_DIR), not to the job store; the supervisor reads the counts of its running
    workers, and removes the directory when it closes."""
    sup = Supervisor(output=io.StringIO())
    beat = (
        "import os, time\nfrom taiji.runtime.liveness import Heartbeat\n"
        "h = Heartbeat.on_this_host('w0', 0.02)\nassert h is not None\ntime.sleep(60)\n"
    )
    try:
        sup.spawn("w0", 0, [sys.executable, "-c", beat], dict(os.environ))
        sup.spawn("w1", 1, [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
        from taiji_harness.testing import wait_for

        wait_for(lambda: sup.beat_counts()["w0"] > 2, 60, "worker w0's heartbeat file to count")
        assert sup.beat_counts()["w1"] == 0  # no heartbeat: counted as none
        first = sup.beat_counts()["w0"]
        wait_for(lambda: sup.beat_counts()["w0"] > first, 30, "the count to move on")
        sup.kill("w1")
        wait_for(lambda: sup.wait(timeout=0.5) and not sup.workers["w1"].running, 30, "w1 to be reaped")
        assert set(sup.beat_counts()) == {"w0"}  # running workers only
    finally:
        sup.stop_all(1.0)
        sup.close()
    assert not sup.beats.directory.exists()


def test_heartbeat_summaries_read_back_and_bad_ones_read_as_none():
    from taiji.cluster import beats

    assert beats.read_summary(beats.summary(7, {"w1": 3, "w2": 0}).encode()) == (7, {"w1": 3, "w2": 0})
    assert beats.read_summary(None) == (0, {})
    assert beats.read_summary(b"not json") == (0, {})
    assert beats.read_summary(b'{"seq": 2, "beats": ["w1"]}') == (0, {})


def test_a_heartbeat_directory_left_by_a_killed_process_is_removed_by_the_next_one(tmp_path):
    from taiji.cluster.beats import LocalBeats

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"taiji-beats-{dead.pid}-abc"
    left.mkdir()
    (left / "w0").write_text("3")
    mine = LocalBeats.create(str(tmp_path))
    other = tmp_path / f"taiji-beats-{os.getpid()}-live"  # a live process's: kept
    other.mkdir()
    again = LocalBeats.create(str(tmp_path))
    try:
        assert not left.exists() and other.exists() and mine.directory.exists()
        assert mine.directory.name.startswith(f"taiji-beats-{os.getpid()}-")
    finally:
        mine.close()
        again.close()
