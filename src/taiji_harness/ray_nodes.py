"""Ray nodes on emulated hosts (taiji_harness/netns.py; docs/reference/many-hosts-notes.md#ray-nodes): one
``ray start --block`` per network namespace with that host's address, no dashboard and a small
object store, started as a child of ours and ended by its pid (never `ray stop`, which ends every
Ray process on the machine). Used by tests/multihost/test_ray.py and benchmarks/ray_engine.py.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from . import netns

RAY = Path(sys.executable).with_name("ray")
PORT = 6391
STARTED = "Ray runtime started."  # what `ray start` prints once its node is in the cluster
OBJECT_STORE_BYTES = 100_000_000  # ≤ 200 MB: three nodes fit this machine beside the workers


def ray_installed() -> bool:
    return RAY.exists()


def unavailable() -> str | None:
    """Why Ray nodes on emulated hosts cannot run here (a test's skip reason); None: they can."""
    why = netns.unavailable()
    if why:
        return f"no emulated hosts here: {why}"
    return None if ray_installed() else "Ray is not installed (pip install 'taiji[ray]')"


AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def auth_env() -> dict[str, str]:
    """The environment of a Ray cluster with token authentication, a fresh token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@contextmanager
def token_auth() -> Iterator[None]:
    """Ray's token authentication on (a fresh token) for the nodes started meanwhile and for every
    process started from here (they inherit the environment: taiji's launchers and agents connect
    as Ray clients with it). Ray announced it as the default for every cluster from 2.61, so the
    tests run what users will get; a client without the token is refused."""
    saved = {name: os.environ.get(name) for name in AUTH_VARS}
    os.environ.update(auth_env())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def temp_dir(prefix: str) -> Iterator[str]:
    """A directory for the nodes' files, removed afterwards: short, as Ray's socket paths under it
    must fit 107 bytes."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_node(
    hosts,
    i: int,
    log_path: Path,
    temp_dir: str,
    *,
    head: int = 0,
    cpus: float = 1,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """A Ray node on host ``i`` (the cluster's head when ``i == head``) with ``cpus`` CPUs, its output
    in ``log_path`` and its files under ``temp_dir`` (short, and not /tmp/ray, where `ray.init("auto")`
    elsewhere on the machine would find this cluster)."""
    role = (
        ["--head", "--port", str(PORT), "--include-dashboard", "false"]
        if i == head
        else ["--address", f"{hosts.address(head)}:{PORT}"]
    )
    argv = [
        str(RAY),
        "start",
        *role,
        "--node-ip-address",
        hosts.address(i),
        "--num-cpus",
        f"{cpus:g}",
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        "--disable-usage-stats",
        "--temp-dir",
        temp_dir,
        "--block",
    ]
    environ = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    with open(log_path, "w") as log:
        return hosts.popen(i, argv, stdout=log, stderr=subprocess.STDOUT, env=environ)


def raylet_pid(hosts, i: int) -> int | None:
    """The pid of the raylet running on host ``i`` (None: none runs)."""
    for pid in hosts.pids(i):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return pid
        except OSError:
            continue  # exited meanwhile
    return None


def wait_raylet(hosts, i: int, node: subprocess.Popen, log_path: Path, timeout: float = 120.0) -> int:
    """Wait until host ``i``'s node has started (`ray start` said so: its raylet registered with
    the cluster) and return its raylet's pid; AssertionError if the node exits or the timeout
    passes first, with the end of its output."""
    deadline = time.monotonic() + timeout
    while True:
        if node.poll() is not None:
            raise AssertionError(f"Ray node {i} exited ({node.returncode}): {log_path.read_text()[-2000:]}")
        pid = raylet_pid(hosts, i)
        if pid is not None and STARTED in log_path.read_text(errors="replace"):
            return pid
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Ray node {i} not started within {timeout:g}s: {log_path.read_text()[-2000:]}"
            )
        time.sleep(0.05)


def start_and_wait(
    hosts, i: int, log_path: Path, temp: str, tries: int = 3, **kwargs
) -> tuple[subprocess.Popen, int]:
    """``start_node`` and ``wait_raylet``, again (up to ``tries`` times, each in a directory of its
    own) where `ray start` gives up: on a loaded machine a raylet may take longer to register than
    the 30 s `ray start` waits for it. The node's process and its raylet's pid."""
    for attempt in range(tries):
        path = log_path if attempt == 0 else log_path.with_suffix(f".{attempt}.log")
        node = start_node(hosts, i, path, f"{temp}/{i}.{attempt}", **kwargs)
        try:
            return node, wait_raylet(hosts, i, node, path)
        except AssertionError:
            if node.poll() is None:
                raise  # still starting after the timeout: not what a new try mends
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")
