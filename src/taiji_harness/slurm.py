"""A real Slurm cluster on emulated hosts (taiji_harness/netns.py;
docs/reference/many-hosts-notes.md#slurm-nodes): a private ``munged`` (its own key and socket), ``slurmctld``
on host 0 and one ``slurmd`` per host, each node with its own name (``n0``, ``n1``, ...) and address. Node
names resolve inside the hosts through ``/etc/netns/<ns>/hosts`` (which ``ip netns exec`` mounts over
``/etc/hosts``).

Every daemon runs in the foreground as a child of this object, in its own session; ``close()``
stops them by pid (``EmulatedHosts.close`` then kills whatever the jobs left in the hosts) and
removes the configuration, so nothing is left on the machine, also after a failure.
``unavailable()`` says why a cluster cannot be made here (no Slurm, no munge, no root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .netns import EmulatedHosts

NEEDED = ("munged", "slurmctld", "slurmd", "srun", "scontrol", "scancel", "sinfo", "nsenter", "unshare")
SBIN = ("/usr/sbin", "/usr/bin")
CTLD_PORT, SLURMD_PORT = 6817, 6818  # each host is a network namespace of its own: no clash


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None
    )


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (None: it can)."""
    missing = [name for name in NEEDED if _which(name) is None]
    if missing:
        return (
            f"missing: {', '.join(missing)} (`apt-get install slurm-wlm munge`; `make test` installs them "
            "as root)"
        )
    return None


def _config(name: str, controller: str, hosts: EmulatedHosts, root: Path, munge_socket: Path) -> str:
    nodes = "\n".join(
        f"NodeName=n{i} NodeAddr={hosts.address(i)} CPUs=2 State=UNKNOWN" for i in range(hosts.n)
    )
    return f"""ClusterName={name}
SlurmctldHost={controller}({hosts.address(0)})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PlugStackConfig={root}/plugstack.conf
ReturnToService=2
MessageTimeout=10
KillWait=10
InactiveLimit=0
MinJobAge=300
{nodes}
PartitionName=all Nodes=n[0-{hosts.n - 1}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmCluster:
    """Slurm over ``hosts``: node ``nI`` is host I; ``srun``/``sbatch``/``scontrol`` run in a host."""

    def __init__(self, hosts: EmulatedHosts, root: Path):
        self.hosts, self.root = hosts, root
        self.daemons: list[subprocess.Popen] = []
        self._etc: list[Path] = []
        self.name = f"{hosts.prefix}".replace("-", "")
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _daemon(self, i: int | None, argv: Sequence[str], log: str) -> subprocess.Popen:
        out = open(self.root / log, "w")
        try:
            if i is None:
                proc = subprocess.Popen(
                    list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            else:  # not `ip netns exec`, which mounts a /sys without the cgroup file systems slurmd needs:
                # only the network namespace, and a mount namespace with the host's /etc/hosts
                hosts_file = Path("/etc/netns") / self.hosts.ns(i) / "hosts"
                proc = subprocess.Popen(
                    [
                        "nsenter",
                        f"--net=/run/netns/{self.hosts.ns(i)}",
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        f'mount --bind {hosts_file} /etc/hosts && exec "$@"',
                        "sh",
                        *argv,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self.env,
                )
        finally:
            out.close()
        self.daemons.append(proc)
        return proc

    def _start(self) -> None:
        root = self.root
        munge = root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = munge / "munge.sock"
        self._daemon(
            None,
            [
                _which("munged"),
                "-F",
                "-f",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            "munged.out",
        )
        self._wait(sock.exists, 20, "munged's socket")
        for sub in ["state", *(f"spool/n{i}" for i in range(self.hosts.n))]:
            (root / sub).mkdir(parents=True)
        (root / "plugstack.conf").write_text("")
        (root / "slurm.conf").write_text(_config(self.name, socket.gethostname(), self.hosts, root, sock))
        lines = "".join(f"{self.hosts.address(i)} n{i}\n" for i in range(self.hosts.n))
        for i in range(self.hosts.n):  # node names resolve inside every host
            etc = Path("/etc/netns") / self.hosts.ns(i)
            etc.mkdir(parents=True, exist_ok=True)
            self._etc.append(etc)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{lines}")
        conf = str(root / "slurm.conf")
        self._daemon(0, [_which("slurmctld"), "-D", "-i", "-f", conf], "slurmctld.out")
        for i in range(self.hosts.n):
            self._daemon(i, [_which("slurmd"), "-D", "-f", conf, "-N", f"n{i}"], f"slurmd-n{i}.out")
        self._wait(self._nodes_idle, 60, f"{self.hosts.n} Slurm nodes to be idle")

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            dead = [p.args for p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Slurm cluster did not come up ({what}; exited: {dead}):\n{self.logs()}"
                )
            time.sleep(0.1)

    def _nodes_idle(self) -> bool:
        out = self.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return len(states) == self.hosts.n and all(s == "idle" for s in states.values())

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def popen(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """A Slurm client (srun, sbatch, ...) on host ``i``; its process is the test's to reap."""
        kwargs.setdefault("env", self.env)
        return self.hosts.popen(i, list(argv), **kwargs)

    def run(self, i: int, argv: Sequence[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("env", self.env)
        return self.hosts.run(i, list(argv), timeout=timeout, **kwargs)

    def job_state(self, job: str) -> str:
        out = self.run(0, ["scontrol", "-o", "show", "job", job]).stdout
        return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")

    def close(self) -> None:
        """Stop the daemons (by pid), remove the per-host files. Idempotent."""
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.daemons):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.daemons.clear()
        for etc in self._etc:
            shutil.rmtree(etc, ignore_errors=True)
        if self._etc:
            try:
                self._etc[0].parent.rmdir()  # /etc/netns, unless another test's hosts use it now
            except OSError:
                pass
        self._etc.clear()
