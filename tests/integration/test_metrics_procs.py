"""A running 2-worker `taiji run --metrics-port` job scraped by a real Prometheus server (Debian's
`prometheus` package, `make prometheus`) on loopback, and `taiji top` in a real terminal (tmux).

One job serves both tests. Every process started here is reaped by its id in a ``finally``; the
Prometheus server gets its own config and data directory under the test's temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from taiji.errors import StoreError
from taiji_harness.testing import REPO, SCRIPTS, stop_launcher, wait_for

pytest.importorskip("prometheus_client", reason="the metrics extra is missing: pip install -e '.[metrics]'")

CLI = [sys.executable, "-m", "taiji.launch.cli"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RunningJob:
    def __init__(self, tmp: Path):
        self.env = dict(os.environ, TAIJI_HOME=str(tmp / "home"), PYTHONUNBUFFERED="1")
        self.metrics_port, self.job_id = _free_port(), f"jm{os.getpid()}"
        args = CLI + [
            "run",
            "-np",
            "2",
            "--max-np",
            "3",
            "--job-id",
            self.job_id,
            "--metrics-port",
            str(self.metrics_port),
            "--checkpoint-dir",
            str(tmp / "ck"),
            "--checkpoint-every",
            "20",
            "--",
            sys.executable,
            str(SCRIPTS / "elastic_train.py"),
            str(tmp / "out"),
            "--steps",
            "1000000",
            "--step-delay",
            "0.01",
        ]
        (tmp / "out").mkdir()
        self.log = open(tmp / "launcher.log", "w+")
        self.proc = subprocess.Popen(
            args,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=self.env,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def status(self) -> dict:
        from taiji.launch import registry
        from taiji.launch.control_socket import request

        before = os.environ.get("TAIJI_HOME")
        os.environ["TAIJI_HOME"] = self.env["TAIJI_HOME"]  # where the registry is (env.py reads it)
        try:
            return request(registry.control_socket(self.job_id), {"op": "status"})
        finally:
            if before is None:
                del os.environ["TAIJI_HOME"]
            else:
                os.environ["TAIJI_HOME"] = before

    def resize(self, size: int) -> None:
        done = subprocess.run(
            CLI + ["resize", "--job", self.job_id, str(size)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr

    def close(self) -> None:
        stop_launcher(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    running = RunningJob(tmp_path_factory.mktemp("metrics_job"))
    try:

        def trained() -> bool:
            assert running.proc.poll() is None, running.output()[-3000:]
            try:
                return (running.status().get("progress") or {}).get("step", 0) > 0
            except StoreError:  # its control socket is not there yet
                return False

        wait_for(trained, 90, "the job's first status")
        yield running
    finally:
        running.close()


class Prometheus:
    """A Prometheus server on loopback scraping ``targets`` every second (own config and data dir)."""

    def __init__(self, tmp: Path, targets: list[int]):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("no prometheus binary: `make prometheus` (Debian's prometheus package) installs it")
        self.port = _free_port()
        config = tmp / "prometheus.yml"
        listed = ", ".join(f"'127.0.0.1:{t}'" for t in targets)
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
            f"  - job_name: taiji\n    static_configs:\n      - targets: [{listed}]\n"
        )
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = json.loads(urllib.request.urlopen(url, timeout=5).read())
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def value(self, expr: str) -> float | None:
        try:
            result = self.query(expr)
        except OSError:
            return None  # not listening yet
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def test_prometheus_scrapes_the_job_and_sees_it_train_and_resize(job, tmp_path):
    prom = Prometheus(tmp_path, [job.metrics_port])
    try:
        selector = f'{{job_id="{job.job_id}"}}'

        def value(name: str) -> float | None:
            return prom.value(name + selector)

        wait_for(lambda: value("taiji_job_step") is not None, 30, "Prometheus's first scrape of the job")
        first = value("taiji_job_step")
        wait_for(lambda: (value("taiji_job_step") or 0) > first, 15, "the step series to move")
        assert prom.value('up{job="taiji"}') == 1
        assert value("taiji_job_cluster_size") == 2
        assert (value("taiji_job_samples_per_second") or 0) > 0
        assert value("taiji_job_step_seconds") is not None
        # a checkpoint every 20 steps: its step moves, its stall is measured, its age is time() - timestamp
        wait_for(lambda: (value("taiji_job_checkpoint_step") or 0) >= 20, 30, "a checkpoint in the metrics")
        assert value("taiji_job_checkpoint_stall_seconds") >= 0
        age = prom.value(f"time() - taiji_job_checkpoint_timestamp_seconds{selector}")
        assert age is not None and -5 < age < 60, age
        version = value("taiji_job_cluster_version")
        job.resize(3)
        wait_for(lambda: value("taiji_job_cluster_size") == 3, 30, "the cluster size series to reach 3")
        assert value("taiji_job_cluster_version") > version
        assert prom.value(f'taiji_job_resizes_total{{job_id="{job.job_id}",reason="grow"}}') == 1
        # the scraped series has history: the size was 2 before and 3 now
        assert (
            prom.value(
                f"max_over_time(taiji_job_cluster_size{selector}[1m]) - "
                f"min_over_time(taiji_job_cluster_size{selector}[1m])"
            )
            == 1
        )
    finally:
        prom.close()


def test_prometheus_scrapes_the_scheduler_starting_and_cancelling_a_job(tmp_path):
    env = dict(os.environ, TAIJI_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    state, port = tmp_path / "sched", _free_port()

    def sched(*args: str) -> str:
        done = subprocess.run(
            CLI + ["sched", args[0], "--state-dir", str(state), *args[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    log = open(tmp_path / "daemon.log", "w")
    daemon = subprocess.Popen(
        CLI
        + [
            "sched",
            "serve",
            "--slots",
            "2",
            "--policy",
            "drf",
            "--round",
            "0.5",
            "--state-dir",
            str(state),
            "--metrics-port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    prom = Prometheus(tmp_path, [port])
    try:
        wait_for(
            lambda: (state / "daemon.json").exists() or daemon.poll() is not None, 60, "the daemon to start"
        )
        assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
        wait_for(lambda: (prom.value("taiji_sched_rounds_total") or 0) > 0, 30, "Prometheus's first scrape")
        job_id = sched(
            "submit",
            "--max-np",
            "2",
            "--name",
            "sleeper",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
        )
        wait_for(lambda: prom.value('taiji_sched_jobs{state="running"}') == 1, 60, "the job running")
        assert prom.value('taiji_sched_decisions_total{kind="start"}') == 1
        wait_for(
            lambda: prom.value(f'taiji_sched_job_workers{{job_id="{job_id}",name="sleeper"}}') == 2,
            60,
            "the job on both slots",
        )
        assert prom.value('taiji_sched_host_slots_free{host="127.0.0.1"}') == 0
        assert prom.value("taiji_sched_round_seconds") is not None
        sched("cancel", job_id)
        wait_for(lambda: prom.value('taiji_sched_jobs{state="cancelled"}') == 1, 30, "the cancel to show")
        assert prom.value('taiji_sched_host_slots_free{host="127.0.0.1"}') == 2
        sched("stop")
        assert daemon.wait(60) == 0
    finally:
        prom.close()
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)
        for entry in (tmp_path / "home" / "jobs").glob("*.json"):  # any launcher the daemon left
            try:
                os.killpg(json.loads(entry.read_text())["pid"], signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError, OSError):
                pass
        log.close()


def test_a_second_launcher_on_the_same_metrics_port_is_refused_at_start(job, tmp_path):
    env = dict(job.env, TAIJI_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        CLI
        + ["run", "-np", "1", "--metrics-port", str(job.metrics_port), "--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1
    assert f"--metrics-port {job.metrics_port}: cannot listen on 127.0.0.1:{job.metrics_port}" in done.stderr


def test_taiji_top_in_a_terminal_shows_a_resize_within_2s(job, tmp_path):
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("no tmux: `apt-get install tmux` to drive `taiji top` in a terminal")
    session = f"taiji-top-{os.getpid()}"
    socket_path = str(tmp_path / "tmux.sock")
    base = [tmux, "-S", socket_path]
    command = " ".join([f"TAIJI_HOME={job.env['TAIJI_HOME']}", *CLI, "top", "--job", job.job_id])
    subprocess.run(
        base + ["new-session", "-d", "-s", session, "-x", "160", "-y", "20", command],
        check=True,
        timeout=10,
        env=job.env,
    )
    server_pid = int(
        subprocess.run(
            base + ["display-message", "-p", "-t", session, "#{pid}"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    )
    try:

        def screen() -> str:
            return subprocess.run(
                base + ["capture-pane", "-p", "-t", session], capture_output=True, text=True, timeout=5
            ).stdout

        def job_row() -> list[str]:
            rows = [line.split() for line in screen().splitlines() if line.startswith(job.job_id)]
            return rows[0] if rows else []

        wait_for(lambda: len(job_row()) > 3, 20, "taiji top's first view")
        size = len(job.status()["workers"])
        target = 2 if size == 3 else 3
        version = job_row()[2]
        job.resize(target)
        wait_for(lambda: job.status()["version"] > int(version[1:]), 30, "the resize to be published")
        published = time.monotonic()
        wait_for(
            lambda: job_row()[2] != version and job_row()[1] == str(target),
            2.0,
            "taiji top to show the resize",
        )
        assert time.monotonic() - published <= 2.0
        assert "SAMPLES/S" in screen()
    finally:
        subprocess.run(base + ["kill-server"], timeout=10)
        try:
            os.kill(server_pid, 0)
            os.kill(server_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
