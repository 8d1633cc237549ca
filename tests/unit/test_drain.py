"""`taiji drain` finds the one `taiji join` agent on this host in the registry, or says what to do."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading

import pytest

from taiji.errors import StoreError
from taiji.launch import registry
from taiji.launch.hosts import drain


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TAIJI_HOME", str(tmp_path))
    return tmp_path


def _agent(job: str, host: str, pid: int | None = None) -> registry.JobEntry:
    entry = registry.JobEntry(
        job,
        host,
        0,
        pid or os.getpid(),
        ("taiji", "join"),
        1.0,
        registry.process_start_time(pid or os.getpid()),
    )
    registry.register_agent(entry)
    return entry


def test_the_only_agent_is_picked_and_stale_entries_are_removed(home):
    with pytest.raises(StoreError, match="no `taiji join` agent runs on this host"):
        drain.pick(None)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _agent("j0", "10.0.0.9", pid=gone.pid)  # its process exited: stale
    live = _agent("j1", "10.0.0.2")
    assert drain.pick(None) == live and drain.pick("j1") == live
    assert not registry.agent_file("j0", "10.0.0.9").exists()
    with pytest.raises(StoreError, match="no `taiji join` agent of job j9"):
        drain.pick("j9")


def test_several_agents_need_a_job_and_the_launchers_host_is_pointed_to_sigterm(home):
    _agent("j1", "10.0.0.2")
    _agent("j2", "10.0.0.2")
    with pytest.raises(StoreError, match=r"several .* j1 \(as 10.0.0.2.*name one with --job"):
        drain.pick(None)
    assert drain.pick("j2").job == "j2"
    registry.register(registry.JobEntry.of_this_process("j3", "10.0.0.1", 29400, ("taiji", "run"), 1.0))
    with pytest.raises(StoreError, match="runs the launcher of j3: SIGTERM to `taiji run`"):
        drain.pick("j3")


def test_drain_signals_the_agent_and_waits_for_it_to_exit(home):
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up', flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout.readline().strip() == "up"
        _agent("j1", "10.0.0.2", pid=agent.pid)
        waiter = threading.Thread(target=agent.wait)  # reap it so its pid goes
        waiter.start()
        assert drain.main(argparse.Namespace(job="j1", wait=30.0)) == 0
        waiter.join(10)
        assert agent.returncode == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
