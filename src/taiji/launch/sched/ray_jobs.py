"""``taiji sched serve --ray [ADDRESS]``: the live scheduler's hosts are a Ray cluster's nodes.

The third kind of :class:`~taiji.launch.sched.hosts.JobHosts` (beside one host and agents over a
hosts file): no `taiji sched agent`, no hosts file. Every tick the daemon lists the cluster's nodes
(``ray.nodes()``) and :mod:`~taiji.launch.sched.ray_pool` turns them into the scheduler's hosts: a
node added joins the pool, a node removed leaves it, before the next round. Every process of a
job runs in a Ray actor pinned to its node (``NodeAffinitySchedulingStrategy``, hard):

- its launcher (`taiji run --nproc-per-node SLOTS --no-grow-on-join ...`, the same arguments as on
  any host) in :class:`~taiji.launch.sched.ray_actor.RaySchedLauncher` on the job's home node;
- on each other node a placed resize names, before the resize is sent, the job's per-node agent
  actor of `taiji run --ray` (launch/hosts/ray/agent.py: `taiji join`, dying with its node's raylet,
  so a node's loss closes the tether and the launcher drops the host at once).

The actors take no Ray resources (the scheduler counts slots: ``--slots`` per node, which a node
must hold in ``--ray-cpus-per-worker``/``--ray-gpus-per-worker`` to join the pool), are named and
detached in a namespace derived from the daemon's secret: a restarted daemon finds its jobs'
actors by name and re-adopts them. Each job's secret is derived from the daemon's and reaches
its actors as a method argument (never argv, never a file). Ray carries only this control
(start, signal, status, resize); the workers' traffic is taiji's own (store, gloo/NCCL).
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import env
from ...errors import ConfigError, StoreError
from ..hosts.ray.nodes import RayConfig, connect, node_demand, unfit_reason
from .hosts import JOIN_WINDOW_S, TAIJI, job_secret, launcher_id
from .ray_pool import Pool, pool_slots, seat_changes, seat_name, seat_nodes

log = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 2.0  # the launchers' reports the daemon waits for each tick
SEATS_FILE = "ray-seats.json"


@dataclass(frozen=True)
class RayPoolConfig:
    ray: RayConfig
    slots: int  # worker slots each node gives the pool
    max_hosts: int  # the pool's seats: how many nodes it can hold


class RayJobHosts:
    """Jobs on a Ray cluster's nodes (see the module's doc); ``ray`` is the connected module."""

    def __init__(self, ray: Any, cfg: RayPoolConfig, directory: Path, secret: Callable[[], bytes]):
        self.ray, self.cfg, self.dir, self._secret = ray, cfg, directory, secret
        self.per_worker = node_demand(cfg.ray, 1)
        self.seats = self._load_seats()
        self.pool = Pool(self.seats, {})
        self.up: list[bool | None] = [None] * cfg.max_hosts
        self.launchers: dict[str, Any] = {}  # job -> its launcher's actor
        self.runs: dict[str, Any] = {}  # job -> its launcher's run() (this daemon's launches)
        self.homes: dict[str, int] = {}  # job -> its launcher's seat
        self.reports: dict[str, dict[str, Any]] = {}  # job -> the launcher actor's last report
        self.lost: set[str] = set()  # jobs whose launcher's actor died (its node left)
        self.joins: dict[str, dict[int, tuple[Any, Any, float]]] = {}  # job -> seat -> (actor, run(), when)
        self.pending: dict[str, tuple[int, tuple[int, ...]]] = {}  # resizes waiting for their joins
        self.errors: dict[str, str] = {}
        self.said: set[str] = set()
        self._namespace = ""
        self._classes: dict[type, Any] = {}

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(seat_name(self.seats, seat) for seat in range(len(self.seats)))

    @property
    def namespace(self) -> str:
        """This daemon's Ray namespace: the same for a daemon restarted on the same state directory."""
        if not self._namespace:
            self._namespace = "taiji-sched-" + hashlib.sha256(self._secret()).hexdigest()[:12]
        return self._namespace

    # -- the pool -------------------------------------------------------------------------------

    def _load_seats(self) -> tuple[str | None, ...]:
        try:
            saved = [a if a else None for a in json.loads((self.dir / SEATS_FILE).read_text())]
        except (OSError, ValueError, TypeError):
            saved = []
        return tuple(saved[: self.cfg.max_hosts]) + (None,) * (
            self.cfg.max_hosts - len(saved[: self.cfg.max_hosts])
        )

    def poll_hosts(self, now: float) -> list[tuple[int, bool]]:
        """Seats whose node came or went (every seat at the first call); the launchers' reports;
        resizes whose joins are in."""
        self.pool = seat_nodes(self.seats, self.ray.nodes(), self.per_worker, self.cfg.slots)
        for address in self.pool.too_small:
            self._say_once(
                f"small:{address}",
                f"Ray node {address} cannot hold --slots {self.cfg.slots} worker(s) "
                f"({self.per_worker} each): it is not in the pool",
            )
        for address in self.pool.unseated:
            self._say_once(
                f"seat:{address}",
                f"Ray node {address} is not in the pool: its {self.cfg.max_hosts} "
                "host(s) are taken (restart the daemon with a larger --max-hosts)",
            )
        if self.pool.seats != self.seats:
            self.seats = self.pool.seats
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / SEATS_FILE).write_text(json.dumps([a or "" for a in self.seats]))
        changes = seat_changes(self.up, self.pool)
        for seat, up in changes:
            if up or self.up[seat] is not None:
                log.info(
                    "host %s is %s",
                    seat_name(self.seats, seat),
                    "up (a live Ray node)" if up else "down (its Ray node left the cluster)",
                )
            self.up[seat] = up
        self._refresh_reports()
        for job_id, (size, placement) in list(self.pending.items()):
            self._send_resize(job_id, size, placement)
        return changes

    def _say_once(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            log.warning("%s", text)

    def _refresh_reports(self, jobs: list[str] | None = None) -> None:
        asked = {
            job: self.launchers[job].report.remote(job)
            for job in (jobs or list(self.launchers))
            if job not in self.lost
        }
        if not asked:
            return
        ready, _ = self.ray.wait(list(asked.values()), num_returns=len(asked), timeout=REPORT_TIMEOUT_S)
        done = set(ready)
        for job, ref in asked.items():
            if ref not in done:
                continue  # busy: read again next tick
            try:
                self.reports[job] = dict(self.ray.get(ref))
            except self.ray.exceptions.RayActorError as exc:
                self.lost.add(job)
                log.warning("job %s: its launcher's Ray actor died (%s)", job, str(exc).splitlines()[0])
            except self.ray.exceptions.RayError as exc:
                log.warning("job %s: its launcher's report failed: %s", job, exc)
        for job, ref in list(
            self.runs.items()
        ):  # a launcher that could not even start (say, its cwd is gone)
            if not self.reports.get(job, {}).get("started") and self.ray.wait([ref], timeout=0)[0]:
                try:
                    self.ray.get(ref)
                except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnschedulableError):
                    # (unschedulable: its node left before Ray placed it there, as when a job is
                    # resumed in the tick its lost home node is still listed: it is lost again)
                    self.lost.add(job)
                except self.ray.exceptions.RayError as exc:
                    self.errors[job] = f"its launcher could not start: {str(exc).splitlines()[-1]}"
                    self.reports[job] = {"code": 127, "started": True}

    # -- actors ---------------------------------------------------------------------------------

    def _actor(self, cls: type, name: str, seat: int) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = self.pool.live.get(seat)
        if node is None:
            raise OSError(f"host {seat_name(self.seats, seat) or seat} has no live Ray node")
        if cls not in self._classes:
            self._classes[cls] = self.ray.remote(cls)
        return (
            self._classes[cls]
            .options(
                name=name,
                namespace=self.namespace,
                lifetime="detached",
                num_cpus=0,
                max_restarts=0,
                max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            .remote()
        )

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception as exc:  # gone already, or Ray's trouble: nothing of the job's left to stop there
            log.debug("could not end a Ray actor: %s", exc)

    def _environ(self) -> dict[str, str]:
        return env.for_children({"PYTHONUNBUFFERED": "1"})

    # -- the daemon's side ----------------------------------------------------------------------

    def launch(self, job_id: str, host: int, run_args: list[str], cwd: str, log_path: Path) -> None:
        from .ray_actor import RaySchedLauncher

        address = seat_name(self.seats, host)
        argv = TAIJI + [
            "run",
            "--host",
            address,
            "--secret-file",
            "-",
            "--nproc-per-node",
            str(self.cfg.slots),
            "--no-grow-on-join",
            *run_args,
        ]
        actor = self._actor(RaySchedLauncher, f"{job_id}.launcher.{uuid.uuid4().hex[:8]}", host)
        self.runs[job_id] = actor.run.remote(
            argv, job_secret(self._secret(), job_id).hex(), self._environ(), cwd, str(log_path)
        )
        self.launchers[job_id], self.homes[job_id], self.joins[job_id] = actor, host, {}
        self.reports.pop(job_id, None)
        self.lost.discard(job_id)

    def status(self, job_id: str) -> dict[str, Any] | None:
        return None if job_id in self.lost else self.reports.get(job_id, {}).get("status")

    def resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None:
        if job_id not in self.launchers or job_id in self.lost:
            raise StoreError(f"job {job_id} has no launcher this daemon knows of")
        self._send_resize(job_id, size, placement)

    def _send_resize(self, job_id: str, size: int, placement: tuple[int, ...]) -> None:
        """Joins first: the resize goes to the launcher once the job lists every host it names."""
        launcher = self.launchers.get(job_id)
        if launcher is None or job_id in self.lost:
            self.pending.pop(job_id, None)
            return
        status = self.status(job_id) or {}
        listed = {str(h[0]) for h in status.get("hosts", [])}
        missing = [h for h, n in enumerate(placement) if n and self.seats[h] not in listed]
        if missing:
            self.pending[job_id] = (size, placement)
            store = self.reports.get(job_id, {}).get("store")
            for seat in missing:
                if store and seat in self.pool.live and not self._joining(job_id, seat):
                    self._join(job_id, seat, store)
            return
        self.pending.pop(job_id, None)
        wanted = {self.seats[h]: n for h, n in enumerate(placement) if n or self.seats[h] in listed}
        launcher.control.remote(
            job_id, {"op": "resize", "size": size, "placement": wanted, "source": "taiji sched"}
        )

    def _joining(self, job_id: str, seat: int) -> bool:
        """The job's agent actor on ``seat`` is starting or runs (one that ended is ended for good)."""
        actor, ref, when = self.joins.get(job_id, {}).get(seat, (None, None, 0.0))
        if actor is None:
            return False
        if time.monotonic() - when < JOIN_WINDOW_S or self._runs(actor, ref):
            return True
        self._kill(actor)
        del self.joins[job_id][seat]
        return False

    def _runs(self, actor: Any, ref: Any) -> bool:
        """Whether an agent actor's run() goes on: its ref not done, or (``ref`` None: a previous
        daemon's actor) its agent has no exit code yet."""
        if ref is not None:
            return not self.ray.wait([ref], timeout=0)[0]
        try:
            return self.ray.get(actor.exit_code.remote(), timeout=REPORT_TIMEOUT_S) is None
        except self.ray.exceptions.GetTimeoutError:
            return True
        except self.ray.exceptions.RayError:
            return False

    def _join(self, job_id: str, seat: int, store: str) -> None:
        """The job's agent on ``seat``'s node: launch/hosts/ray/agent.py's actor running `taiji join`."""
        from ..hosts.ray.agent import RayHostAgent

        address = seat_name(self.seats, seat)
        argv = TAIJI + [
            "join",
            f"{launcher_id(job_id)}@{store}",
            "--secret-file",
            "-",
            "--nproc-per-node",
            str(self.cfg.slots),
            "--host",
            address,
        ]
        try:
            actor = self._actor(RayHostAgent, f"{job_id}.join.{seat}.{uuid.uuid4().hex[:8]}", seat)
        except OSError as exc:
            log.warning("job %s: cannot join host %s: %s", job_id, address, exc)
            return
        ref = actor.run.remote(
            argv,
            job_secret(self._secret(), job_id).hex(),
            self._environ(),
            "",
            str(self.dir / "jobs" / job_id / f"join-{address}.log"),
        )
        self.joins.setdefault(job_id, {})[seat] = (actor, ref, time.monotonic())
        log.info("job %s: its agent goes to Ray node %s", job_id, address)

    def outcome(self, job_id: str) -> int | None:
        """The launcher's exit code; None while it runs; a lost node's code where its actor died."""
        if job_id in self.lost:
            return 128 + signal.SIGKILL  # its node is gone: so are the job's launcher and store
        return self.reports.get(job_id, {}).get("code")

    def home_lost(self, job_id: str) -> bool:
        """Its launcher's node left (the launcher died with its actor: no second copy can train)."""
        return job_id in self.lost

    def running(self, job_id: str) -> bool:
        return job_id in self.launchers and job_id not in self.lost and self.outcome(job_id) is None

    def signal(self, job_id: str, sig: int) -> bool:
        """Signal the job's launcher (it stops its workers on every node; its agents end with the job)."""
        self.pending.pop(job_id, None)
        if job_id not in self.launchers or job_id in self.lost:
            return False
        self.launchers[job_id].signal.remote(int(sig))
        return True

    def forget(self, job_id: str) -> None:
        """The job ended (or was suspended): end its actors, and with them anything of it left."""
        launcher = self.launchers.pop(job_id, None)
        if launcher is not None:
            self._kill(launcher)
        for actor, _, _ in self.joins.pop(job_id, {}).values():
            self._kill(actor)
        for table in (self.runs, self.homes, self.reports, self.pending, self.errors):
            table.pop(job_id, None)
        self.lost.discard(job_id)

    def adopt(self, job_id: str, host: int) -> None:
        """A job a previous daemon started: its actors, found by name in this daemon's namespace."""
        from ray.util import list_named_actors

        names = [
            a["name"] for a in list_named_actors(all_namespaces=True) if a.get("namespace") == self.namespace
        ]
        for name in names:
            job, _, rest = name.partition(".")
            if job != job_id:
                continue
            try:
                actor = self.ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                continue  # ended meanwhile
            role, _, where = rest.partition(".")
            if role == "launcher":
                self.launchers[job_id], self.homes[job_id] = actor, host
            elif role == "join":
                self.joins.setdefault(job_id, {})[int(where.partition(".")[0])] = (actor, None, 0.0)
        if job_id in self.launchers:
            self._refresh_reports([job_id])

    def note(self, job_id: str) -> str:
        return self.errors.get(job_id, "")


def open_pool(
    ray_cfg: RayConfig, slots: int | None, max_hosts: int, directory: Path, secret: Callable[[], bytes]
) -> RayJobHosts:
    """Connect to the cluster (a clear ConfigError where Ray is missing, out of range or
    unreachable) and make its pool: ``slots`` per node (None: what the smallest node holds)."""
    if max_hosts < 1 or (slots is not None and slots < 1):
        raise ConfigError("--max-hosts and --slots must be at least 1")
    ray = connect(ray_cfg)
    try:
        per_worker = node_demand(ray_cfg, 1)
        nodes = ray.nodes()
        reason = unfit_reason(nodes, per_worker)
        if reason:
            raise ConfigError(reason)
        cfg = RayPoolConfig(ray_cfg, slots or pool_slots(nodes, per_worker), max_hosts)
        log.info(
            "taiji sched: the hosts are the nodes of the Ray cluster at %s (%d slot(s) each, up to %d nodes)",
            ray_cfg.address,
            cfg.slots,
            max_hosts,
        )
        return RayJobHosts(ray, cfg, directory, secret)
    except BaseException:
        ray.shutdown()
        raise
