"""Several emulated hosts on one machine: network namespaces behind a bridge
(docs/reference/many-hosts-notes.md#emulated-hosts).

Each host is a namespace ``<prefix>-hN`` with ``eth0`` = 10.77.S.N/24 on a bridge that lives in
a namespace of its own; no namespace has a default route, so nothing started in one can reach
beyond the bridge. While the hosts exist, the root namespace has a blackhole route for the
subnet: a stray connection from outside a namespace fails here instead of leaving the machine.
Every process is started through ``ip netns exec`` in its own session; ``close()`` kills what
is left in the namespaces (all of it started by this object), deletes them and the route.

Used by tests/multihost and benchmarks/multihost.py. Needs root and ``ip``; ``unavailable()``
says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"tjprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _kill_in(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns``, by pid."""
    for pid in [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def etcd_command(address: str, data_dir: str) -> list[str]:
    """A single-member etcd server for clients at ``address:2379`` (a store that is not the
    launcher's: it outlives the launcher's host). Needs the ``etcd`` binary (etcd-server)."""
    return [
        "etcd",
        "--name",
        "e",
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        f"http://{address}:2379",
        "--advertise-client-urls",
        f"http://{address}:2379",
        "--listen-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:2380",
        "--initial-cluster",
        "e=http://127.0.0.1:2380",
        "--heartbeat-interval",
        "10",
        "--election-timeout",
        "100",
        "--log-level",
        "warn",
    ]


class EmulatedHosts:
    """``n`` hosts; ``address(i)``, ``popen(i, argv)``, ``run(i, argv)``, faults, ``close()``."""

    def __init__(self, n: int, prefix: str | None = None):
        self.n = n
        tag = os.getpid() % 100000
        self.prefix = prefix or f"tj{tag}"
        self.subnet = f"10.77.{tag % 250 + 1}"
        self.switch = f"{self.prefix}-sw"
        self.procs: list[subprocess.Popen] = []
        self._route = False
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def _build(self) -> None:
        if _ip("route", "add", "blackhole", f"{self.subnet}.0/24", check=False).returncode == 0:
            self._route = True
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.n):
            ns, outer, inner = self.ns(i), f"{self.prefix}h{i}p", f"{self.prefix}h{i}e"
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("link", "set", outer, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", outer, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def popen(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``i`` in its own session (so its whole tree can be signalled)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(
        self, i: int, argv: Sequence[str], timeout: float = 60.0, **kwargs
    ) -> subprocess.CompletedProcess:
        proc = self.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(
                f"{argv} on host {i} did not finish within {timeout}s:\n{out}\n{err}"
            ) from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def pids(self, i: int) -> list[int]:
        found = _ip("netns", "pids", self.ns(i), check=False).stdout.split()
        return [int(p) for p in found]

    def kill(self, i: int, timeout: float = 30.0) -> None:
        """SIGKILL every process on host ``i``, by pid, until none is left (the host is lost)."""
        deadline = time.monotonic() + timeout
        while self.pids(i):
            if time.monotonic() > deadline:
                raise AssertionError(f"processes left on host {i} after {timeout:g}s: {self.pids(i)}")
            _kill_in(self.ns(i))
            time.sleep(0.05)

    def link_down(self, i: int) -> None:
        _ip("-n", self.ns(i), "link", "set", "eth0", "down")

    def shape(self, i: int, rate: str = "400mbit") -> None:
        """A slower link for host ``i`` (token bucket; netem is not available here)."""
        subprocess.run(
            [
                "tc",
                "-n",
                self.ns(i),
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "256kb",
                "latency",
                "50ms",
            ],
            check=True,
            capture_output=True,
            timeout=20,
        )

    def close(self) -> None:
        """Kill whatever still runs in the hosts, delete them and the route. Idempotent."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in self._made:
            _kill_in(ns)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        for ns in reversed(self._made):
            while any(_ip("netns", "pids", ns, check=False).stdout.split()) and time.monotonic() < deadline:
                time.sleep(0.05)
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        if self._route:
            _ip("route", "del", "blackhole", f"{self.subnet}.0/24", check=False)
            self._route = False

    def __enter__(self) -> EmulatedHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
