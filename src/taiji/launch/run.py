"""`taiji run`: host the job store, start and supervise the workers (the launcher's process)."""
from __future__ import annotations

import os
from pathlib import Path

from .. import env
from ..cluster import controller as ctl
from ..cluster import spec
from .driver import Driver, DriverConfig
from .options import RunConfig, heartbeat_interval


def worker_env(cfg: RunConfig, worker: spec.WorkerSpec, rank: int, size: int, port: int,
               secret: str) -> dict[str, str]:
    environ = dict(os.environ)
    environ.update({
        env.JOB_ID.name: cfg.job_id,
        env.WORKER_ID.name: worker.id,
        env.STORE_HOST.name: cfg.host,
        env.STORE_PORT.name: str(port),
        env.SECRET.name: secret,
        env.LAUNCHER_PID.name: str(os.getpid()),
        env.TIMEOUT.name: str(cfg.timeout),
        env.HEARTBEAT.name: str(heartbeat_interval(cfg.liveness_timeout)),
        # peers wait for a busy member as long as the launcher lets it be busy
        env.RECOVERY_TIMEOUT.name: str(max(env.RECOVERY_TIMEOUT.default, cfg.busy_timeout + cfg.timeout)),
        env.MIN_NP.name: str(cfg.min_np or 1),
        env.MAX_NP.name: str(cfg.max_np or cfg.nproc),
        env.RUN_DIR.name: str(Path(cfg.run_dir).resolve()) if cfg.run_dir else "",
        # the torchrun contract, for scripts that read it
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": cfg.host, "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # env:// init joins our store instead of hosting one
        "PYTHONUNBUFFERED": "1",
    })
    if cfg.debug_collectives:
        environ[env.DEBUG_COLLECTIVES.name] = "1"
    if "OMP_NUM_THREADS" not in os.environ:  # n workers on one host must not oversubscribe cores
        environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // size))
    return environ


def run_job(cfg: RunConfig, output=None) -> int:
    """Host the store, start and supervise the workers; return the job's exit code."""
    bounds = ctl.Bounds(min_np=cfg.min_np or 1, max_np=cfg.max_np or cfg.nproc, replace=cfg.replace,
                        join_timeout=cfg.join_timeout, suspect_window=min(cfg.timeout, 5.0),
                        max_failures=cfg.max_failures, liveness_timeout=cfg.liveness_timeout,
                        busy_timeout=cfg.busy_timeout,
                        stale_after=4 * heartbeat_interval(cfg.liveness_timeout))
    driver_cfg = DriverConfig(job_id=cfg.job_id, nproc=cfg.nproc, command=cfg.command, bounds=bounds,
                              host=cfg.host, port=cfg.port, timeout=cfg.timeout, grace=cfg.grace)
    return Driver(driver_cfg, lambda w, rank, size, port, secret: worker_env(cfg, w, rank, size, port, secret),
                  output=output).run()
