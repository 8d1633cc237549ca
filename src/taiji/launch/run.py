"""`taiji run`: host the job store, start and supervise the workers (the launcher's process)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .. import env
from ..cluster import auth
from ..cluster import controller as ctl
from ..cluster.listener import store_listener
from .metrics_http import JobExporter, MetricsConfig, MetricsServer
from .options import DriverConfig, RunConfig, heartbeat_interval
from .supervisor import Supervisor
from .worker_env import StartedAhead, WorkerSettings, local_start

if TYPE_CHECKING:
    from .driver import Driver


def worker_settings(cfg: RunConfig) -> WorkerSettings:
    """What every worker of the job gets, on any host (the store's address is the driver's)."""
    return WorkerSettings(
        job_id=cfg.job_id,
        store_host=cfg.host,
        store_port=cfg.port,
        command=cfg.command,
        interpreter=sys.executable,
        timeout=cfg.timeout,
        heartbeat=heartbeat_interval(cfg.liveness_timeout),
        # peers wait for a busy member as long as the launcher lets it be busy
        recovery_timeout=max(env.RECOVERY_TIMEOUT.default, cfg.busy_timeout + cfg.timeout),
        min_np=cfg.min_np or 1,
        max_np=cfg.max_np or cfg.nproc,
        run_dir=str(Path(cfg.run_dir).resolve()) if cfg.run_dir else "",
        debug_collectives=cfg.debug_collectives,
        topology=cfg.topology,
        cuda_backend=cfg.cuda_backend,
        checkpoint_dir=cfg.checkpoint.directory,
        checkpoint_every=cfg.checkpoint.every,
        resume=cfg.checkpoint.resume,
    )


def start_ahead(cfg: DriverConfig, settings: WorkerSettings, output=None) -> StartedAhead | None:
    """Start the first workers of a job whose TCPStore is hosted here before this process imports
    torch to serve it: they import theirs meanwhile (each takes seconds), connect to the store's
    socket, bound already, and wait for the first config. None where the first workers are not
    known yet (an etcd store: its server starts first; --nnodes: the hosts join first)."""
    if cfg.store != "tcp" or cfg.min_hosts > 1:
        return None
    listener = store_listener(cfg.host, cfg.port)
    secret = cfg.secret or auth.new_secret()
    settings = replace(settings, store_host=cfg.host, store_port=listener.getsockname()[1], store_url="")
    sup, state = Supervisor(output=output, prefix=cfg.output_prefix), cfg.first_state()
    sup.install_signal_handlers()  # a Ctrl-C from now on stops the workers as it does once the driver serves
    try:
        here = [w for w in state.config.workers if w.host == cfg.host]
        for local_rank, worker in enumerate(here):  # the local ranks the driver's spawns will give them
            rank = state.config.rank_of(worker.id)
            command, environ = local_start(
                settings,
                secret,
                worker.id,
                rank,
                state.config.size,
                host=cfg.host,
                slots=state.hosts[0].slots,
                local_rank=local_rank,
            )
            sup.start_ahead(worker.id, rank, command, environ, local_rank)
    except BaseException:
        stop_ahead(StartedAhead(listener, secret, sup, state))
        raise
    return StartedAhead(listener, secret, sup, state)


def stop_ahead(ahead: StartedAhead) -> None:
    """The launcher failed before its driver ran: end the workers it started ahead."""
    ahead.sup.drop_ahead()
    ahead.sup.close()
    ahead.listener.close()


class HostProvider(Protocol):
    """Starts the job's agents on other hosts (launch/hosts/ray/nodes.py: Ray nodes) once the driver
    serves."""

    def start(self, driver: Driver) -> None: ...

    def close(self) -> None: ...


def run_job(
    cfg: RunConfig,
    output=None,
    metrics: MetricsConfig | None = None,
    announce: Callable[[str, bytes], None] | None = None,
    provider: HostProvider | None = None,
) -> int:
    """Host the store, start and supervise the workers; return the job's exit code. With
    ``metrics``, serve the job's Prometheus metrics there (its port checked before anything starts).
    ``announce(store_url, secret)``, once the store is up: hand them to other hosts (`--slurm`);
    ``provider`` brings the other hosts' agents (`--ray`)."""
    bounds = ctl.Bounds(
        min_np=cfg.min_np or 1,
        max_np=cfg.max_np or cfg.nproc,
        replace=cfg.replace,
        join_timeout=cfg.join_timeout,
        suspect_window=min(cfg.timeout, 5.0),
        max_failures=cfg.max_failures,
        liveness_timeout=cfg.liveness_timeout,
        busy_timeout=cfg.busy_timeout,
        stale_after=4 * heartbeat_interval(cfg.liveness_timeout),
        host_timeout=cfg.liveness_timeout,
        max_hosts=cfg.max_hosts or ctl.Bounds.max_hosts,
        grow_on_join=cfg.grow_on_join,
    )
    driver_cfg = DriverConfig(
        job_id=cfg.job_id,
        nproc=cfg.nproc,
        bounds=bounds,
        host=cfg.host,
        port=cfg.port,
        timeout=cfg.timeout,
        grace=cfg.grace,
        slots=cfg.nproc_per_node,
        store=cfg.store,
        min_hosts=cfg.min_hosts,
        secret=cfg.secret,
        checkpoint=cfg.checkpoint,
        hosts_from=cfg.hosts_from,
    )
    drivers: list[Driver] = []  # the control server hands out the snapshot `taiji status` shows

    def snapshot() -> dict:
        control = drivers[0].control if drivers else None
        return control.snapshot() if control is not None else {"job": cfg.job_id}

    exporter = JobExporter(snapshot)
    server = MetricsServer(metrics, exporter.families) if metrics is not None else None
    try:
        settings = worker_settings(cfg)
        ahead = start_ahead(driver_cfg, settings, output)
        try:
            from .driver import Driver  # imports torch: the workers started ahead boot meanwhile

            driver = Driver.launch(driver_cfg, settings, output=output, ahead=ahead)
        except BaseException:
            if ahead is not None:
                stop_ahead(ahead)
            raise
        drivers.append(driver)
        if announce is not None:
            address = driver.store_address
            try:
                announce(address if "://" in address else f"tcp://{address}", driver.secret)
            except BaseException:
                if driver.etcd is not None:
                    driver.etcd.stop()
                raise
        if server is not None:
            driver.on_actions = exporter.on_actions
            driver.say(f"Prometheus metrics on http://{metrics.host}:{server.port}/metrics")
        if provider is not None:
            provider.start(driver)
        return driver.run()
    finally:
        if provider is not None:
            provider.close()
        if server is not None:
            server.close()
