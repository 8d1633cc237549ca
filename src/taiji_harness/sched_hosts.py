"""The live scheduler on emulated hosts (netns.py), for tests/multihost: a daemon (``taiji sched
serve``) in one namespace over the hosts of a hosts file or the nodes of a Ray cluster, its CLI,
its saved state read back, and the audit that no host ever held more workers than its slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from taiji.sched.live import placement_timeline
from taiji.sched.rounds import oversubscribed_instants

from .netns import EmulatedHosts
from .testing import SCRIPTS, wait_for

PORT = 29470
TRAIN = [sys.executable, str(SCRIPTS / "elastic_train.py")]


class SchedOnHosts:
    """A daemon on host ``home`` serving the hosts' 1 slot each: from a hosts file, each host
    driven by its agent (``agent``), or (``pool_args``: ``--ray ADDRESS ...``) the nodes of a Ray cluster."""

    def __init__(
        self,
        hosts: EmulatedHosts,
        out: Path,
        home: int = 0,
        serve_args: tuple[str, ...] = (),
        pool_args: tuple[str, ...] | None = None,
    ):
        self.hosts, self.out, self.state = hosts, out, out / "sched"
        self.home, self.serve_args = home, serve_args
        self.env = dict(
            os.environ, TAIJI_HOME=str(out / "home"), PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL="ERROR"
        )
        self.addresses = [hosts.address(i) for i in range(hosts.n)]
        (out / "hosts.txt").write_text("".join(f"{a} 1\n" for a in self.addresses))
        self.pool_args = ("--hosts", str(out / "hosts.txt")) if pool_args is None else pool_args
        self.daemon: subprocess.Popen | None = None
        self.agents: dict[int, subprocess.Popen] = {}

    def cli(self, command: str, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "sched",
            command,
            "--state-dir",
            str(self.state),
            *args,
        ]

    def serve(self) -> None:
        previous = self.daemon.pid if self.daemon is not None else None
        with open(self.out / "daemon.log", "a") as log:
            self.daemon = self.hosts.popen(
                self.home,
                self.cli(
                    "serve",
                    *self.pool_args,
                    "--address",
                    f"{self.addresses[self.home]}:{PORT}",
                    "--policy",
                    "drf",
                    "--round",
                    "0.5",
                    "--host-timeout",
                    "3",
                    *self.serve_args,
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

        def serving() -> bool:
            assert self.daemon.poll() is None, self.log("daemon")
            try:
                return json.loads((self.state / "daemon.json").read_text())["pid"] not in (None, previous)
            except (OSError, ValueError, KeyError):
                return False

        wait_for(serving, 60, "the daemon to serve")

    def agent(self, i: int) -> None:
        with open(self.out / f"agent{i}.log", "a") as log:
            self.agents[i] = self.hosts.popen(
                i,
                self.cli("agent", "--host", self.addresses[i], "--slots", "1"),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def all_up(self, daemons: int = 1) -> None:
        """Every host's agent polls the daemon (the ``daemons``-th one started here)."""
        wait_for(
            lambda: all(
                self.log("daemon", all_of_it=True).count(f"host {a} is up") >= daemons for a in self.addresses
            ),
            30,
            "every host's agent to poll the daemon",
        )

    def spread(self, name: str, steps: int) -> str:
        """A daemon and every agent up, then a job that grows onto all three hosts; its id."""
        self.serve()
        for i in range(self.hosts.n):
            self.agent(i)
        self.all_up()
        job = self.submit(name, 3, steps)
        wait_for(lambda: self.placed(job, [1, 1, 1]), 90, "the job on all three hosts")
        return job

    def sched(self, *args: str) -> str:
        done = self.hosts.run(self.home, self.cli(*args), env=self.env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def submit(
        self,
        name: str,
        max_np: int,
        steps: int,
        *options: str,
        step_delay: float = 0.01,
        train_args: tuple[str, ...] = (),
    ) -> str:
        (self.out / name).mkdir()
        return self.sched(
            "submit",
            "--max-np",
            str(max_np),
            "--name",
            name,
            *options,
            "--",
            *TRAIN,
            str(self.out / name),
            "--steps",
            str(steps),
            "--step-delay",
            f"{step_delay:g}",
            *train_args,
        ).strip()

    def jobs(self) -> dict[str, dict]:
        try:
            return {j["id"]: j for j in json.loads((self.state / "state.json").read_text())["jobs"]}
        except (OSError, ValueError, KeyError):
            return {}

    def placed(self, job: str, placement: list[int]) -> bool:
        seen = self.jobs().get(job, {})
        assert seen.get("state") != "failed", seen.get("reason")
        return seen.get("state") == "running" and seen.get("placement") == placement

    def ended(self, job: str, state: str = "finished") -> bool:
        seen = self.jobs().get(job, {})
        assert seen.get("state") in (None, "queued", "running", "suspended", state), (
            seen.get("state"),
            seen.get("reason"),
        )
        return seen.get("state") == state

    def oversubscribed(self) -> list[float]:
        timelines = {}
        for job in self.jobs():
            path = self.state / "jobs" / job / "run" / "events.jsonl"
            events = (
                [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
            )
            timelines[job] = placement_timeline(events, self.addresses)
        return oversubscribed_instants((1,) * len(self.addresses), timelines)

    def log(self, name: str, all_of_it: bool = False) -> str:
        path = self.out / f"{name}.log"
        text = path.read_text() if path.exists() else ""
        return text if all_of_it else text[-3000:]

    def stop(self) -> None:
        """`sched stop`, then the agents; every process on every host is gone."""
        self.sched("stop")
        assert self.daemon is not None and self.daemon.wait(60) == 0, self.log("daemon")
        for agent in self.agents.values():
            agent.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            assert agent.wait(30) == 0
        for i in range(self.hosts.n):
            wait_for(lambda i=i: not self.hosts.pids(i), 30, f"every process on host {i} to exit")
