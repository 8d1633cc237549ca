"""taiji under a real Slurm (tests/multihost/_slurm.py: munged, slurmctld, a slurmd per emulated
host): `srun taiji run --slurm` on two nodes trains (task 0 the launcher, task 1 its agent); a
second allocation's task joins with `taiji join --slurm JOB` and the job grows onto it; a node's
task killed shrinks the job, which goes on; `scancel --signal=TERM` stops it with a final
checkpoint and exit status 75, and a resumed step trains every sample once (docs/design.md#invariants
audited). Skipped, with the reason, where Slurm, munge or network namespaces are missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from taiji.checkpoint.storage import Storage
from taiji_harness.testing import ELASTIC_SCRIPT, check_invariants, committed_steps, merge_runs, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(420),
]  # 8 processes load torch: slow on a busy 2-core machine
TAIJI = [sys.executable, "-m", "taiji.launch.cli"]


def _srun(slurm3, out: Path, name: str, nodes: str, taiji_args: list[str]) -> subprocess.Popen:
    """``srun`` on host 0 (in ``out``, one task per node) of `taiji ...`; its output, labelled by
    task and timed, goes to ``out/<name>.log``."""
    argv = [
        "srun",
        "-l",
        "-N",
        str(len(nodes.split(","))),
        "-w",
        nodes,
        "--ntasks-per-node",
        "1",
        "--chdir",
        str(out),
        "-J",
        name,
        *TAIJI,
        *taiji_args,
    ]
    proc = slurm3.popen(
        0,
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(out),
        env=dict(slurm3.env, PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR", TAIJI_HOME=str(out / "home")),
    )

    def pump() -> None:
        with open(out / f"{name}.log", "w") as log:
            for line in proc.stdout:
                log.write(f"{time.monotonic():.2f} {line}")
                log.flush()

    threading.Thread(target=pump, daemon=True).start()
    return proc


def _train(out: Path, *args: str) -> list[str]:
    return [
        "--timeout",
        "3",
        "--run-dir",
        str(out / "run"),
        *args[:-1],
        "--",
        sys.executable,
        ELASTIC_SCRIPT,
        str(out),
        "--batch",
        "16",
        "--step-delay",
        "0.03",
        *args[-1].split(),
    ]


def _log(out: Path, name: str) -> str:
    return _text(out / f"{name}.log")


def _slurm_job(out: Path) -> str:
    """The Slurm job id of the run in ``out`` (its handover directory is named after it)."""
    found: list[str] = []
    wait_for(
        lambda: bool(found.extend(p.name for p in (out / ".taiji" / "slurm").glob("*")) or found),
        60,
        "the launcher's handover in the shared directory",
    )
    return found[0]


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _reap(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _task_pid(slurm3, host: int, subcommand: str) -> int:
    """The pid of the `taiji <subcommand>` task srun started on ``host`` (the test's own)."""
    for pid in slurm3.hosts.pids(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        taiji = b"taiji.launch.cli" in argv or any(word.endswith(b"/taiji") for word in argv)  # or the script
        if taiji and subcommand.encode() in argv:
            return pid
    raise AssertionError(f"no `taiji {subcommand}` task on host {host}")


def test_srun_job_grows_onto_a_second_allocation_survives_a_killed_task_and_resumes_after_scancel_term(
    slurm3, tmp_path
):
    """Slurm job A (n0, n1) trains with 2 workers; job B's task on n2 joins it (3); A's task on
    n1 is SIGKILLed (2); `scancel --signal=TERM A`: a final checkpoint, task 0 exits 75 and B's
    agent is stopped; job C resumes it on n0 alone to the end. Audited across the three."""
    ck, a, c = tmp_path / "ck", tmp_path / "a", tmp_path / "c"
    a.mkdir()
    c.mkdir()
    first = second = third = None
    try:
        first = _srun(
            slurm3,
            a,
            "a",
            "n0,n1",
            [
                "run",
                "--slurm",
                "--nnodes",
                "2:3",
                *_train(a, "--checkpoint-dir", str(ck), "--checkpoint-every", "10", "--steps 100000"),
            ],
        )
        job = _slurm_job(a)  # as soon as A's launcher is up (B joins while A gathers its nodes, or later)
        second = _srun(slurm3, a, "b", "n2", ["join", "--slurm", job])
        wait_for(
            lambda: committed_steps(a, "w2") > 0 or first.poll() is not None, 120, "a step with 3 workers"
        )
        os.kill(_task_pid(slurm3, 1, "run"), signal.SIGKILL)  # n1's task, its agent: its worker dies with it
        wait_for(lambda: "cluster v3" in _log(a, "a") or first.poll() is not None, 60, "the job to shrink")
        wait_for(
            lambda: '"size": 2' in _text(a / "w2.jsonl") or first.poll() is not None,
            60,
            "a step after the shrink",
        )  # w2 joined at 3 workers: its steps at 2 come after it
        slurm3.run(0, ["scancel", "--signal=TERM", job])
        first.wait(timeout=90)
        assert second.wait(timeout=30) == 0, _log(a, "b")
        stopped_at = Storage(str(ck)).listing().latest
        assert stopped_at == committed_steps(a), "the final checkpoint is at the step the job stopped"
        third = _srun(
            slurm3,
            c,
            "c",
            "n0",
            [
                "run",
                "--slurm",
                *_train(c, "--checkpoint-dir", str(ck), "--resume", "auto", f"--steps {stopped_at + 2}"),
            ],
        )
        assert third.wait(timeout=120) == 0, _log(c, "c")[-4000:]
    finally:
        _reap(first, second, third)
    log = _log(a, "a")
    assert "waiting for 1 more host(s) to join" in log and "cluster v1: 2 worker(s)" in log, log[-4000:]
    assert f"host {slurm3.hosts.address(2)} joined" in log, log[-4000:]
    assert f"host {slurm3.hosts.address(1)} is lost" in log, log[-4000:]
    assert "task 0: Exited with exit code 75" in log, log[-4000:]
    assert f"resumable from {ck}/step-{stopped_at:08d}" in log, log[-4000:]  # its parts on n2 included
    assert "Traceback" not in log + _log(a, "b") + _log(c, "c"), log[-4000:]
    assert not (a / ".taiji" / "slurm" / job).exists(), "the launcher removes its handover when it exits"
    merge_runs([(a, 0, stopped_at), (c, stopped_at, stopped_at + 2)], tmp_path / "merged")
    assert check_invariants(tmp_path / "merged", 16)["sizes"] == [2, 3, 2, 1]


def _guide_script(out: Path) -> str:
    """slurm.md's sbatch script as written, sized for this cluster (2 of its nodes, no GPUs), its
    `python train.py ...` the test's script with as many steps as ``out/steps`` says when it starts."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "slurm.md").read_text()
    script = next(block for block in guide.split("```bash\n")[1:] if block.startswith("#!/bin/bash"))
    script = script.split("```")[0]
    lines = [line for line in script.splitlines() if "--gpus-per-node" not in line]
    script = "\n".join(lines).replace("--nodes=4", "--nodes=2").replace("--nnodes 4:8", "--nnodes 2:2")
    train = f"python {ELASTIC_SCRIPT} {out} --batch 16 --step-delay 0.03 --steps $(cat {out}/steps)"
    assert "python train.py --epochs 90" in script, script
    return script.replace("python train.py --epochs 90", train) + "\n"


def _node_state(slurm3, node: str) -> str:
    out = slurm3.run(0, ["scontrol", "-o", "show", "node", node]).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("State=")), "")


def _job_steps_left(slurm3, host: int) -> int:
    """slurmstepd processes on ``host``: a job's steps still ending there (the node may say IDLE already)."""
    left = 0
    for pid in slurm3.hosts.pids(host):
        try:
            left += b"slurmstepd" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
    return left


def _job_field(slurm3, job: str, name: str) -> str:
    out = slurm3.run(0, ["scontrol", "-o", "show", "job", job]).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith(f"{name}=")), "")


def test_the_guides_sbatch_script_requeues_after_a_notice_though_a_node_was_lost_earlier(slurm3, tmp_path):
    """slurm.md's sbatch script on n0, n1: n1's task is SIGKILLed (137: srun's status is no longer
    what the launcher says), then `scancel --signal=TERM`: the launcher takes its final checkpoint,
    exits 75 and requeues the job itself; the requeued job (held by Slurm's BeginTime, released
    here) resumes from that checkpoint, says so, and completes."""
    out = tmp_path / "a"
    out.mkdir()
    (out / "steps").write_text("100000")
    (out / "job.sh").write_text(_guide_script(out))
    environ = dict(
        slurm3.env,
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        TAIJI_HOME=str(out / "home"),
    )
    done = slurm3.run(
        0, ["sbatch", "--parsable", "-w", "n0,n1", str(out / "job.sh")], cwd=str(out), env=environ
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    log = out / f"slurm-{job}.out"
    try:
        wait_for(lambda: committed_steps(out, "w1") > 0, 180, "a step with 2 workers")
        os.kill(_task_pid(slurm3, 1, "run"), signal.SIGKILL)  # n1's task: srun's status is 137 from now on
        wait_for(lambda: "cluster v2" in _text(log), 60, "the job to shrink")
        wait_for(lambda: '"size": 1' in _text(out / "w0.jsonl"), 60, "a step after the shrink")
        slurm3.run(0, ["scancel", "--signal=TERM", job])
        wait_for(
            lambda: (
                _job_field(slurm3, job, "Restarts") == "1"
                and _job_field(slurm3, job, "JobState") == "PENDING"
            ),
            120,
            "the launcher to requeue its job",
        )
        requeued = time.time()
        assert _job_field(slurm3, job, "Reason") == "BeginTime", _job_field(
            slurm3, job, "Reason"
        )  # slurm.md says so
        stopped_at = Storage(str(out / "ckpt")).listing().latest
        assert stopped_at is not None and stopped_at == committed_steps(out, "w0"), stopped_at
        (out / "steps").write_text(str(stopped_at + 3))
        # released at once, not after the ~2 min Slurm holds it, but only once the first run has left its
        # nodes and its second has passed: else Slurm kills the new run ("Job credential revoked")
        wait_for(
            lambda: (
                all(_node_state(slurm3, node) == "IDLE" for node in ("n0", "n1"))
                and not any(_job_steps_left(slurm3, host) for host in (0, 1))
                # slurmd revokes the old run's credential with a time in whole seconds: a new one
                # issued within that same second counts as revoked too
                and time.time() >= int(requeued) + 2
            ),
            120,
            "the first run's nodes to finish its steps",
        )
        slurm3.run(0, ["scontrol", "update", f"JobId={job}", "StartTime=now"])
        wait_for(
            lambda: _job_field(slurm3, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
            240,
            "the requeued job to resume and complete",
        )
        said = _text(log)
        assert _job_field(slurm3, job, "JobState") == "COMPLETED", said[-4000:]
    finally:
        slurm3.run(0, ["scancel", job])
    assert "requeueing Slurm job" in said and f"resumable from {out}/ckpt/step-{stopped_at:08d}" in said, (
        said[-4000:]
    )
    assert f"resuming from {out}/ckpt/step-{stopped_at:08d}" in said, said[-4000:]
    assert "add a host: copy" not in said, said[:3000]
    assert "Traceback" not in said, said[-4000:]


def test_the_host_list_parser_agrees_with_scontrol(slurm3):
    from taiji.launch.hosts.slurm import expand_hostlist

    for text in ("n[0-2]", "rack[1-2]-n[01-03],x,y[7,9-10]", "z[098-101],a"):
        done = slurm3.run(0, ["scontrol", "show", "hostnames", text])
        assert expand_hostlist(text) == tuple(done.stdout.split()), (text, done.stdout, done.stderr)
