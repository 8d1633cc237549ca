"""The launcher's worker supervisor: two threads waiting on the same workers (an agent's main loop
and a stop from its tether) reap each worker once, report each exit once, and close each pidfd
once (closing one twice raised EBADF, or closed an unrelated descriptor that reused the number)."""
import io
import os
import signal
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

            def waiter() -> None:
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
