"""``benchmarks/control_scale.py --live``: the control plane at up to 1,024 simulated workers
against real stores, with the real launcher.

For each store (the launcher's TCPStore, the etcd server ``--store etcd`` starts) and each size N:
``taiji run -np N --nproc-per-node 8 --nnodes H+1:...`` — the real launcher, its controller and
driver unchanged, with 8 real worker processes on its own host (each one simulated worker) — and
N-8 simulated workers on H = N/8-1 simulated hosts (taiji_harness/control_sim.py, a few processes
of threads speaking the real store protocol). Measured: the start (every worker on the first
config), then — once the launcher's own workers are ready (``settle``) — the store's operations per
second at steady state (etcd: counted by the server, ``/metrics``; TCP: counted by the simulated
clients — the launcher's own reads of the store it hosts are not counted, they show as its CPU),
the launcher's CPU (its process; etcd's server apart; the simulated hosts' processes beside it), a
host loss (its agent's death: tether closed, lease left) until every simulated worker holds the
config without it (and until the first simulated host's workers do: the launcher's detection,
decision and publish and one delivery; the rest is the config's spread to the other hosts), and a
grow of 128 workers (16 hosts joining) until every simulated worker holds the grown config.

The anchor: torchrun's c10d rendezvous (``DynamicRendezvousHandler`` on a ``C10dRendezvousBackend``
over a TCPStore on loopback) with one simulated agent per host, a thread each, driven the same
way: the rendezvous of the H hosts, the re-rendezvous of the H-1 left after a host loss (from the
moment they all start over; torchrun first waits for its workers' collectives to fail), and the
store's operations per second at steady state (each agent's keep-alive and its monitor loop
asking ``num_nodes_waiting`` every ``monitor_interval``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from taiji.cluster import auth
from taiji.cluster.store import connect_job
from taiji.launch.supervisor import die_with_parent

SLOTS = 8  # per simulated host
GROW_HOSTS = 16  # a grow of 128 workers
CLK_TCK = os.sysconf("SC_CLK_TCK")
LIVENESS_TIMEOUT_S = 120.0
LAUNCHER_HOST = "127.0.0.1"


# -- pure parts ------------------------------------------------------------------------------


def plan_hosts(workers: int, slots: int = SLOTS) -> list[int]:
    """The simulated hosts' slots for ``workers`` in all, ``slots`` of them on the launcher's own
    host (`taiji run --nproc-per-node` gives every host the same)."""
    if workers % slots or workers < 2 * slots:
        raise ValueError(f"{workers} workers: a multiple of {slots}, at least {2 * slots}")
    return [slots] * (workers // slots - 1)


def host_address(index: int) -> str:
    """A distinct loopback address per simulated host (nothing listens there: agents dial out)."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def etcd_ops(metrics: str) -> float:
    """Requests an etcd server has answered, from its Prometheus text: unary gRPC calls (the HTTP
    gateway's range, put, txn, lease calls) plus the messages its watch and keep-alive streams
    carried."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("grpc_server_handled_total{") and 'grpc_type="unary"' in line:
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("grpc_server_msg_sent_total{") and 'grpc_type="bidi_stream"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(stat: str) -> float:
    """A process's user + system CPU seconds from its ``/proc/PID/stat`` line."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def store_address(line: str) -> str | None:
    """The store URL in the launcher's first line (``..., store ADDRESS, command: ...``)."""
    found = re.search(r", store (\S+), command:", line)
    if found is None:
        return None
    address = found.group(1)
    return address if "://" in address else f"tcp://{address}"


# -- effects -----------------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


class SimProcess:
    """One process of simulated hosts (taiji_harness/control_sim.py), ordered over its stdin."""

    def __init__(self, url: str, job_id: str, secret_file: Path, environ: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "taiji_harness.control_sim", url, job_id, str(secret_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environ,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )

    def send(self, order: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"simulated hosts exited ({self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ask_all(procs: list[SimProcess], order: dict) -> list[dict]:
    for p in procs:
        p.send(order)
    return [p.answer() for p in procs]


@dataclass
class Launched:
    proc: subprocess.Popen
    log: Path
    url: str

    def said(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def launch(
    store: str,
    workers: int,
    hosts: int,
    job_id: str,
    secret_file: Path,
    environ: dict,
    log: Path,
    grow_hosts: int,
    slots: int,
) -> Launched:
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        str(workers),
        "--nproc-per-node",
        str(slots),
        "--nnodes",
        f"{hosts + 1}:{hosts + 1 + grow_hosts}",
        "--max-np",
        str(workers + slots * (grow_hosts - 1)),
        "--store",
        store,
        "--host",
        LAUNCHER_HOST,
        "--job-id",
        job_id,
        "--secret-file",
        str(secret_file),
        "--join-timeout",
        "600",
        # a host is lost by its tether here; on this shared 2-core machine a starved simulated agent
        # must not also be judged silent (the default is 5 s)
        "--liveness-timeout",
        str(LIVENESS_TIMEOUT_S),
        "--",
        sys.executable,
        "-m",
        "taiji_harness.control_sim",
        "--worker",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        url = next(filter(None, map(store_address, log.read_text(errors="replace").splitlines())), None)
        if url:
            return Launched(proc, log, url)
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError("the launcher did not start:\n" + log.read_text(errors="replace")[-3000:])


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start(procs: list[SimProcess], addresses: list[str], slots: int) -> None:
    """Simulated hosts at ``addresses``, dealt round-robin to the processes (the first to the first)."""
    for i, p in enumerate(procs):
        p.send({"op": "hosts", "slots": slots, "addresses": addresses[i :: len(procs)]})
    for p in procs:
        p.answer()


def until(procs: list[SimProcess], size: int, timeout: float, launched: Launched) -> tuple[float, float]:
    """When the first and the last simulated host's workers got a config of ``size`` workers."""
    answers = ask_all(procs, {"op": "until", "size": size, "timeout": timeout})
    errors = [e for a in answers for e in a.get("errors", [])]
    if errors or any(a["at"] is None for a in answers):
        raise RuntimeError(
            f"not every simulated worker reached a config of {size}: {answers}; the launcher "
            "said:\n" + launched.said()
        )
    return min(a["first"] for a in answers), max(a["at"] for a in answers)


def settle(url: str, job_id: str, secret: bytes, host: str, timeout: float) -> None:
    """Until the launcher's own workers on ``host`` have said they are ready. They are real processes,
    started with the first config, and each imports torch first: seconds of CPU apiece, which would
    otherwise be measured as the control plane's (the steady load, a host loss and a grow) on a
    machine of few cores."""
    _, job = connect_job(url, job_id, secret)
    mine = [w.id for w in job.read_config().workers if w.host == host]
    deadline = time.monotonic() + timeout
    while not all(job.is_ready(w) for w in mine):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the launcher's own workers {mine} were not ready within {timeout:g} s")
        time.sleep(0.1)


def steady(store: str, url: str, procs: list[SimProcess], launcher: int, window: float) -> dict:
    """Store operations per second, the launcher's CPU (etcd's server apart) and the simulated
    hosts' processes' over ``window`` seconds."""
    metrics = "http://" + url.split("://", 1)[1] + "/metrics"

    def ops() -> float:
        if store == "etcd":
            with urllib.request.urlopen(metrics, timeout=10) as answer:
                return etcd_ops(answer.read().decode())
        return float(sum(a["ops"] for a in ask_all(procs, {"op": "ops"})))

    servers = children(launcher) if store == "etcd" else []
    etcd_pid = next((p for p in servers if "etcd" in Path(f"/proc/{p}/cmdline").read_text()), None)

    def sims() -> float:
        return sum(process_cpu(p.proc.pid) for p in procs)

    t0, ops0, cpu0, sim0 = time.monotonic(), ops(), process_cpu(launcher), sims()
    etcd0 = process_cpu(etcd_pid) if etcd_pid else 0.0
    time.sleep(window)
    t1, ops1, cpu1, sim1 = time.monotonic(), ops(), process_cpu(launcher), sims()
    etcd1 = process_cpu(etcd_pid) if etcd_pid else 0.0
    span = t1 - t0
    return {
        "ops_per_s": (ops1 - ops0) / span,
        "launcher_cpu": (cpu1 - cpu0) / span,
        "etcd_cpu": (etcd1 - etcd0) / span if etcd_pid else None,
        "sim_cpu": (sim1 - sim0) / span,
    }


def measure(
    store: str,
    workers: int,
    window: float,
    sim_procs: int,
    grow_hosts: int = GROW_HOSTS,
    per_host: int = SLOTS,
) -> dict:
    """One run (see the module's doc); ``grow_hosts`` hosts join for the grow; ``per_host``
    workers on every host."""
    slots = plan_hosts(workers, per_host)
    base = Path(tempfile.mkdtemp(prefix="taiji-control-live-"))
    secret = auth.new_secret()
    secret_file = auth.write_secret_file(base / "secret", secret)
    environ = dict(os.environ, TAIJI_HOME=str(base / "home"))
    job_id = f"scale{os.getpid()}{store}{workers}"
    launched = launch(
        store, workers, len(slots), job_id, secret_file, environ, base / "launcher.log", grow_hosts, per_host
    )
    print(f"# {store}, {workers} workers: the launcher says {launched.log}", file=sys.stderr, flush=True)
    procs: list[SimProcess] = []
    figures: dict = {
        "store": store,
        "workers": workers,
        "hosts": len(slots),
        "grown": per_host * grow_hosts,
        "start_s": None,
        "loss_s": None,
        "loss_first_s": None,
        "grow_s": None,
        "ops_per_s": None,
        "launcher_cpu": None,
        "etcd_cpu": None,
        "sim_cpu": None,
    }
    try:
        procs = [
            SimProcess(launched.url, job_id, secret_file, environ) for _ in range(min(sim_procs, len(slots)))
        ]
        t0 = time.monotonic()
        start(procs, [host_address(j) for j in range(len(slots))], per_host)
        figures["start_s"] = until(procs, workers, 300, launched)[1] - t0
        settle(launched.url, job_id, secret, LAUNCHER_HOST, 300)
        time.sleep(1.0)
        figures.update(steady(store, launched.url, procs, launched.proc.pid, window))
        procs[0].send({"op": "kill", "address": host_address(0)})
        lost_at = procs[0].answer()["at"]
        if lost_at is None:
            raise RuntimeError(f"{host_address(0)} had no tether to drop yet")
        first, last = until(procs, workers - per_host, 120, launched)
        figures["loss_s"], figures["loss_first_s"] = last - lost_at, first - lost_at
        t0 = time.monotonic()
        start(procs, [host_address(len(slots) + j) for j in range(grow_hosts)], per_host)
        figures["grow_s"] = until(procs, workers - per_host + per_host * grow_hosts, 300, launched)[1] - t0
    except RuntimeError as exc:  # a phase that did not end: the figures measured before it are kept
        print(f"# {store}, {workers} workers: {exc}", file=sys.stderr, flush=True)
        figures["error"] = str(exc).splitlines()[0][:300]
    except BaseException:
        print(f"# the launcher said:\n{launched.said(40)}", file=sys.stderr, flush=True)
        raise
    finally:
        stop(launched.proc)  # it tells the simulated agents to stop: they say bye and end
        for p in procs:
            p.close()
        shutil.rmtree(base, ignore_errors=True)
    return figures


# -- the benchmark's rows ------------------------------------------------------------------------


def loss_case(store: str, workers: int) -> str:
    return f"host loss → every simulated worker on the new config, {store}, {workers} workers (s)"


def ops_case(store: str, workers: int) -> str:
    return f"store ops/s at steady state, {store}, {workers} workers"


def rows(results: list[dict], anchors: dict[int, dict], contract_row) -> list[dict]:
    """The contract's rows: per store and size, the host loss and the steady store load against
    torchrun's re-rendezvous and its steady load for the same nodes; the grow and the launcher's
    CPU have no anchor (torchrun restarts every worker for either)."""
    out = []
    for r in results:
        store, n, anchor = r["store"], r["workers"], anchors.get(r["workers"], {})
        out += [
            contract_row(
                loss_case(store, n),
                _rounded(r["loss_s"]),
                _rounded(anchor.get("loss_s")),
                higher_is_better=False,
                hosts=r["hosts"],
            ),
            contract_row(
                ops_case(store, n),
                _rounded(r["ops_per_s"], 0),
                _rounded(anchor.get("ops_per_s"), 0),
                higher_is_better=False,
                hosts=r["hosts"],
            ),
            contract_row(
                f"grow of {r['grown']} workers → every simulated worker on the new config, {store}, "
                f"{n} workers (s)",
                _rounded(r["grow_s"]),
                None,
                higher_is_better=False,
            ),
            contract_row(
                f"launcher CPU at steady state, {store}, {n} workers (cores)",
                _rounded(r["launcher_cpu"]),
                None,
                higher_is_better=False,
            ),
        ]
    return out


def summary(r: dict) -> str:
    """One run's figures in a line (— where a phase did not end)."""

    def f(key: str, fmt: str) -> str:
        return "—" if r.get(key) is None else format(r[key], fmt)

    return (
        f"{r['hosts']} simulated hosts: start {f('start_s', '.2f')} s, steady {f('ops_per_s', '.0f')} ops/s, "
        f"launcher CPU {f('launcher_cpu', '.2f')} cores (etcd {f('etcd_cpu', '.2f')}, simulated hosts "
        f"{f('sim_cpu', '.2f')}), host loss {f('loss_s', '.3f')} s "
        f"(the first host {f('loss_first_s', '.3f')} s), "
        f"grow of {r['grown']} {f('grow_s', '.2f')} s" + (f"; {r['error']}" if r.get("error") else "")
    )


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def growth(results: list[dict], key: str) -> dict[str, float]:
    """Per store, how ``key`` grew from the smallest size to the largest (x, and workers x)."""
    out = {}
    for store in sorted({r["store"] for r in results}):
        mine = sorted((r for r in results if r["store"] == store), key=lambda r: r["workers"])
        mine = [r for r in mine if r[key] is not None]
        if len(mine) > 1 and mine[0][key]:
            out[store] = round(mine[-1][key] / mine[0][key], 2)
    return out
