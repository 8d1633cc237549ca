"""Simulated hosts and workers for ``benchmarks/control_scale.py --live``: the real store protocol,
no torch collectives and no worker processes.

One process (``python -m taiji_harness.control_sim URL JOB SECRET_FILE``) serves many simulated
hosts, a thread each. A host does what ``taiji join``'s agent does in the store (launch/hosts/agent.py):
it registers, holds a tether to the controller, beats (its heartbeat summary of its workers,
one record per host, and on etcd its lease) and carries out the controller's signed orders
(``spawn``, ``kill``, ``stop``), reporting exits. Its workers do what a worker's background
threads do (runtime/liveness.py, runtime/membership.py): a heartbeat each every
``TAIJI_HEARTBEAT`` seconds (a count the agent reads on its host: in memory here, a file there),
``ready`` when spawned, and the config followed. Two simplifications keep 1,024 workers within two
shared cores: a host's workers follow the config together — one poll every ``WATCH_POLL_S`` on a TCP
store (a real worker polls on its own), one watch on etcd (a real worker holds its own: the same
``JobStore.follow_configs``, whose events carry the configs) — and each new config is read (TCP
store) and verified once per host, not once per worker.

Orders come on stdin, one JSON object a line; answers go to stdout, one JSON line each:
``{"op": "hosts", "addresses": [...], "slots": K}`` starts hosts; ``{"op": "kill", "address": A}``
drops one as its death would (tether closed without ``bye``, lease left to expire);
``{"op": "until", "size": S, "timeout": T}`` answers once every live worker holds a config of
``S`` workers, with when the last one got it and when the first did (``at``, ``first``:
``time.monotonic``, one clock for every process of this machine); ``{"op": "ops"}`` answers the
store operations counted on TCP stores (etcd's are counted by the server); ``{"op": "quit"}``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

from taiji import env
from taiji.cluster.auth import Signer
from taiji.cluster.spec import ClusterConfig
from taiji.cluster.store import JobStore, config_key, connect_job
from taiji.errors import StoreError
from taiji.launch.hosts import agent_channel
from taiji.launch.hosts.agent import BEAT_SECONDS
from taiji.launch.hosts.tether import Tether
from taiji.runtime.liveness import Heartbeat
from taiji.runtime.membership import WATCH_POLL_S

TICK_S = 0.02  # an agent's tick (launch/hosts/agent.py)
OPS = itertools.count()  # store operations of this process on TCP stores (next() is atomic)


class CountedKV:
    """A TCP store client that counts its calls (a TCPStore has no abilities to keep)."""

    def __init__(self, kv):
        self.kv = kv

    def _count(self, fn, *args):
        next(OPS)
        return fn(*args)

    def set(self, key, value):
        return self._count(self.kv.set, key, value)

    def get(self, key):
        return self._count(self.kv.get, key)

    def compare_set(self, key, expected, desired):
        return self._count(self.kv.compare_set, key, expected, desired)

    def add(self, key, amount):
        return self._count(self.kv.add, key, amount)

    def check(self, keys):
        return self._count(self.kv.check, keys)

    def set_timeout(self, timeout):
        self.kv.set_timeout(timeout)

    def wait(self, keys, timeout):
        return self._count(self.kv.wait, keys, timeout)


def open_job(url: str, job_id: str, secret: bytes) -> JobStore:
    raw, job = connect_job(url, job_id, secret, timeout=60.0)
    return job if job.can_watch else JobStore(CountedKV(raw), job_id, Signer(secret))


class Workers:
    """One host's simulated workers: a heartbeat each, and the config they hold (read once per host
    and per version: the simulation's second simplification)."""

    def __init__(self, job: JobStore, heartbeat: float):
        self.job, self.heartbeat = job, heartbeat
        self.beats: dict[str, int] = {}
        self.version = self.size = 0
        self.at = 0.0  # when the host's workers got that config
        self._beat_at = self._poll_at = 0.0

    def add(self, worker_id: str) -> None:
        self.beats[worker_id] = 0
        self.job.mark_ready(worker_id)

    def step(self, now: float) -> None:
        if now >= self._beat_at:
            self._beat_at = now + self.heartbeat
            for wid in self.beats:
                self.beats[wid] += 1
        if not self.job.can_watch and now >= self._poll_at:  # (etcd: ``follow_configs``)
            self._poll_at = now + WATCH_POLL_S
            if self.job.has(config_key(self.version + 1)):
                self.hold(self.job.read_config(max(self.version + 1, self.job.latest_version())))

    def hold(self, config: ClusterConfig) -> None:
        if config.version > self.version:
            self.version, self.size, self.at = config.version, config.size, time.monotonic()


class SimHost(threading.Thread):
    """One simulated host: its agent's part of the protocol and its workers."""

    def __init__(self, url: str, job_id: str, secret: bytes, address: str, slots: int):
        super().__init__(name=f"sim-{address}", daemon=True)
        self.url, self.job_id, self.secret, self.address, self.slots = url, job_id, secret, address, slots
        self.killed = threading.Event()
        self.dropped_at: float | None = None
        self.workers: Workers | None = None
        self.tether: Tether | None = None
        self.error: str | None = None

    def kill(self) -> float | None:
        """Its agent's death, at once: the tether closed without ``bye``, the lease left to expire.
        Done here, not by the host's thread, which on a loaded machine may be inside a store call
        for seconds (it stops at its next tick); None if the host has no tether yet."""
        self.killed.set()
        if self.tether is None:
            return None
        self.tether.drop()
        self.dropped_at = time.monotonic()
        return self.dropped_at

    def run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # noqa: BLE001 - said to the harness, which fails the run
            self.error = f"{self.address}: {type(exc).__name__}: {exc}"
            print(json.dumps({"error": self.error}), file=sys.stderr, flush=True)

    def _serve(self) -> None:
        job = open_job(self.url, self.job_id, self.secret)
        session = uuid.uuid4().hex[:12]
        bounds = agent_channel.read_bounds(job)
        channel = agent_channel.AgentChannel(job, self.address, session, bounds.host_timeout)
        settings = agent_channel.read_settings(job)
        agent_channel.register(job, self.address, self.slots, os.getpid(), session)
        tether = self.tether = Tether(
            str(agent_channel.read_controller(job)["tether"]), self.secret, self.address, session
        )
        workers = self.workers = Workers(job, settings.heartbeat)
        if job.can_watch:
            threading.Thread(
                target=follow_configs, args=(job.another_connection(), workers, self.killed), daemon=True
            ).start()
        next_beat = 0.0
        while not self.killed.wait(TICK_S):
            for command in channel.new_commands():
                op = command.get("op")
                if op == "spawn":
                    workers.add(str(command["id"]))
                elif op == "kill":
                    workers.beats.pop(str(command["id"]), None)
                    channel.report({"op": "exit", "id": str(command["id"]), "code": -9, "tail": []})
                elif op in ("stop", "refuse"):
                    workers.beats.clear()
                    channel.report({"op": "bye"})
                    tether.close()
                    return
            now = time.monotonic()
            workers.step(now)
            if now >= next_beat:
                channel.beat(dict(workers.beats))
                next_beat = now + BEAT_SECONDS
        workers.beats.clear()  # killed: the tether was dropped by ``kill``


def follow_configs(job: JobStore, workers: Workers, stop: threading.Event) -> None:
    """The configs on etcd, as a real worker's watcher follows them (runtime/membership.py), on a
    connection of its own: each one arrives in the watch's event, verified and held."""
    try:
        for config in job.follow_configs(stop):
            workers.hold(config)
    except StoreError:
        pass


def _until(hosts: list[SimHost], size: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        live = [h.workers for h in hosts if not h.killed.is_set()]
        held = [w for w in live if w is not None]
        errors = [h.error for h in hosts if h.error]
        workers = sum(len(w.beats) for w in held)
        if errors or all(w is not None and w.beats and w.size == size for w in live):
            ats = sorted(w.at for w in held)
            return {
                "at": max(ats, default=0.0),
                "first": min(ats, default=0.0),
                "workers": workers,
                "errors": errors,
            }
        if time.monotonic() > deadline:
            return {"at": None, "workers": workers, "sizes": sorted({w.size for w in held}), "errors": errors}
        time.sleep(0.005)


def worker() -> None:
    """The launcher's own host's worker (a real process `taiji run` starts): one simulated worker."""
    url = env.STORE_URL.get() or f"tcp://{env.STORE_HOST.get()}:{env.STORE_PORT.get()}"
    job = open_job(url, env.JOB_ID.get(), bytes.fromhex(env.SECRET.get()))
    workers = Workers(job, env.HEARTBEAT.get())
    workers.add(env.WORKER_ID.get())
    Heartbeat.on_this_host(
        env.WORKER_ID.get(), env.HEARTBEAT.get()
    )  # the real heartbeat: a file its launcher reads
    stop = threading.Event()
    if job.can_watch:
        threading.Thread(
            target=follow_configs, args=(job.another_connection(), workers, stop), daemon=True
        ).start()
    while not stop.wait(TICK_S):
        workers.step(time.monotonic())


def main(argv: list[str]) -> None:
    if argv == ["--worker"]:
        return worker()
    url, job_id, secret_file = argv
    secret = bytes.fromhex(Path(secret_file).read_text().strip())
    hosts: list[SimHost] = []
    for line in sys.stdin:
        order = json.loads(line)
        op = order["op"]
        if op == "hosts":
            for address in order["addresses"]:
                hosts.append(SimHost(url, job_id, secret, address, int(order["slots"])))
                hosts[-1].start()
            answer: dict = {"started": len(order["addresses"])}
        elif op == "kill":
            host = next(h for h in hosts if h.address == order["address"])
            answer = {"at": host.kill()}
        elif op == "until":
            answer = _until(hosts, int(order["size"]), float(order["timeout"]))
        elif op == "ops":
            answer = {"ops": next(OPS), "at": time.monotonic()}
        else:
            break
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
