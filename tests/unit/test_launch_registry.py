"""The job registry and the launcher's control socket: what `taiji status/resize/ls` stand on."""

import os
import subprocess
import sys
import time

import pytest

from taiji.errors import StoreError
from taiji.launch import registry
from taiji.launch.cli import main as taiji_main
from taiji.launch.control_socket import ControlServer, request


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TAIJI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_entry_whose_launcher_died_is_reported_and_pruned(capsys):
    registry.register(registry.JobEntry("jdead", "127.0.0.1", 1, dead_pid(), ("python", "t.py"), time.time()))
    assert [e.job for e in registry.all_jobs()] == ["jdead"]
    with pytest.raises(StoreError, match=r"job jdead is not running \(its launcher, pid \d+, exited\)"):
        registry.find_job("jdead")
    assert registry.all_jobs() == [], "the stale entry is removed"


def test_a_reused_pid_is_not_taken_for_the_launcher():
    entry = registry.JobEntry("jreused", "127.0.0.1", 1, os.getpid(), (), time.time(), pid_start=1)
    assert not entry.running
    assert registry.JobEntry.of_this_process("jme", "h", 1, (), time.time()).running


def test_unknown_job_names_the_running_ones_not_the_dead_ones():
    registry.register(registry.JobEntry("jdead", "h", 1, dead_pid(), (), 1.0))
    registry.register(registry.JobEntry.of_this_process("jlive", "h", 1, (), 2.0))
    with pytest.raises(StoreError) as info:
        registry.find_job("nope")
    assert "running: ['jlive']" in str(info.value) and "jdead" not in str(info.value)
    assert registry.find_job(None).job == "jlive", "the only running job is the default"


def test_ls_lists_running_jobs_with_their_cluster_and_prunes_dead_ones(capsys):
    registry.register(registry.JobEntry("jdead", "h", 1, dead_pid(), ("x",), 1.0))
    registry.register(registry.JobEntry.of_this_process("jlive", "h", 1, ("python", "train.py"), time.time()))
    server = ControlServer(
        registry.control_socket("jlive"),
        lambda: {"workers": ["w0", "w1"], "version": 3, "progress": {"step": 42}},
    )
    try:
        assert taiji_main(["ls"]) == 0
    finally:
        server.close()
    out = capsys.readouterr().out
    assert "job jdead is not running" in out
    [row] = [line for line in out.splitlines() if line.startswith("jlive")]
    assert row.split()[1:5] == ["running", "2", "v3", "42"] and "python train.py" in row


def test_control_socket_answers_status_and_queues_resizes(home):
    snapshot = {"version": 1, "workers": ["w0"]}
    server = ControlServer(registry.control_socket("j1"), lambda: snapshot)
    try:
        assert oct(os.stat(registry.control_socket("j1")).st_mode & 0o777) == "0o600", "owner only"
        assert request(registry.control_socket("j1"), {"op": "status"})["workers"] == ["w0"]
        request(registry.control_socket("j1"), {"op": "resize", "size": 3})
        request(
            registry.control_socket("j1"),
            {"op": "resize", "size": 3, "source": "taiji sched", "placement": {"10.0.0.1": 1, "10.0.0.2": 2}},
        )
        assert server.take_proposals() == [
            (3, "taiji resize", ()),
            (3, "taiji sched", (("10.0.0.1", 1), ("10.0.0.2", 2))),
        ]
        assert server.take_proposals() == []
        with pytest.raises(StoreError, match="unknown request"):
            request(registry.control_socket("j1"), {"op": "drop tables"})
    finally:
        server.close()
    assert not registry.control_socket("j1").exists()
    with pytest.raises(StoreError, match="did not answer"):
        request(registry.control_socket("j1"), {"op": "status"}, timeout=0.5)


def test_the_store_commands_do_not_import_torch():
    code = (
        "import sys; from taiji.launch.cli import main; main(['ls']); "
        "assert 'torch' not in sys.modules, 'taiji ls imported torch'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_resize_placement_is_parsed_and_checked_before_asking():
    from taiji.errors import ConfigError
    from taiji.launch.control_cli import parse_placement, resize_job

    assert parse_placement("10.0.0.1=2, 10.0.0.2=1") == {"10.0.0.1": 2, "10.0.0.2": 1}
    assert parse_placement(None) == {} and parse_placement("fe80::1=1") == {"fe80::1": 1}
    for bad in ("10.0.0.1", "=2", "10.0.0.1=two"):
        with pytest.raises(ConfigError, match="--placement wants"):
            parse_placement(bad)
    with pytest.raises(ConfigError, match="puts 3 workers on hosts, not the 4"):
        resize_job(None, 4, "a=1,b=2")


def test_a_malformed_placement_is_answered_not_fatal_to_the_control_thread(home):
    server = ControlServer(registry.control_socket("j2"), lambda: {"version": 1, "workers": ["w0"]})
    try:
        for bad in (
            {"op": "resize", "size": 2, "placement": 7},
            {"op": "resize", "size": 2, "placement": {"a": "x"}},
            {"op": "resize"},
        ):
            with pytest.raises(StoreError):
                request(registry.control_socket("j2"), bad)
        assert request(registry.control_socket("j2"), {"op": "status"})["workers"] == ["w0"], (
            "still answering"
        )
        assert server.take_proposals() == []
    finally:
        server.close()


def test_resize_placement_is_checked_against_the_jobs_hosts_before_it_is_sent(home, capsys):
    from taiji.errors import ConfigError
    from taiji.launch.control_cli import job_status, resize_job

    registry.register(registry.JobEntry.of_this_process("j3", "h", 1, ("python", "t.py"), 2.0))
    snapshot = {
        "version": 2,
        "workers": ["w0", "w1"],
        "joiners": [],
        "desired": 2,
        "min_np": 1,
        "max_np": 4,
        "failures": 0,
        "progress": None,
        "hosts": [["10.0.0.1", 2, 1], ["10.0.0.2", 2, 1]],
    }
    server = ControlServer(registry.control_socket("j3"), lambda: snapshot)
    try:
        with pytest.raises(
            ConfigError, match="names 10.0.0.9, not one of job j3's hosts: 10.0.0.1, 10.0.0.2"
        ):
            resize_job("j3", 2, "10.0.0.1=1,10.0.0.9=1")
        with pytest.raises(ConfigError, match="puts 3 workers on 10.0.0.2, which has 2 slot"):
            resize_job("j3", 3, "10.0.0.2=3")
        assert server.take_proposals() == [], "nothing was sent"
        assert resize_job("j3", 3, "10.0.0.1=1,10.0.0.2=2") == 0
        assert server.take_proposals() == [(3, "taiji resize", (("10.0.0.1", 1), ("10.0.0.2", 2)))]
        job_status("j3")
        assert "hosts: 10.0.0.1 1/2, 10.0.0.2 1/2" in capsys.readouterr().out
    finally:
        server.close()
