"""Test harness shared by tests/unit, tests/integration, tests/faults, tests/multihost and benchmarks.

Ranks as threads against a real TCPStore (`run_threads`), real jobs via `taiji run` (`taiji_run`),
the helper worker scripts in tests/scripts (`load_script`), and the elastic-invariant checks used
by the fault tests (`run_elastic`, `check_invariants`); test modules import it as
``from taiji_harness.testing import ...``. Test modules never import each other: whatever two of
them share lives here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taiji.runtime.peer import Peer

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
BENCHMARKS = REPO / "benchmarks"
EXAMPLES = REPO / "examples"


def load_file(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` as module ``name`` (anew; registered in sys.modules, where
    dataclasses look their module up while it runs): no sys.path edit."""
    spec_ = importlib.util.spec_from_file_location(name, path)
    assert spec_ is not None and spec_.loader is not None and path.is_file(), f"no module file {path}"
    module = importlib.util.module_from_spec(spec_)
    sys.modules[name] = module
    try:
        spec_.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_script(name: str) -> ModuleType:
    """Import the helper script tests/scripts/<name>.py as module ``name`` (once per process)."""
    return sys.modules[name] if name in sys.modules else load_file(SCRIPTS / f"{name}.py", name)


def load_benchmark(name: str) -> ModuleType:
    """A benchmark script (benchmarks/<name>.py) as a module of a name of its own
    (``benchmark_<name>``), without running its main."""
    return load_file(BENCHMARKS / f"{name}.py", f"benchmark_{name}")


def load_example(name: str) -> ModuleType:
    """An example (examples/<name>.py) as module ``example_<name>`` (once per process), for the
    benchmarks that train the example's model on its data."""
    key = f"example_{name}"
    return sys.modules[key] if key in sys.modules else load_file(EXAMPLES / f"{name}.py", key)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def run_threads(
    n: int, fn: Callable[[Peer], Any], *, timeout: float = 5.0, join_timeout: float = 60.0
) -> list[Any]:
    """Run ``fn(peer)`` on ``n`` ranks as threads; return results by rank, re-raise the first error.

    Each rank gets its own store client and Peer (collective timeout ``timeout``), so a rank
    that never joins a collective makes the others time out rather than hang.
    """
    from taiji.cluster import spec
    from taiji.cluster.store import JobStore, connect_store, host_store
    from taiji.runtime.peer import Peer, PeerOptions

    server = host_store()
    job = JobStore(server, "threads")
    config = spec.initial([spec.WorkerSpec(f"w{r}") for r in range(n)])
    assert job.publish(config)
    results: list[Any] = [None] * n
    errors: list[tuple[int, BaseException, str]] = []

    def body(rank: int) -> None:
        peer = Peer(
            connect_store("127.0.0.1", server.port),
            JobStore(server, "threads"),
            f"w{rank}",
            config,
            PeerOptions(timeout=timeout),
        )
        try:
            results[rank] = fn(peer)
        except BaseException as exc:  # reported to the test below
            errors.append((rank, exc, traceback.format_exc()))
        finally:
            peer.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        raise AssertionError(f"ranks {hung} did not finish within {join_timeout}s (a hang)")
    if errors:
        rank, exc, tb = sorted(errors, key=lambda e: e[0])[0]
        raise AssertionError(f"rank {rank} failed:\n{tb}") from exc
    return results


def taiji_run(
    nproc: int,
    command: Sequence[str],
    *,
    timeout: float = 120.0,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run ``taiji run -np nproc [extra] -- command`` and return its completed process.

    The launcher runs in its own session; on timeout (or any error) the whole session is
    killed, so no test leaves processes behind.
    """
    args = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", str(nproc), *extra, "--", *command]
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=str(cwd or REPO),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"`taiji run` did not finish within {timeout}s:\n{out}\n{err}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def stop_launcher(launcher: subprocess.Popen, grace: float = 30.0) -> None:
    """Stop a launcher started with ``start_new_session=True``: SIGTERM its session (it stops its
    workers), SIGKILL what is left after ``grace``. A launcher that already exited is left alone."""
    if launcher.poll() is not None:
        return
    os.killpg(launcher.pid, signal.SIGTERM)
    try:
        launcher.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def read_rank_files(directory: Path, n: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(n)]


# -- elastic jobs with invariant checks (tests/scripts/elastic_train.py) ---------------------------

ELASTIC_SCRIPT = str(SCRIPTS / "elastic_train.py")


def committed_steps(out: Path, worker: str = "w0") -> int:
    """Steps a run of ``elastic_train.py`` has committed so far: the lines of one worker's per-step
    log (``w0``: the first worker, whom the fault schedules leave alone)."""
    path = out / f"{worker}.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_elastic(
    tmp_path: Path,
    nproc: int,
    *script_args: str,
    launcher_args: Sequence[str] = (),
    faults: list[dict] | None = None,
    batch: int = 16,
    timeout: float = 200,
) -> subprocess.CompletedProcess:
    """``taiji run -np nproc`` on elastic_train.py writing into ``tmp_path``, with TAIJI_FAULTS."""
    env = {"TAIJI_FAULTS": json.dumps(faults)} if faults else {}
    return taiji_run(
        nproc,
        [sys.executable, ELASTIC_SCRIPT, str(tmp_path), "--batch", str(batch), *script_args],
        extra=["--timeout", "3", "--run-dir", str(tmp_path / "run"), *launcher_args],
        env=env,
        timeout=timeout,
    )


def check_invariants(out: Path, batch: int, policy: str = "") -> dict:
    """docs/design.md#invariants on an elastic_train.py run: contiguous steps, identical replicas,
    exactly-once data, and the trajectory of an uninterrupted 1-worker run. Returns the audit."""
    result = load_script("elastic_train").audit(out, batch, policy)
    assert result["steps"] > 0 and not result["gaps"], f"committed steps are not contiguous: {result}"
    assert not result["worker_gaps"], f"a worker skipped steps its peers committed: {result['worker_gaps']}"
    assert not result["divergences"], f"replicas differ after steps {result['divergences']}"
    assert result["lost_samples"] == 0 and result["duplicated_samples"] == 0, result
    assert result["trajectory_error"] is not None and result["trajectory_error"] < 1e-9, result
    return result


def merge_runs(runs: Sequence[tuple[Path, int, int]], into: Path) -> None:
    """Runs of one job resumed from its checkpoints, as (out, from, to): each run's committed steps
    in [from, to), the steps that count once the job resumed, merged into ``into`` (with the last
    run's final.pt) for ``check_invariants``."""
    import shutil

    into.mkdir()
    for log in sorted({p.name for out, _, _ in runs for p in out.glob("w*.jsonl")}):
        lines = [
            ln
            for out, lo, hi in runs
            if (out / log).exists()
            for ln in (out / log).read_text().splitlines()
            if lo <= json.loads(ln)["step"] < hi
        ]
        (into / log).write_text("".join(ln + "\n" for ln in lines))
    shutil.copy(runs[-1][0] / "final.pt", into / "final.pt")


# -- SyncSGD equivalence with one worker (tests/scripts/train_equiv.py) ------------------------------


def train_equiv_reference(steps: int, batch: int, dtype: Any = None) -> tuple:
    """train_equiv.train on one solo worker: (params, momenta, consumed indices per step)."""
    import torch

    from taiji.runtime.peer import Peer

    return load_script("train_equiv").train(Peer.solo(), steps, batch, dtype or torch.float64)


def assert_close_to_reference(results: Sequence[tuple], ref: tuple, rtol: float, atol: float) -> None:
    """Replicas bitwise identical to each other, and close to the one-worker reference ``ref``."""
    import torch

    ref_params, ref_momenta, _ = ref
    first = results[0]
    for params, momenta, _ in results:
        for a, b in zip(params + momenta, first[0] + first[1]):
            assert torch.equal(a, b), "replicas are not bitwise identical"
        for a, b in zip(params, ref_params):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
        for a, b in zip(momenta, ref_momenta):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def classification_data(n: int):
    """A small seeded 4-feature, 3-class data set (a TensorDataset)."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


# -- what a process tree listens on: servers bind only the address they are given ---------------------


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a test that must kill a whole job, workers included)."""
    return _descendants(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return False
    return "zombie" not in state.lower()


def kill_job(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL ``pid`` and every process below it at once (a whole job lost: the launcher and
    its workers, which run in sessions of their own), then wait until none runs. The caller
    reaps ``pid`` if it is its child."""
    pids = process_tree(pid)
    for each in pids:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(_alive(p) for p in pids), timeout, "every process of the killed job to be gone")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _decode_address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return f"{'.'.join(str(b) for b in raw[::-1])}:{int(port, 16)}"
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # /proc prints each 32-bit word host-endian
    import ipaddress

    return f"[{ipaddress.IPv6Address(b''.join(words))}]:{int(port, 16)}"


def listening_addresses(pid: int) -> list[str]:
    """Every TCP address a process and its descendants listen on (from /proc, no tools needed)."""
    inodes = set().union(*(_socket_inodes(p) for p in _descendants(pid)))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_decode_address(fields[1]))
    return found


# -- a play-shaped corpus for the Shakespeare loader and example ---------------------------------------


def random_play(seed: int, speeches: int) -> str:
    """A play-shaped Markdown file of ``speeches`` speeches (what the elastic example test trains on)."""
    rng = random.Random(seed)
    words = "thou art the king my lord good night sweet prince love is not love which alters".split()
    lines = [f"# Play {seed}", ""]
    for _ in range(speeches):
        lines += [f"**{rng.choice(['HAMLET', 'OPHELIA', 'LEAR'])}**  "]
        lines += [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + ",  " for _ in range(2)] + [
            ""
        ]
    return "\n".join(lines) + "\n"


# -- the pure membership controller, event by event (tests/unit/test_controller*.py, test_hosts_control.py)


def feed(state, *events, now=0.0):
    """Feed ``events`` to ``taiji.cluster.controller.decide`` at time ``now``: (state, all actions)."""
    from taiji.cluster.controller import decide

    actions = []
    for event in events:
        state, more = decide(state, event, now)
        actions += more
    return state, actions


def actions_of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


# -- jobs across emulated hosts (taiji_harness/netns.py) -----------------------------------------------


class HostsJob:
    """`taiji run` on emulated host ``home`` (0 by default) and `taiji join` agents on the others,
    each writing its output to a file under ``out``; ``wait_log`` waits for a line of the
    launcher's output."""

    PORT = 29400

    def __init__(self, hosts, out: Path, job_id: str = "jmh", store: str = "tcp", home: int = 0):
        self.hosts, self.out, self.job_id, self.store, self.home = hosts, out, job_id, store, home
        self.env = dict(
            os.environ, TAIJI_HOME=str(out / "home"), PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR"
        )
        self.launcher: subprocess.Popen | None = None
        self.agents: dict[int, subprocess.Popen] = {}

    @property
    def secret_file(self) -> Path:
        return self.out / "home" / "jobs" / f"{self.job_id}.secret"

    @property
    def head(self) -> str:
        """The launcher's host's address."""
        return self.hosts.address(self.home)

    def start(self, launcher_args: Sequence[str], script_args: Sequence[str], timeout: float = 3) -> None:
        """``timeout``: the collective timeout (short by default, so a test that would wait for
        it fails fast; long where a test shows that nothing waits for it)."""
        cli = [sys.executable, "-m", "taiji.launch.cli"]
        args = [
            *cli,
            "run",
            *launcher_args,
            "--store",
            self.store,
            "--host",
            self.head,
            "--port",
            str(self.PORT),
            "--job-id",
            self.job_id,
            "--timeout",
            f"{timeout:g}",
            "--liveness-timeout",
            "2",
            "--run-dir",
            str(self.out / "run"),
            "--",
            sys.executable,
            ELASTIC_SCRIPT,
            str(self.out),
            *script_args,
        ]
        with open(self.out / "launcher.log", "w") as log:
            self.launcher = self.hosts.popen(
                self.home, args, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        wait_for(self.secret_file.exists, 60, "the launcher to write the job's secret file")

    def join(
        self, i: int, slots: int, secret_file: Path | None = None, extra: Sequence[str] = ()
    ) -> subprocess.Popen:
        where = {"tcp": f"{self.head}:{self.PORT}", "etcd": f"etcd://{self.head}:{self.PORT}"}.get(
            self.store, self.store
        )
        args = [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "join",
            f"{self.job_id}@{where}",
            "--secret-file",
            str(secret_file or self.secret_file),
            "--nproc-per-node",
            str(slots),
            "--host",
            self.hosts.address(i),
            "--timeout",
            "5",
            *extra,
        ]
        with open(self.out / f"agent{i}.log", "w") as log:
            self.agents[i] = self.hosts.popen(i, args, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self.agents[i]

    def commits(self) -> list[dict]:
        """Every worker's committed steps (tests/scripts/elastic_train.py's records), by time."""
        records = [
            json.loads(line) for path in self.out.glob("w*.jsonl") for line in path.read_text().splitlines()
        ]
        return sorted(records, key=lambda r: r["time"])

    def resumed_after(self, since: float, size: int) -> float:
        """Seconds from ``since`` (time.time()) to the first step committed after it at ``size`` workers."""
        first = next((r["time"] for r in self.commits() if r["time"] > since and r["size"] == size), None)
        assert first is not None, f"no step committed at {size} workers after the fault"
        return first - since

    def log(self, name: str = "launcher") -> str:
        path = self.out / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def wait_log(self, text: str, timeout: float = 90, name: str = "launcher") -> None:
        def seen() -> bool:
            if self.launcher is not None and self.launcher.poll() is not None and text not in self.log(name):
                raise AssertionError(
                    f"the launcher exited ({self.launcher.returncode}) before {text!r}:\n{self.log()[-4000:]}"
                )
            return text in self.log(name)

        wait_for(seen, timeout, f"{text!r} in {name}.log")

    def finish(self, timeout: float = 180) -> int:
        assert self.launcher is not None
        try:
            return self.launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the launcher did not finish within {timeout}s:\n{self.log()[-4000:]}"
            ) from None
