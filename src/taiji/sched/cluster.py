"""Hosts, GPU capacity, allocations and placement helpers for the scheduler (pure).

An :class:`Allocation` gives a job a number of GPUs on each host (a tuple as long as the cluster
has hosts) and the total batch size it trains with. :meth:`Cluster.check` is the one place that
decides whether a set of allocations fits; the simulator calls it on every policy answer, so a
policy bug surfaces as a :class:`PolicyError` instead of oversubscribed GPUs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from taiji.errors import ConfigError, TaijiError

logger = logging.getLogger(__name__)


class PolicyError(TaijiError):
    """A policy returned allocations that are not valid for the cluster or the jobs."""


@dataclass(frozen=True)
class Allocation:
    """GPUs per host (index = host) and the total batch size the job trains with."""

    placement: tuple[int, ...]
    batch_size: int

    @property
    def replicas(self) -> int:
        return sum(self.placement)

    @property
    def hosts(self) -> int:
        return sum(1 for count in self.placement if count > 0)


@dataclass(frozen=True)
class Cluster:
    """``num_hosts`` identical hosts with ``gpus_per_host`` GPUs each (Pollux: 16 × 4)."""

    num_hosts: int = 16
    gpus_per_host: int = 4

    def __post_init__(self) -> None:
        if self.num_hosts < 1 or self.gpus_per_host < 1:
            raise ConfigError(f"a cluster needs >= 1 host and >= 1 GPU per host, got "
                              f"{self.num_hosts} x {self.gpus_per_host}")

    @classmethod
    def parse(cls, text: str) -> "Cluster":
        """``"16x4"`` → 16 hosts with 4 GPUs each."""
        try:
            hosts, gpus = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise ConfigError(f"cluster {text!r}: expected HOSTSxGPUS, e.g. 16x4") from None
        return cls(hosts, gpus)

    @property
    def total_gpus(self) -> int:
        return self.num_hosts * self.gpus_per_host

    def free(self, placements: Iterable[Sequence[int]]) -> list[int]:
        """Free GPUs per host once ``placements`` are taken (may go negative: see :meth:`check`)."""
        free = [self.gpus_per_host] * self.num_hosts
        for placement in placements:
            for host, count in enumerate(placement):
                free[host] -= count
        return free

    def check(self, allocations: Mapping[str, Allocation], known: Iterable[str]) -> None:
        """Raise PolicyError unless every allocation names a known job, has one non-negative
        count per host, at least one GPU and a batch >= 1, and no host is oversubscribed."""
        known = set(known)
        for name, allocation in allocations.items():
            if name not in known:
                raise PolicyError(f"allocation for {name!r}, which is not an active job")
            if len(allocation.placement) != self.num_hosts or min(allocation.placement) < 0:
                raise PolicyError(f"{name}: placement {allocation.placement} is not "
                                  f"{self.num_hosts} non-negative counts")
            if allocation.replicas < 1 or allocation.batch_size < 1:
                raise PolicyError(f"{name}: empty placement or batch < 1 ({allocation})")
        over = [(host, -left) for host, left in
                enumerate(self.free(a.placement for a in allocations.values())) if left < 0]
        if over:
            raise PolicyError(f"hosts oversubscribed (host, GPUs over): {over}")


def pack(free: Sequence[int], count: int) -> tuple[int, ...] | None:
    """Place ``count`` GPUs on as few hosts as possible, or None if fewer are free. One host that
    fits: the fullest such host (best fit, keeps big holes for big jobs). Otherwise the emptiest
    hosts first, and the last share on the fullest host that holds it. Ties: lowest host index."""
    if count < 1 or sum(max(f, 0) for f in free) < count:
        return None
    placement = [0] * len(free)
    fits = [host for host, left in enumerate(free) if left >= count]
    if fits:
        placement[min(fits, key=lambda host: (free[host], host))] = count
        return tuple(placement)
    remaining = count
    for host in sorted(range(len(free)), key=lambda h: (-free[h], h)):
        if remaining == 0 or free[host] <= 0:
            break
        best = [h for h in range(len(free)) if placement[h] == 0 and free[h] >= remaining]
        if best:   # the rest fits on one host: use the tightest one
            host = min(best, key=lambda h: (free[h], h))
        take = min(free[host], remaining)
        placement[host] += take
        remaining -= take
    return tuple(placement)


def packed_shape(count: int, gpus_per_host: int) -> tuple[int, ...]:
    """The consolidated shape of ``count`` GPUs on an empty cluster (full hosts, then the rest):
    what a policy assumes when it estimates speed before placing."""
    full, rest = divmod(count, gpus_per_host)
    return (gpus_per_host,) * full + ((rest,) if rest else ())


def place_all(cluster: Cluster, wanted: Sequence[tuple[str, int, int]],
              current: Mapping[str, Allocation]) -> dict[str, Allocation]:
    """Placements for ``wanted`` = (job, GPUs, batch) in priority order. A job whose GPU count
    is unchanged keeps its current placement (moving it would cost a restart); the others are
    packed in order, and a job that no longer fits is left out. Callers keep the total within
    the cluster, so with spreading allowed every job fits."""
    result: dict[str, Allocation] = {}
    kept = [(name, count, batch) for name, count, batch in wanted
            if name in current and current[name].replicas == count]
    for name, _, batch in kept:
        result[name] = Allocation(current[name].placement, batch)
    free = cluster.free(a.placement for a in result.values())
    for name, count, batch in wanted:
        if name in result or count < 1:
            continue
        placement = pack(free, count)
        if placement is None:
            logger.debug("%s: %d GPUs do not fit; left out this round", name, count)
            continue
        free = [left - used for left, used in zip(free, placement)]
        result[name] = Allocation(placement, batch)
    return result
