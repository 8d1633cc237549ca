"""`taiji run --ray [ADDRESS]`: the job's other hosts are the nodes of a Ray cluster.

The launcher stays the job's controller (and runs its own ``--nproc-per-node`` workers); on every
other Ray node where the job has room to grow, one actor per (job, node) runs the unchanged agent
(`taiji join`, launch/hosts/ray/agent.py) with that node's address. Each actor reserves its node's
slots in Ray resources (``--ray-cpus-per-worker``/``--ray-gpus-per-worker`` x slots) and is pinned
to its node; a node added to the cluster later gets an actor too (the job grows onto it), and an
actor that cannot be placed yet waits for Ray (its autoscaler) instead of failing. A node's loss
ends its actor, its agent and its workers together: the agent's tether to the controller closes
and the controller drops the host at once. The job's secret reaches each actor as a method
argument over Ray's own channel, and the agent reads it on stdin: never argv, never a file.
With the store on an etcd cluster (it outlives this host), the actors are detached and end
themselves once their agent exits: they outlive this process, so when the launcher's node dies an
agent on another node takes the job over (launch/takeover.py), as with `taiji join` hosts.

Ray is imported only here, and only when ``--ray`` is given (``pip install 'taiji[ray]'``).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any

from .... import env
from ....errors import ConfigError
from ...options import RunConfig
from ...worker_env import forwarded_environment

log = logging.getLogger(__name__)

SUPPORTED = ((2, 40), (3, 0))  # Ray versions [low, high); tested with 2.60
POLL_SECONDS = 0.5  # how often the cluster's nodes are listed (a node added grows the job within this)
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class RayConfig:
    address: str  # HOST:PORT, "auto" (RAY_ADDRESS or the cluster on this machine) or "local"
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0


def add_run_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("Ray (pip install 'taiji[ray]')")
    group.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="the job's other hosts are a Ray cluster's nodes: one actor per node runs its workers "
        "(ADDRESS: HOST:PORT of the cluster; default: RAY_ADDRESS or the cluster running on "
        "this machine; `local`: start one here)",
    )
    group.add_argument(
        "--ray-cpus-per-worker",
        type=float,
        default=1.0,
        metavar="C",
        help="Ray CPUs each worker reserves on its node (default: %(default)s)",
    )
    group.add_argument(
        "--ray-gpus-per-worker",
        type=float,
        default=0.0,
        metavar="G",
        help="Ray GPUs each worker reserves on its node (default: %(default)s)",
    )


def config_of(args: argparse.Namespace) -> RayConfig | None:
    if args.ray is None:
        return None
    if args.ray_cpus_per_worker < 0 or args.ray_gpus_per_worker < 0:
        raise ConfigError("--ray-cpus-per-worker and --ray-gpus-per-worker must be >= 0")
    return RayConfig(
        address=args.ray, cpus_per_worker=args.ray_cpus_per_worker, gpus_per_worker=args.ray_gpus_per_worker
    )


def fill_defaults(args: argparse.Namespace) -> None:
    """`taiji run --ray`'s shape, into ``args`` before they are parsed: --nproc-per-node is required
    (the slots, and so the Ray resources, of every node); -np N beyond this node's slots (without
    --nnodes) waits for the nodes that hold them: --nnodes ceil(N/K):ceil(max(N, --max-np)/K)."""
    if args.ray is None:
        return
    per_node = args.nproc_per_node
    if per_node < 1:
        raise ConfigError(
            "--ray needs --nproc-per-node K: the workers each Ray node runs (this host's too), e.g. "
            "`taiji run --ray HOST:PORT --nproc-per-node 1 --max-np 8 python train.py` (1 worker "
            "here, and 1 on each other Ray node, up to 8)"
        )
    if args.nnodes is None and args.nproc is not None and args.nproc > per_node:
        first = math.ceil(args.nproc / per_node)
        most = max(first, math.ceil((args.max_np or 0) / per_node))
        args.nnodes = f"{first}:{most}"


# -- pure decisions -----------------------------------------------------------------------


def check_version(version: str) -> None:
    """ConfigError unless ``version`` is in the supported range."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        raise ConfigError(f"cannot read the installed Ray's version {version!r}") from None
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    if not (lo_major, lo_minor) <= (major, minor) < (hi_major, hi_minor):
        raise ConfigError(
            f"Ray {version} is installed; taiji supports Ray >= {lo_major}.{lo_minor}, "
            f"< {hi_major}.{hi_minor}: run `pip install 'taiji[ray]'` for a supported one"
        )


def node_demand(ray: RayConfig, slots: int) -> dict[str, float]:
    """The Ray resources one node's actor reserves for its ``slots`` workers."""
    demand = {"CPU": ray.cpus_per_worker * slots}
    if ray.gpus_per_worker:
        demand["GPU"] = ray.gpus_per_worker * slots
    return demand


def unfit_reason(nodes: list[dict], demand: dict[str, float]) -> str | None:
    """Why no live node can ever hold ``demand`` (None: one can): says what each node has."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in demand.items()) for n in alive):
        return None
    wanted = ", ".join(f"{k}={v:g}" for k, v in demand.items())
    have = (
        "; ".join(
            f"{n.get('NodeManagerAddress')}: "
            + ", ".join(f"{k}={n.get('Resources', {}).get(k, 0.0):g}" for k in demand)
            for n in alive
        )
        or "no live node"
    )
    return (
        f"no Ray node has the resources one host's workers need ({wanted}: --nproc-per-node x "
        f"--ray-cpus-per-worker/--ray-gpus-per-worker); the cluster's nodes have {have}"
    )


def hosts_wanted(cfg: RunConfig) -> int:
    """How many other hosts the job can use: up to --max-np's workers (and --nnodes MAX's hosts)."""
    wanted = max(math.ceil(cfg.max_np / cfg.nproc_per_node) - 1, cfg.min_hosts - 1)
    return min(wanted, cfg.max_hosts - 1) if cfg.max_hosts else wanted


def check_reachable(address: str) -> None:
    """A HOST:PORT that refuses or does not answer is refused here, before Ray waits a minute on it."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"--ray takes HOST:PORT (the cluster's head, e.g. 10.0.0.1:6379), `auto` or `local`, "
            f"got {address!r}"
        )
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}): is its head "
            "running (`ray start --head`), and is this the address it printed?"
        ) from None


# -- effects -------------------------------------------------------------------------------


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray, which is not installed: pip install 'taiji[ray]'") from None
    check_version(ray.__version__)
    return ray


def connect(ray_cfg: RayConfig) -> Any:
    """Connect this process to the cluster (a clear ConfigError where it cannot); the ray module."""
    ray = import_ray()
    if not env.RAY_DEDUP_LOGS.is_set():  # every host's agent and worker lines, as on any host (none folded)
        os.environ[env.RAY_DEDUP_LOGS.name] = "0"
    address = ray_cfg.address
    if address == "auto" and env.RAY_ADDRESS.get():
        address = env.RAY_ADDRESS.get()
    if address not in ("auto", "local"):
        check_reachable(address.removeprefix("ray://"))
    try:
        if address == "local":
            ray.init(
                include_dashboard=False,
                object_store_memory=200 * 1024 * 1024,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        else:
            ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
    except ConnectionError as exc:
        raise ConfigError(
            f"no Ray cluster at {address}: {str(exc).splitlines()[0]} (give --ray HOST:PORT, set "
            "RAY_ADDRESS, or --ray local to start one here)"
        ) from None
    shorten_ray_reports()
    return ray


def first_lines(lines: list[str]) -> list[str]:
    """Each of Ray's reports (one string, many lines) as its first line, saying how many were left out."""
    shortened = []
    for report in lines:
        first, _, rest = str(report).partition("\n")
        more = len(rest.rstrip("\n").splitlines())
        shortened.append(
            first + (f" [{more} more line(s) of Ray's report in the node's Ray logs]" if more else "")
        )
    return shortened


def shorten_ray_reports() -> None:
    """Ray prints the cluster's error reports to its drivers' terminals: a dead raylet's comes with
    ~25 lines of its state dump, ahead of the launcher's own one-line diagnosis (`host ... is lost`).
    Print the first line of each (the diagnosis; the dump stays in the node's Ray logs). Ray's
    error listener looks its printer up in ``ray._private.worker`` at each report: where a Ray
    version has no such printer, nothing changes."""
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "taiji_shortened", False):
        return

    def shortened(data: dict, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, dict) and data.get("pid") == "raylet" and isinstance(data.get("lines"), list):
            data = {**data, "lines": first_lines(data["lines"])}
        return printer(data, *args, **kwargs)

    shortened.taiji_shortened = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = shortened


class RayHosts:
    """Places one agent actor per Ray node for the job, while it has room to grow; ``close`` ends them."""

    def __init__(self, ray: Any, cfg: RunConfig, ray_cfg: RayConfig):
        self.ray, self.cfg, self.ray_cfg = ray, cfg, ray_cfg
        self.demand = node_demand(ray_cfg, cfg.nproc_per_node)
        self.wanted = hosts_wanted(cfg)
        self.gang_hosts = max(cfg.min_hosts - 1, 0)  # --nnodes MIN's other hosts: placed all or nothing
        self.gang: Any = None  # launch/hosts/ray/gang.py's Gang, made once the driver serves
        self.actors: dict[str, tuple[Any, Any, str]] = {}  # node id -> (actor, its run() ref, address)
        self.tried: set[str] = set()  # nodes whose agent ended: not placed on again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._say = lambda text: None

    def check_fits(self) -> None:
        reason = unfit_reason(self.ray.nodes(), self.demand)
        if reason:
            raise ConfigError(reason)

    def start(self, driver) -> None:
        """Begin placing agents once ``driver`` serves (its settings published, its tether listening)."""
        self._say = driver.say
        self._ask_autoscaler()
        if self.gang_hosts:
            from .gang import Gang

            pinned = any(
                f"node:{self.cfg.host}" in node.get("Resources", {})
                for node in self.ray.nodes()
                if node.get("Alive")
            )  # this host is a Ray node: no other bundle may land here
            self.gang = Gang(
                self.ray,
                f"taiji-{self.cfg.job_id}",
                self.cfg.host if pinned else None,
                self.demand,
                self.gang_hosts,
            )
            self._say(
                f"waiting for Ray to place the job's first {self.gang_hosts} other host(s) all at once "
                "(one placement group; an autoscaler adds nodes for it)"
            )
        self._thread = threading.Thread(
            target=self._loop, args=(driver,), name="taiji-ray-hosts", daemon=True
        )
        self._thread.start()

    def _agent_argv(self, store_address: str, address: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "join",
            f"{self.cfg.job_id}@{store_address}",
            "--secret-file",
            "-",
            "--nproc-per-node",
            str(self.cfg.nproc_per_node),
            "--host",
            address,
            "--grace",
            f"{self.cfg.grace:g}",
        ]

    def _ask_autoscaler(self) -> None:
        """Tell Ray's autoscaler (where the cluster has one) the job's whole shape: this host and
        every other one it can grow onto. Ray keeps one such request per cluster (the latest)."""
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=[dict(self.demand) for _ in range(self.wanted + 1)])
        except Exception as exc:  # no autoscaler to ask is not the job's failure
            log.warning("could not ask Ray's autoscaler for the job's nodes: %s", exc)

    def _place(self, driver, node: dict, bundle: int | None = None) -> None:
        """The job's agent actor on ``node``: in the gang's ``bundle``, or pinned to the node."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .agent import RayHostAgent

        node_id, address = node["NodeID"], node["NodeManagerAddress"]
        strategy = (
            self.gang.strategy(bundle)
            if bundle is not None
            else NodeAffinitySchedulingStrategy(node_id, soft=False)
        )
        actor_class = self.ray.remote(RayHostAgent)
        # where the store outlives this host, the agents must outlive this process (a Ray actor
        # dies with the process that made it, unless detached) to take the job over if it dies
        lifetime = "detached" if driver.survivable else None
        actor = actor_class.options(
            name=f"taiji-{self.cfg.job_id}-{node_id[:12]}",
            num_cpus=self.demand["CPU"],
            num_gpus=self.demand.get("GPU", 0),
            max_restarts=0,
            scheduling_strategy=strategy,
            lifetime=lifetime,
        ).remote()
        environ = {
            **forwarded_environment(dict(os.environ)),
            "PYTHONUNBUFFERED": "1",
        }  # as this host's workers
        ref = actor.run.remote(
            self._agent_argv(driver.store_address, address),
            driver.secret.hex(),
            environ,
            leave_when_done=driver.survivable,
        )
        self.actors[node_id] = (actor, ref, address)
        self._say(f"Ray node {address}: placing the job's agent there ({self.cfg.nproc_per_node} slot(s))")

    def _reap(self) -> None:
        refs = {ref: node_id for node_id, (_, ref, _) in self.actors.items()}
        done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in done:
            node_id = refs[ref]
            actor, _, address = self.actors.pop(node_id)
            self.tried.add(node_id)
            self.ray.kill(actor)  # its agent ended: give the node's resources back
            try:
                code = self.ray.get(ref)
                self._say(f"Ray node {address}: the job's agent exited with code {code}")
            except self.ray.exceptions.RayActorError as exc:
                self._say(f"Ray node {address}: the job's actor died ({str(exc).splitlines()[0]})")
            except self.ray.exceptions.RayError as exc:
                self._say(f"Ray node {address}: the job's actor failed: {exc}")

    def _usable(self, node: dict) -> bool:
        """A live node of another host that has no agent of the job and never had one."""
        node_id = node["NodeID"]
        return (
            bool(node.get("Alive"))
            and node_id not in self.actors
            and node_id not in self.tried
            and node["NodeManagerAddress"] != self.cfg.host
        )

    def _place_gang(self, driver, nodes: list[dict]) -> None:
        """An agent in each of the gang's bundles without one (a bundle Ray moved off a lost
        node gets a new one where it is now). Where the agents must outlive this process, the
        group only finds their nodes: a placement group ends with the process that made it, and
        the actors in it with it. Their actors are made pinned to those nodes (waiting for the
        bundles' resources), then the group is removed; the job grows as without a gang from then on."""
        by_id = {node["NodeID"]: node for node in nodes}
        for bundle, node_id in sorted(self.gang.nodes().items()):
            node = by_id.get(node_id)
            if node is not None and self._usable(node):
                self._place(driver, node, None if driver.survivable else bundle)
        if driver.survivable:
            self.gang.remove()
            self.gang = None

    def _loop(self, driver) -> None:
        while driver.control is None and not self._stop.wait(0.05):
            pass  # the driver publishes the job's settings before it serves: agents find the job then
        while not self._stop.is_set():
            try:
                if self.actors:
                    self._reap()
                nodes = self.ray.nodes()
                if self.gang is not None:
                    if not self.gang.placed():  # all of the first hosts, or none: nothing grows meanwhile
                        self._stop.wait(POLL_SECONDS)
                        continue
                    self._place_gang(driver, nodes)
                for node in nodes:
                    if len(self.actors) >= self.wanted:
                        break
                    if self._usable(node) and all(
                        node.get("Resources", {}).get(k, 0.0) >= v for k, v in self.demand.items()
                    ):
                        self._place(driver, node)
            except Exception as exc:  # Ray's own trouble: say it, keep the job (its hosts are watched anyway)
                log.warning("placing the job's agents on Ray nodes failed: %s", exc)
            self._stop.wait(POLL_SECONDS)

    def close(self) -> None:
        """Stop placing; end every actor still there (their agents and workers die with them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for actor, _, _ in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception as exc:
                log.warning("could not end a Ray actor: %s", exc)
        self.actors.clear()
        if self.gang is not None:
            self.gang.remove()
        self.ray.shutdown()


def prepare(cfg: RunConfig, ray_cfg: RayConfig) -> tuple[RunConfig, RayHosts]:
    """Connect, check the job against the cluster (ConfigError saying what is wrong) and fill in
    the launcher's address: the Ray node's address of this machine unless --host/--ifname says."""
    if cfg.nproc_per_node < 1:
        raise ConfigError("--ray needs --nproc-per-node K: the workers each Ray node runs (this host's too)")
    cfg = replace(cfg, hosts_from="ray")
    ray = connect(ray_cfg)
    try:
        if cfg.host == "127.0.0.1":
            cfg = replace(cfg, host=ray.util.get_node_ip_address())
        provider = RayHosts(ray, cfg, ray_cfg)
        provider.check_fits()
    except BaseException:
        ray.shutdown()
        raise
    return cfg, provider
