"""End-to-end tests of the launcher, ``taiji run`` (taiji/launch/cli.py, taiji/launch/supervisor.py).

The launcher runs as a subprocess; its workers are tests/scripts/launcher_worker.py (plain
Python, starts in milliseconds; see its docstring for the options) or, where a test is about
taiji itself, scripts that call ``taiji.init()``. Workers write "PID STARTTIME" files; the test
opens a pidfd on each (after checking STARTTIME, so a reused pid is never mistaken for a
worker), which tells exactly when that process exits (zombies included) and lets the teardown
kill it without any risk of hitting an unrelated process. Every test that starts processes
uses the ``procs`` fixture, whose teardown SIGKILLs and reaps everything it tracked, also when
the test fails or times out.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taiji_harness.testing import REPO, SCRIPTS

WORKER = SCRIPTS / "launcher_worker.py"
TAIJI_JOB = SCRIPTS / "taiji_job.py"
CONSOLE_SCRIPT = Path(sys.executable).parent / "taiji"

WAIT = 60.0  # bound on anything that should take a few seconds (the machine may be loaded)
DEATH_WAIT = 20.0  # bound on a process dying after whatever should kill it
TEST_TIMEOUT = 180  # pytest-timeout, per test

# inherited values the launcher must override (or that would confuse the tests)
_SCRUBBED_PREFIXES = ("TAIJI_", "TORCHELASTIC_")
_SCRUBBED = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


# -- helpers --------------------------------------------------------------------------------


def _starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


class Proc:
    """A process started by a worker (not by the test), identified by pid + start time."""

    def __init__(self, name: str, pid: int, start: str):
        self.name, self.pid, self.start = name, pid, start
        self.pidfd: int | None = None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # gone (and reaped) already
        if _starttime(pid) != start:  # the pid now belongs to another process: ours is gone
            os.close(fd)
            return
        self.pidfd = fd

    def __repr__(self) -> str:
        return f"{self.name} (pid {self.pid})"

    def wait_dead(self, timeout: float) -> bool:
        """True once the process has exited (a zombie counts as exited), False on timeout."""
        if self.pidfd is None:
            return True
        readable, _, _ = select.select([self.pidfd], [], [], timeout)
        return bool(readable)

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Launcher:
    """``taiji run ARGS`` as a subprocess of the test, its stdout and stderr in files."""

    def __init__(
        self,
        args: list[str],
        out_dir: Path,
        cwd: Path,
        console_script: bool = False,
        extra_env: dict[str, str] | None = None,
    ):
        if console_script and CONSOLE_SCRIPT.exists():
            self.argv = [str(CONSOLE_SCRIPT), "run", *args]
        else:
            self.argv = [sys.executable, "-m", "taiji.launch.cli", "run", *args]
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED
        }
        env.update(extra_env or {})
        out_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = out_dir / "launcher.out", out_dir / "launcher.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # its own session, like a job started from a shell: a Ctrl-C goes to its process group
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def describe(self) -> str:
        return (
            f"launcher {self.argv} (pid {self.pid}, returncode {self.popen.returncode})\n"
            f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"
        )

    def wait(self, timeout: float = WAIT) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launcher did not exit within {timeout:.0f}s\n{self.describe()}")

    def lines_of_rank(self, rank: int) -> list[str]:
        prefix = f"rank {rank} | "
        return [line[len(prefix) :] for line in self.stdout.splitlines() if line.startswith(prefix)]


class Processes:
    """Everything a test starts; ``cleanup`` kills and reaps all of it, by pidfd / Popen only."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.launchers: list[Launcher] = []
        self.procs: list[Proc] = []

    def launch(self, args: list[str], cwd: Path | None = None, **kwargs) -> Launcher:
        launcher = Launcher(
            args, self.tmp_path / f"launch{len(self.launchers)}", cwd or self.tmp_path, **kwargs
        )
        self.launchers.append(launcher)
        return launcher

    def pid_dir(self) -> Path:
        path = self.tmp_path / "pids"
        path.mkdir(exist_ok=True)
        return path

    def wait_for_pids(self, launcher: Launcher, names: list[str], timeout: float = WAIT) -> dict[str, Proc]:
        """Wait (bounded) until the workers have written NAME.pid for every name; track them."""
        pid_dir = self.pid_dir()
        found: dict[str, Proc] = {}
        deadline = time.monotonic() + timeout
        while True:
            exited = launcher.popen.poll() is not None  # before the scan: no file can be missed
            for name in names:
                path = pid_dir / f"{name}.pid"
                if name not in found and path.exists():
                    pid, start = path.read_text().split()
                    found[name] = Proc(name, int(pid), start)
                    self.procs.append(found[name])
            if len(found) == len(names):
                return found
            missing = sorted(set(names) - set(found))
            if exited:
                pytest.fail(
                    f"the launcher exited before {missing} wrote their pid files\n{launcher.describe()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{missing} did not write their pid files within {timeout:.0f}s\n{launcher.describe()}"
                )
            time.sleep(0.02)  # polling for a file, bounded by the deadline above

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
        for launcher in self.launchers:
            if launcher.popen.poll() is None:
                launcher.popen.kill()
            try:
                launcher.popen.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            proc.wait_dead(5.0)
            proc.close()


@pytest.fixture
def procs(tmp_path):
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.cleanup()


def assert_all_dead(
    launcher: Launcher, procs: dict[str, Proc], why: str, timeout: float = DEATH_WAIT
) -> None:
    deadline = time.monotonic() + timeout
    survivors = [p for p in procs.values() if not p.wait_dead(max(0.0, deadline - time.monotonic()))]
    assert not survivors, f"{why}: {survivors} still alive {timeout:.0f}s later\n{launcher.describe()}"


def failure_report(launcher: Launcher) -> list[str]:
    """The launcher's lines that report a failed worker (stdout or stderr); not the line
    that echoes the command (test paths may contain "fail")."""
    return [
        line
        for line in (launcher.stdout + launcher.stderr).splitlines()
        if line.startswith("taiji") and "fail" in line and WORKER.name not in line
    ]


# -- bad input ----------------------------------------------------------------------------

BAD_INPUT = {
    # case: (arguments after `taiji`, words the one-line error must contain)
    "unknown-flag": (["run", "-np", "1", "--no-such-flag", "python", "-c", "pass"], ["--no-such-flag"]),
    "np-zero": (["run", "-np", "0", "python", "-c", "pass"], ["-np", "0"]),
    "missing-np": (["run", "python", "-c", "pass"], ["-np"]),
    "missing-script": (["run", "-np", "1", "python", "no_such_script.py"], ["no_such_script.py"]),
    "missing-bare-script": (["run", "-np", "1", "no_such_script.py"], ["no_such_script.py"]),
    "program-not-on-path": (
        ["run", "-np", "1", "taiji-no-such-program", "--flag"],
        ["taiji-no-such-program"],
    ),
    "program-not-executable": (
        ["run", "-np", "1", "./not_executable.sh"],
        ["not_executable.sh", "executable"],
    ),
    "no-command": (["run", "-np", "2"], ["command"]),
}


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
    """Runs every BAD_INPUT case at once (each launcher spends ~2 s of CPU importing torch)."""
    cwd = tmp_path_factory.mktemp("bad_input")
    script = cwd / "not_executable.sh"
    script.write_text("#!/bin/sh\necho this must never run\n")
    script.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED}
    running: dict[str, subprocess.Popen] = {}
    results: dict[str, tuple[int, str, str]] = {}
    try:
        for case, (args, _) in BAD_INPUT.items():
            running[case] = subprocess.Popen(
                [sys.executable, "-m", "taiji.launch.cli", *args],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        deadline = time.monotonic() + 2 * WAIT
        for case, popen in running.items():
            out, err = popen.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results[case] = (popen.returncode, out, err)
    finally:
        for popen in running.values():
            if popen.poll() is None:
                popen.kill()
            popen.wait()
    return results


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_clear_line_on_stderr_and_nonzero_exit(bad_input_results, case):
    returncode, out, err = bad_input_results[case]
    _, words = BAD_INPUT[case]
    report = f"case {case}: returncode {returncode}\n--- stdout ---\n{out}--- stderr ---\n{err}"
    assert returncode != 0, report
    lines = err.strip().splitlines()
    assert len(lines) == 1, report
    assert lines[0].startswith("taiji: error:"), report
    for word in words:
        assert word.lower() in lines[0].lower(), f"the error should mention {word!r}\n{report}"
    assert "Traceback" not in err, report
    assert "this must never run" not in out + err, report
    assert out == "", f"no job may start\n{report}"


# -- starting workers ---------------------------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
def test_workers_get_env_and_rank_prefixed_output(procs):
    """`taiji run -np 3 script.py` (a bare .py): each worker sees its TAIJI_* and torchrun
    variables, each line of its output reaches the launcher's stdout as "rank R | ...", and
    values inherited from the launcher's own environment (a stale job) are overridden."""
    n = 3
    stale = {
        "RANK": "7",
        "WORLD_SIZE": "9",
        "LOCAL_RANK": "7",
        "MASTER_PORT": "1",
        "MASTER_ADDR": "10.9.9.9",
        "TAIJI_JOB_ID": "stale",
        "TAIJI_WORKER_ID": "stale",
        "TAIJI_STORE_PORT": "1",
        "TAIJI_LAUNCHER_PID": "1",
    }
    launcher = procs.launch(
        [
            "-np",
            str(n),
            "--job-id",
            "envjob",
            "--timeout",
            "17",
            "--debug-collectives",
            WORKER.name,
            "--print-env",
            "--lines",
            "*=3",
            "--pid-dir",
            str(procs.pid_dir()),
        ],
        cwd=SCRIPTS,
        extra_env=stale,
    )
    assert launcher.wait() == 0, launcher.describe()
    workers = procs.wait_for_pids(launcher, [f"worker-{r}" for r in range(n)])

    out = launcher.stdout
    store = re.search(r"store 127\.0\.0\.1:(\d+)", out)
    assert store, f"the launcher should say where its store listens\n{launcher.describe()}"
    port = store.group(1)
    assert int(port) > 0

    secrets = set()
    for rank in range(n):
        lines = launcher.lines_of_rank(rank)
        env = dict(line[len("ENV ") :].split("=", 1) for line in lines if line.startswith("ENV "))
        expected = {
            "TAIJI_JOB_ID": "envjob",
            "TAIJI_WORKER_ID": f"w{rank}",
            "TAIJI_STORE_HOST": "127.0.0.1",
            "TAIJI_STORE_PORT": port,
            "TAIJI_LAUNCHER_PID": str(launcher.pid),
            "TAIJI_DEBUG_COLLECTIVES": "1",
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        actual = {name: env.get(name) for name in expected}
        assert actual == expected, f"rank {rank}\n{launcher.describe()}"
        assert float(env["TAIJI_TIMEOUT"]) == 17.0, launcher.describe()
        assert len(env["TAIJI_SECRET"]) >= 16, launcher.describe()
        secrets.add(env["TAIJI_SECRET"])
        # its own output, all of it, under its own rank
        assert [line for line in lines if " line " in line] == [f"r{rank} line {i:03d}" for i in range(3)], (
            launcher.describe()
        )
        assert "READY" in lines
    assert len(secrets) == 1, "all workers of a job share its secret"
    for line in out.splitlines():
        assert line.startswith("taiji: ") or re.match(r"rank \d \| ", line), (
            f"a line that is neither the launcher's nor prefixed with a rank: {line!r}\n{launcher.describe()}"
        )
    assert_all_dead(launcher, workers, "after a successful job")


@pytest.mark.timeout(TEST_TIMEOUT)
def test_one_worker_job_with_taiji_init_exits_0(procs):
    """The `taiji` console script, `python script.py` (no `--`), one worker calling taiji.init()."""
    launcher = procs.launch(["-np", "1", "python", TAIJI_JOB.name], cwd=SCRIPTS, console_script=True)
    assert launcher.wait() == 0, launcher.describe()
    assert launcher.lines_of_rank(0) == ["worker w0 rank 0 of 1 (RANK=0): allreduce sum 1 (expected 1)"], (
        launcher.describe()
    )


@pytest.mark.timeout(TEST_TIMEOUT)
def test_two_worker_taiji_job_with_separator(procs):
    """`taiji run -np 2 -- python script.py`: both workers join one job and all-reduce."""
    launcher = procs.launch(["-np", "2", "--", "python", str(TAIJI_JOB)])
    assert launcher.wait() == 0, launcher.describe()
    for rank in range(2):
        assert launcher.lines_of_rank(rank) == [
            f"worker w{rank} rank {rank} of 2 (RANK={rank}): allreduce sum 3 (expected 3)"
        ], launcher.describe()


# -- a worker fails -------------------------------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
def test_first_failure_stops_the_others_and_reports_the_root_cause(procs):
    """Rank 1 prints 100 lines and exits 3 while ranks 0 and 2 (with a grandchild) run forever:
    the launcher names rank 1 with its exit code and last lines, stops everything else, the
    grandchild included, and exits 3."""
    pid_dir = procs.pid_dir()
    launcher = procs.launch(
        [
            "-np",
            "3",
            "--",
            "python",
            str(WORKER),
            "--pid-dir",
            str(pid_dir),
            "--barrier",
            "--lines",
            "1=100",
            "--exit",
            "1=3",
            "--grandchild",
            "2",
            "--block",
        ]
    )
    running = procs.wait_for_pids(launcher, ["worker-0", "worker-1", "worker-2", "grandchild-2"])
    assert launcher.wait() == 3, launcher.describe()

    report = failure_report(launcher)
    assert len(report) == 1, f"exactly one root cause should be reported\n{launcher.describe()}"
    for words in ("w1", "rank 1", "exit code 3"):
        assert words in report[0], f"{words!r} missing from {report[0]!r}\n{launcher.describe()}"
    # the last lines of rank 1's output follow the report, in order, ending with its last line
    after = (launcher.stdout + launcher.stderr).split(report[0], 1)[1]
    tail = [int(m.group(1)) for m in re.finditer(r"^\s*r1 line (\d{3})$", after, re.MULTILINE)]
    assert len(tail) >= 5 and tail == list(range(tail[0], 100)) and tail[0] > 0, (
        f"expected the last lines of rank 1's output after the report, got lines {tail}\n"
        f"{launcher.describe()}"
    )
    assert launcher.lines_of_rank(1)[-1] == "r1 line 099", launcher.describe()
    assert_all_dead(launcher, running, "the launcher should have stopped every worker and its process group")


@pytest.mark.timeout(TEST_TIMEOUT)
def test_worker_killed_by_signal_exits_128_plus_signal(procs):
    launcher = procs.launch(
        [
            "-np",
            "2",
            "--",
            "python",
            str(WORKER),
            "--pid-dir",
            str(procs.pid_dir()),
            "--barrier",
            "--signal",
            "0=KILL",
            "--block",
        ]
    )
    running = procs.wait_for_pids(launcher, ["worker-0", "worker-1"])
    assert launcher.wait() == 128 + signal.SIGKILL, launcher.describe()
    report = failure_report(launcher)
    assert len(report) == 1 and "rank 0" in report[0] and "SIGKILL" in report[0], launcher.describe()
    assert_all_dead(launcher, running, "after a worker was killed")


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    "how, worker_args, returncode",
    [
        ("failed", ["--exit", "0=5", "--block"], 5),  # rank 0 exits 5, the launcher stops rank 1
        ("succeeded", [], 0),  # both ranks exit 0
    ],
    ids=["failed", "succeeded"],
)
def test_an_exited_workers_grandchild_is_not_orphaned(procs, how, worker_args, returncode):
    """Rank 0 starts a grandchild (a DataLoader worker, say) and exits without stopping it."""
    launcher = procs.launch(
        [
            "-np",
            "2",
            "--",
            "python",
            str(WORKER),
            "--pid-dir",
            str(procs.pid_dir()),
            "--barrier",
            "--grandchild",
            "0",
            "--grandchild-stdout",
            "devnull",
            *worker_args,
        ]
    )
    running = procs.wait_for_pids(launcher, ["worker-0", "worker-1", "grandchild-0"])
    assert launcher.wait() == returncode, launcher.describe()
    assert_all_dead(
        launcher, running, f"no process of a job whose worker {how} may outlive the launcher", timeout=2.0
    )


# -- the launcher is stopped ----------------------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_launcher_stops_all_workers(procs, signum):
    """Ctrl-C (SIGINT to the launcher's process group) or SIGTERM: every worker stops, the
    grandchild of rank 0 too; rank 1 ignores SIGTERM and is SIGKILLed once --grace is over;
    the launcher exits 128 + signal."""
    grace = 1.0
    launcher = procs.launch(
        [
            "-np",
            "2",
            "--grace",
            str(grace),
            "--",
            "python",
            str(WORKER),
            "--pid-dir",
            str(procs.pid_dir()),
            "--grandchild",
            "0",
            "--ignore-term",
            "1",
            "--block",
        ]
    )
    running = procs.wait_for_pids(launcher, ["worker-0", "worker-1", "grandchild-0"])
    sent = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(launcher.pid, signum)  # what the terminal does on Ctrl-C
    else:
        os.kill(launcher.pid, signum)
    assert running["worker-1"].wait_dead(WAIT), (
        f"rank 1 ignores SIGTERM and was never killed\n{launcher.describe()}"
    )
    stubborn_died_after = time.monotonic() - sent
    assert launcher.wait() == 128 + signum, launcher.describe()
    assert_all_dead(launcher, running, f"after {signum.name} to the launcher")
    assert signum.name in launcher.stdout + launcher.stderr, "the launcher should say why it stops the job"
    # killed after the grace period: not before, and not after the default 5 s either
    assert grace <= stubborn_died_after < grace + 3.5, (
        f"rank 1 died {stubborn_died_after:.2f}s after {signum.name}, expected {grace}s later\n"
        f"{launcher.describe()}"
    )


@pytest.mark.timeout(TEST_TIMEOUT)
def test_workers_die_when_the_launcher_is_sigkilled(procs):
    """Nothing the launcher can catch: rank 0 (plain Python) dies through PR_SET_PDEATHSIG;
    rank 1 clears its parent-death signal and then calls taiji.init(), so only the pidfd
    watchdog of taiji.init() can stop it; the watchdog also takes rank 1's own child down."""
    launcher = procs.launch(
        [
            "-np",
            "2",
            "--",
            "python",
            str(WORKER),
            "--pid-dir",
            str(procs.pid_dir()),
            "--no-pdeathsig",
            "1",
            "--taiji-init",
            "1",
            "--grandchild",
            "1",
            "--grandchild-stdout",
            "devnull",
            "--block",
        ]
    )
    # rank 1 writes its pid file only once taiji.init() has returned
    running = procs.wait_for_pids(launcher, ["worker-0", "worker-1", "grandchild-1"])
    launcher.popen.kill()
    assert launcher.wait() == -signal.SIGKILL
    assert running["worker-0"].wait_dead(DEATH_WAIT), (
        f"rank 0 outlived the SIGKILLed launcher: PR_SET_PDEATHSIG did not fire\n{launcher.describe()}"
    )
    assert running["worker-1"].wait_dead(DEATH_WAIT), (
        f"rank 1 outlived the SIGKILLed launcher: taiji.init()'s launcher watchdog did not fire\n"
        f"{launcher.describe()}"
    )
    assert running["grandchild-1"].wait_dead(DEATH_WAIT), (
        f"rank 1's child outlived the SIGKILLed launcher\n{launcher.describe()}"
    )


@pytest.mark.timeout(TEST_TIMEOUT)
def test_closed_launcher_output_does_not_block_workers():
    """`taiji run ... | head -1`: once the reader is gone, the launcher keeps draining the
    workers' pipes (which would otherwise fill and block them) and the job still ends."""
    args = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--",
        "python",
        str(WORKER),
        "--lines",
        "0=20000",
        "--lines",
        "1=20000",
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, start_new_session=True
    )
    try:
        proc.stdout.readline()
        proc.stdout.close()  # like `head -1` exiting
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


HOLD_TORCH = """
import importlib.abc, os, sys, time
class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":   # the launcher's import of torch waits until its workers have started
            deadline = time.monotonic() + float(os.environ["HOLD_SECONDS"])
            while not all(os.path.exists(os.environ["HOLD_FLAG"] + str(r)) for r in range(2)):
                if time.monotonic() > deadline:
                    raise ImportError("torch held: no worker started before the launcher imported torch")
                time.sleep(0.05)
            sys.meta_path.remove(self)
        return None
sys.meta_path.insert(0, Hold())
"""


@pytest.mark.timeout(TEST_TIMEOUT)
def test_the_first_workers_start_before_the_launcher_imports_torch(procs, tmp_path):
    """With its TCPStore, `taiji run` starts its first workers, then imports torch to serve the
    store (each import takes seconds): the workers boot meanwhile. Here the launcher's import of
    torch is held until both workers have run; started after it, they never would."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_TORCH)
    flag = tmp_path / "started-"
    launcher = procs.launch(
        [
            "-np",
            "2",
            "--",
            "python",
            "-c",
            f"import os; open({str(flag)!r} + os.environ['RANK'], 'w').close()",
        ],
        extra_env={
            "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
            "HOLD_FLAG": str(flag),
            "HOLD_SECONDS": str(WAIT),
        },
    )
    assert launcher.wait() == 0, launcher.describe()
    assert "every worker exited 0" in launcher.stdout, launcher.describe()
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]
