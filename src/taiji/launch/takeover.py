"""An agent takes over a running job's controller when the launcher's host dies (etcd mode).

With the job store on an etcd cluster that outlives the launcher's host, nothing the job needs
dies with that host except the controller and the workers there. Every agent watches the
controller's beat; when it has been silent for ``host_timeout``, the agents hold an election (a
compare-and-set, exactly one wins), and the winner turns into the job's driver: it rebuilds the
controller's state from the store (the latest config, the hosts with members in it, the bounds),
keeps its own workers running, addresses the other agents, and drops the dead host's workers in
one version — the survivors, waiting on their failed collective, retry the step. torchrun's,
torchft's and KungFu's jobs die with the host that holds their store or controller.

The takeover is of the job's room (it builds a Driver); the agent (launch/hosts/agent.py) is handed
:func:`take_over` by `taiji join`'s entry point (launch/cli.py), so the hosts' room imports nothing
of the job's.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..cluster import controller as ctl
from ..cluster.store import JobStore
from .driver import ETCD_TICK_SECONDS, Driver, DriverConfig
from .hosts import agent_channel
from .options import JoinConfig
from .supervisor import Supervisor
from .worker_env import WorkerSettings


@dataclass(frozen=True)
class TakenOver:
    """A won election: the job's new driver, the dead controller's host, and what happened while
    nobody controlled the job (this host's workers that exited meanwhile), to feed it first."""

    driver: Driver
    lost_host: str
    missed: list[ctl.Event]

    def resume(self, reason: str) -> int:
        return self.driver.resume(self.lost_host, reason, self.missed)


def _next_index(ids: tuple[str, ...]) -> int:
    """Past every worker id the old controller may have handed out (its joiners included)."""
    numbers = [int(m.group(1)) for i in ids if (m := re.fullmatch(r"w(\d+)", i))]
    return max(numbers, default=0) + 1000


def take_over(
    cfg: JoinConfig, job: JobStore, settings: WorkerSettings, sup: Supervisor, secret: bytes, seen: bytes
) -> TakenOver | None:
    """If this agent wins the election against the controller of term ``seen``: the job's driver,
    ready to resume it (the agent's :class:`~taiji.launch.hosts.agent.TakeOver`)."""
    if not agent_channel.elect(job, cfg.host, seen):
        return None
    old = agent_channel.read_controller(job)
    old_host = str(old["host"])
    bounds = agent_channel.read_bounds(job)
    config = job.read_config()
    _, registrations = agent_channel.registrations_after(job, 0)
    latest = {str(r["address"]): r for r in registrations}  # an address's newest agent
    slots = {address: int(r["slots"]) for address, r in latest.items()}
    slots[old_host] = int(old.get("slots") or 0) or sum(1 for w in config.workers if w.host == old_host)
    # every registered host stays in the pool (those whose agents are gone fall silent and are
    # dropped); the dead controller's host goes last, to be dropped at once
    others = [a for a in latest if a not in (cfg.host, old_host)]
    host_list = (
        (ctl.Host(cfg.host, cfg.slots),)
        + tuple(ctl.Host(a, slots[a]) for a in others)
        + ((ctl.Host(old_host, slots[old_host]),) if old_host != cfg.host else ())
    )
    state = ctl.adopted_state(config, bounds, host_list, _next_index(config.ids), time.monotonic())
    driver_cfg = DriverConfig(
        job_id=cfg.job_id,
        nproc=config.size,
        bounds=bounds,
        host=cfg.host,
        timeout=cfg.timeout,
        grace=cfg.grace,
        slots=cfg.slots,
        store=cfg.store_url,
    )
    driver = Driver(
        driver_cfg,
        settings,
        sup,
        job,
        secret,
        state,
        store_address=cfg.store_url,
        tick=ETCD_TICK_SECONDS,
        term=agent_channel.owner(job),
    )
    for address in others:
        # read from the start: exits written while nobody controlled the job are not lost
        # (exits of workers no longer members are ignored by the controller)
        driver.remote.adopt(address, str(latest[address].get("session", "")), bounds.host_timeout)
    for rank, worker in enumerate(config.workers):
        if worker.host != cfg.host:
            driver.remote.place(worker.id, worker.host, rank)
    driver.skip_past_records()
    gone_here = [
        ctl.WorkerExited(w.worker_id, w.exit_code, job.is_training(w.worker_id))
        for w in sup.workers.values()
        if w.exit_code is not None and w.worker_id in config.ids
    ]
    return TakenOver(driver, old_host, gone_here)
