"""`--slurm` without Slurm: the allocation read from its environment, host lists expanded, node
names resolved (a fake resolver), the handover between the tasks in a shared directory, and the
errors a user meets (outside an allocation, a node list that does not resolve, mismatched job
ids). The processes themselves: tests/multihost/test_slurm.py, against a real Slurm."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest

from taiji.errors import ConfigError, LaunchError
from taiji.launch import cli
from taiji.launch.hosts import slurm, slurm_task
from taiji.launch.supervisor import Supervisor

STEP = {
    "SLURM_JOB_ID": "812",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURMD_NODENAME": "gpu08",
    "SLURM_SUBMIT_DIR": "/shared/me",
    "SLURM_GPUS_ON_NODE": "4",
}


@pytest.mark.parametrize(
    "text, names",
    [
        ("n1", ("n1",)),
        ("n[1-3,7]", ("n1", "n2", "n3", "n7")),
        ("gpu[08-10],cpu1", ("gpu08", "gpu09", "gpu10", "cpu1")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("a,b[9-10]x", ("a", "b9x", "b10x")),
    ],
)
def test_host_lists_expand_as_scontrol_prints_them(text, names):
    assert slurm.expand_hostlist(text) == names


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("n[1-3", "without ']'"),
        ("n1-3]", "without '['"),
        ("n[3-1]", "goes down"),
        ("n[a]", "not N or N-M"),
        ("n1,,n2", "empty name"),
    ],
)
def test_a_bad_host_list_is_refused_saying_why(text, why):
    with pytest.raises(ConfigError, match=re.escape(why)):
        slurm.expand_hostlist(text)


def test_the_allocation_is_the_steps():
    allocation = slurm.read_allocation(STEP)
    assert allocation.nodes == ("gpu07", "gpu08") and allocation.node == "gpu08" and allocation.procid == 1
    assert not allocation.launches and allocation.restart == 0 and slurm.default_slots(allocation) == 4
    slurm.check_one_task_per_node(allocation)


def test_outside_an_allocation_or_in_the_batch_script_says_how_to_start_it():
    with pytest.raises(ConfigError, match="needs a Slurm allocation .*srun --nodes N --ntasks-per-node 1"):
        slurm.read_allocation({})
    batch = {k: v for k, v in STEP.items() if k != "SLURM_PROCID"}
    with pytest.raises(ConfigError, match="batch script.*srun --ntasks-per-node 1"):
        slurm.read_allocation(batch)


def test_more_tasks_than_nodes_are_refused():
    with pytest.raises(ConfigError, match="4 task.* on 2 node.*one task per node"):
        slurm.check_one_task_per_node(slurm.read_allocation(dict(STEP, SLURM_STEP_NUM_TASKS="4")))


def test_node_names_resolve_to_an_address_other_nodes_reach():
    table = {"n1": ["10.0.0.1"], "n2": ["127.0.1.1"]}

    def resolve(name):
        if name not in table:
            raise OSError("Name or service not known")
        return table[name]

    assert slurm.ipv4_of("n1", resolve) == "10.0.0.1"
    with pytest.raises(ConfigError, match="loopback.*--ifname"):
        slurm.ipv4_of("n2", resolve)
    with pytest.raises(ConfigError, match=r"cannot resolve the job's node list: .*'n2'.*'n3'.*--ifname"):
        slurm.check_nodes_resolve(("n1", "n2", "n3"), resolve)


def test_the_handover_is_owner_only_and_only_its_own_steps_tasks_take_it(tmp_path):
    launcher = slurm.read_allocation(dict(STEP, SLURM_PROCID="0", SLURM_NODEID="0", SLURMD_NODENAME="gpu07"))
    agent = slurm.read_allocation(STEP)
    handover = slurm_task.Handover(tmp_path, "812")
    handover.publish(launcher, "slurm812", "tcp://10.0.0.7:4000", b"\x01" * 32)
    assert stat.S_IMODE(handover.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((handover.directory / "secret").stat().st_mode) == 0o600
    assert "01" * 32 not in (handover.directory / "job.json").read_text()
    record, secret = handover.wait(lambda r: slurm_task.same_run(r, agent), 1, "launcher")
    assert record["store"] == "tcp://10.0.0.7:4000" and record["job"] == "slurm812" and secret == b"\x01" * 32
    requeued = slurm.read_allocation(dict(STEP, SLURM_RESTART_COUNT="1"))  # an earlier run's is not taken
    with pytest.raises(LaunchError, match="is from Slurm job 812 step 0 .restart 0., not this one"):
        handover.wait(lambda r: slurm_task.same_run(r, requeued), 0.2, "launcher")
    handover.withdraw(requeued)  # not its own: left alone
    assert handover.read() is not None
    handover.fail(launcher, "--port 80: permission denied")
    with pytest.raises(LaunchError, match="could not start: --port 80: permission denied"):
        handover.wait(lambda r: slurm_task.same_run(r, agent), 1, "launcher")
    handover.withdraw(launcher)
    assert not handover.directory.exists()


def _join_args(job: str, **extra) -> argparse.Namespace:
    return argparse.Namespace(
        target=None,
        slurm=job,
        secret_file=None,
        nproc_per_node=None,
        host=None,
        ifname=None,
        timeout=30.0,
        grace=5.0,
        **extra,
    )


def test_join_slurm_refuses_a_job_without_a_launcher_and_a_mismatched_record(tmp_path, monkeypatch):
    for name, value in dict(STEP, SLURM_JOB_ID="900", SLURM_SUBMIT_DIR=str(tmp_path)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TAIJI_SLURM_DIR", raising=False)
    with pytest.raises(ConfigError, match="no taiji job runs under Slurm job 812: nothing in .*squeue"):
        slurm_task.join_config(_join_args("812"))
    directory = tmp_path / ".taiji" / "slurm" / "812"
    directory.mkdir(parents=True)
    (directory / "job.json").write_text(json.dumps({"slurm_job": "811", "job": "x", "store": "tcp://h:1"}))
    with pytest.raises(ConfigError, match="belongs to Slurm job 811, not 812"):
        slurm_task.join_config(_join_args("812"))


def test_the_cli_says_what_is_wrong_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")  # main() would set it for this process
    for name in ("SLURM_JOB_ID", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["run", "--slurm", "python", "train.py"]) == 2
    assert "--slurm needs a Slurm allocation (SLURM_JOB_ID is not set)" in capsys.readouterr().err
    assert cli.main(["join", "--slurm", "812"]) == 2
    assert "--slurm needs a Slurm allocation" in capsys.readouterr().err
    assert cli.main(["join", "j1@10.0.0.1:4000"]) == 2
    assert "taiji join needs --secret-file, --nproc-per-node, --host or --ifname" in capsys.readouterr().err
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["run", "--slurm", "--host", "10.0.0.1", "python", "train.py"]) == 2
    assert "--host with --slurm would give every node the same address" in capsys.readouterr().err
    assert cli.main(["run", "--slurm", "--nnodes", "3:4", "python", "train.py"]) == 2
    assert "--nnodes 3:4 waits for more hosts than the 2 node(s) of Slurm job 812" in capsys.readouterr().err


def _ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("inside", [True, False])
def test_workers_inside_a_slurm_job_start_with_sigterm_ignored(monkeypatch, inside):
    """Slurm signals every process of a step: the launcher or agent decides what a notice means."""
    if inside:
        monkeypatch.setenv("SLURM_JOB_ID", "812")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    sup = Supervisor(output=io.StringIO())
    worker = sup.spawn("w0", 0, ["sleep", "60"], dict(os.environ))
    try:
        assert _ignores_sigterm(worker.pid) == inside
    finally:
        sup.kill("w0")
        while sup.running():
            sup.wait(timeout=5)
        sup.close()
