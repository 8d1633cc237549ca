"""Scheduling policies for the simulator and the live scheduler (each implements
:class:`~taiji.sched.policy.Policy`)."""

from __future__ import annotations

from taiji.errors import ConfigError
from taiji.sched.costs import ResizeCost
from taiji.sched.policies.common import FIDELITY_MODES, check_fidelity
from taiji.sched.policies.drf import ElasticDrf
from taiji.sched.policies.fifo import Fifo
from taiji.sched.policies.optimus import OptimusOracle
from taiji.sched.policies.pcrr import Pcrr, horizon_slots
from taiji.sched.policies.pollux import PolluxLike
from taiji.sched.policies.srtf import SrtfOracle
from taiji.sched.policies.tiresias import AUTO, Tiresias

POLICIES = {
    "fifo": Fifo,
    "drf": ElasticDrf,
    "tiresias": Tiresias,
    "optimus": OptimusOracle,
    "pollux": PolluxLike,
    "srtf": SrtfOracle,
    "pcrr": Pcrr,
}


def make_policy(
    name: str,
    resize: ResizeCost | None = None,
    fidelity: str = "taiji",
    las_threshold: float | str | None = None,
    round_s: float | None = None,
):
    """A policy by name (``fifo``, ``drf``, ``tiresias``, ``optimus``, ``pollux``, ``srtf``, ``pcrr``).

    ``resize``: the simulated system's resize cost (``costs.SYSTEMS[...]``, the same as
    ``SimConfig.resize``), for the policies that weigh a change against it: ``pcrr`` (LP and
    hysteresis) and ``pollux`` (its restart factor, charged the largest pause). The simulator does
    not tell policies what a change costs, so without it both assume a 30 s restart.

    ``fidelity`` (:data:`FIDELITY_MODES`): ``pollux`` makes ``tiresias`` and ``optimus`` place jobs and
    rank GPUs as Pollux's simulator does (``policies.common``); the other policies have no such mode.

    ``las_threshold``: Tiresias's demotion threshold in worker-seconds (default: 16 GPU-hours, Pollux's
    setting), or ``"auto"``: the median predicted job size of the workload (the live daemon's default,
    ``--las-threshold``; :mod:`~taiji.sched.policies.tiresias`); a replay of a live run must build its
    policy the same way.

    ``round_s``: the seconds between the rounds that execute its decisions (the simulator's
    interval, the daemon's ``--round``): PCRR's LP plans with a first slot that long (default 60 s)."""
    check_fidelity(fidelity)
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    if las_threshold is not None:
        auto = las_threshold == AUTO
        if name != "tiresias" or not (auto or isinstance(las_threshold, (int, float)) and las_threshold > 0):
            raise ConfigError(
                f"a LAS threshold is a number of worker-seconds > 0 or {AUTO!r} for the tiresias policy"
            )
        return Tiresias(threshold_gpu_s=None if auto else float(las_threshold), fidelity=fidelity)
    if name in ("tiresias", "optimus"):
        return POLICIES[name](fidelity=fidelity)
    if name == "pcrr" and (resize is not None or round_s is not None):
        first = Pcrr.slot_s if round_s is None else round_s
        return Pcrr(resize=resize or Pcrr.resize, slot_s=first, slots=horizon_slots(first))
    if resize is not None and name == "pollux":
        return PolluxLike(restart_penalty_s=max(resize.grow, resize.shrink, resize.move))
    return POLICIES[name]()


__all__ = [
    "FIDELITY_MODES",
    "POLICIES",
    "ElasticDrf",
    "Fifo",
    "OptimusOracle",
    "Pcrr",
    "PolluxLike",
    "SrtfOracle",
    "Tiresias",
    "make_policy",
]
