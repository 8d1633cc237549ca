"""`taiji run --store etcd`: a single-member etcd server for the job, started and stopped by the
launcher, its data on tmpfs (the job's state lives only as long as the job).

It listens for clients on the launcher's address only (``--host``) and for peers on loopback
(there are none); it dies with the launcher (parent-death signal), and ``stop()`` removes its
data. The binary comes from the Debian/Ubuntu package ``etcd-server`` (etcd 3.4 or newer).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import LaunchError, StoreError
from .supervisor import die_with_parent

START_TIMEOUT_S = 30.0
# bcrypt's lowest cost for the passwords of the job's users: they are derived from the 256-bit job
# secret (cluster/auth.py), so a slower hash adds no safety, while at etcd's default (10) each
# authentication costs the server ~0.1 s of CPU with its write lock held (etcd 3.4): workers
# starting together stalled every write — heartbeats, leases, publishes — for seconds
BCRYPT_COST = 4


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EtcdServer:
    def __init__(self, host: str, port: int = 0, binary: str | None = None):
        self.binary = binary or shutil.which("etcd")
        if self.binary is None:
            raise LaunchError(
                "`--store etcd` needs the etcd server binary, which is not on PATH: install it "
                "(Debian/Ubuntu: `apt-get install -y etcd-server`), or point --store at a running "
                "cluster: --store etcd://HOST:PORT"
            )
        self.host = host
        self.port = port or _free_port(host)
        self.url = f"etcd://{host}:{self.port}"
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.data_dir = Path(tempfile.mkdtemp(prefix="taiji-etcd-", dir=shm))
        self.log_path = self.data_dir.with_suffix(".log")
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> EtcdServer:
        from ..cluster.etcd import EtcdKV

        peer = f"http://127.0.0.1:{_free_port('127.0.0.1')}"
        client = f"http://{'[' + self.host + ']' if ':' in self.host else self.host}:{self.port}"
        argv = [
            self.binary,
            "--name",
            "taiji",
            "--data-dir",
            str(self.data_dir / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"taiji={peer}",
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "100",
            "--bcrypt-cost",
            str(BCRYPT_COST),
            "--log-level",
            "warn",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        kv = EtcdKV(self.url, timeout=2.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    kv.check(["taiji/"])
                    return self
                except StoreError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise LaunchError(
                            f"the job's etcd server did not start on {self.host}:{self.port} "
                            f"(exit {self.process.poll()}); its log:\n{self.log_tail()}"
                        ) from None
                    time.sleep(0.05)
        finally:
            kv.close()

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)
