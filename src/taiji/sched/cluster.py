"""Hosts, GPU and CPU capacity, allocations and placement helpers for the scheduler (pure).

An :class:`Allocation` gives a job a number of GPUs (workers) on each host (a tuple as long as the
cluster has hosts), the total batch size it trains with, and for a parameter-server job its servers
per host and the CPU slots each server takes (hosts have ``cpus_per_host`` CPU slots for servers).
:meth:`Cluster.check` is the one place that decides whether a set of allocations fits; the simulator calls it
on every policy answer, so a policy bug surfaces as a :class:`PolicyError` instead of oversubscribed GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from taiji.errors import ConfigError, TaijiError

logger = logging.getLogger(__name__)


class PolicyError(TaijiError):
    """A policy returned allocations that are not valid for the cluster or the jobs."""


@dataclass(frozen=True)
class Allocation:
    """GPUs per host (index = host) and the total batch size the job trains with; a PS job also
    has its parameter servers per host (``ps_placement``, empty for allreduce jobs) and the CPU
    slots each server takes."""

    placement: tuple[int, ...]
    batch_size: int
    ps_placement: tuple[int, ...] = ()
    ps_cpus: int = 0

    @property
    def servers(self) -> int:
        return sum(self.ps_placement)

    def cpus_on(self, host: int) -> int:
        """CPU slots this allocation's servers take on ``host``."""
        return self.ps_placement[host] * self.ps_cpus if self.ps_placement else 0

    @property
    def replicas(self) -> int:
        return sum(self.placement)

    @property
    def hosts(self) -> int:
        return sum(1 for count in self.placement if count > 0)


@dataclass(frozen=True)
class Cluster:
    """``num_hosts`` identical hosts with ``gpus_per_host`` GPUs each (Pollux: 16 × 4) and
    ``cpus_per_host`` CPU slots for parameter servers (workers are counted as GPUs only [I])."""

    num_hosts: int = 16
    gpus_per_host: int = 4
    cpus_per_host: int = 16

    def __post_init__(self) -> None:
        if self.num_hosts < 1 or self.gpus_per_host < 1 or self.cpus_per_host < 0:
            raise ConfigError(
                f"a cluster needs >= 1 host, >= 1 GPU and >= 0 CPUs per host, got "
                f"{self.num_hosts} x {self.gpus_per_host} (CPUs {self.cpus_per_host})"
            )

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """``"16x4"`` → 16 hosts with 4 GPUs each; ``"16x4x8"``: and 8 server CPU slots each."""
        try:
            parts = [int(part) for part in text.lower().split("x")]
            if len(parts) not in (2, 3):
                raise ValueError
        except ValueError:
            raise ConfigError(f"cluster {text!r}: expected HOSTSxGPUS[xCPUS], e.g. 16x4") from None
        return cls(*parts)

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

    def free_cpus(self, allocations: Iterable[Allocation]) -> list[int]:
        """Free server CPU slots per host once ``allocations`` are taken (may go negative)."""
        free = [self.cpus_per_host] * self.num_hosts
        for allocation in allocations:
            for host in range(self.num_hosts):
                free[host] -= allocation.cpus_on(host)
        return free

    def check(self, allocations: Mapping[str, Allocation], known: Iterable[str]) -> None:
        """Raise PolicyError unless every allocation names a known job, has one non-negative
        count per host, at least one GPU and a batch >= 1, and no host is oversubscribed in GPUs
        or in server CPUs."""
        known = set(known)
        for name, allocation in allocations.items():
            if name not in known:
                raise PolicyError(f"allocation for {name!r}, which is not an active job")
            if len(allocation.placement) != self.num_hosts or min(allocation.placement) < 0:
                raise PolicyError(
                    f"{name}: placement {allocation.placement} is not {self.num_hosts} non-negative counts"
                )
            if allocation.replicas < 1 or allocation.batch_size < 1:
                raise PolicyError(f"{name}: empty placement or batch < 1 ({allocation})")
            if allocation.ps_placement and (
                len(allocation.ps_placement) != self.num_hosts
                or min(allocation.ps_placement) < 0
                or allocation.ps_cpus < 0
            ):
                raise PolicyError(
                    f"{name}: server placement {allocation.ps_placement} is not "
                    f"{self.num_hosts} non-negative counts (or CPUs per server < 0)"
                )
        over = [
            (host, -left)
            for host, left in enumerate(self.free(a.placement for a in allocations.values()))
            if left < 0
        ]
        if over:
            raise PolicyError(f"hosts oversubscribed (host, GPUs over): {over}")
        over = [(host, -left) for host, left in enumerate(self.free_cpus(allocations.values())) if left < 0]
        if over:
            raise PolicyError(f"hosts oversubscribed (host, server CPUs over): {over}")


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
        if best:  # the rest fits on one host: use the tightest one
            host = min(best, key=lambda h: (free[h], h))
        take = min(free[host], remaining)
        placement[host] += take
        remaining -= take
    return tuple(placement)


def most_free_first(free: Sequence[int], count: int) -> tuple[int, ...] | None:
    """Place ``count`` GPUs the way Pollux's simulator places Tiresias' and Optimus' jobs [C]: take
    as many as possible from the host with the most free GPUs (ties: lowest host index), then the
    next, until ``count`` are placed; None if fewer are free. Unlike :func:`pack` a small job goes on
    the emptiest host, not the tightest, which leaves fewer whole hosts for the big jobs after it."""
    if count < 1 or sum(max(f, 0) for f in free) < count:
        return None
    left = list(free)
    placement = [0] * len(free)
    while count:
        host = max(range(len(left)), key=lambda h: (left[h], -h))
        take = min(left[host], count)
        placement[host] += take
        left[host] -= take
        count -= take
    return tuple(placement)


Placer = Callable[[Sequence[int], int], "tuple[int, ...] | None"]
PLACERS: dict[str, Placer] = {"taiji": pack, "pollux": most_free_first}


def packed_shape(count: int, gpus_per_host: int) -> tuple[int, ...]:
    """The consolidated shape of ``count`` GPUs on an empty cluster (full hosts, then the rest):
    what a policy assumes when it estimates speed before placing."""
    full, rest = divmod(count, gpus_per_host)
    return (gpus_per_host,) * full + ((rest,) if rest else ())


class ServerNeeds(Protocol):
    """What placement needs to know of a job's parameter servers (``model.Application`` and
    ``ps.PsApplication`` both answer: allreduce jobs need none)."""

    server_cpus: int

    def servers_for(self, workers: int) -> int: ...


def place_servers(
    free_cpus: Sequence[int], workers: Sequence[int], count: int, cpus_each: int
) -> tuple[int, ...] | None:
    """Hosts for ``count`` servers of ``cpus_each`` CPU slots beside ``workers`` (per host), or
    None if they do not fit. All on the workers' host when they share one and it has room (that
    is what makes the job internal); otherwise one at a time, round-robin over the workers' hosts
    with room (most workers first), then on other hosts (most free CPUs first)."""
    placed = [0] * len(free_cpus)
    if count == 0:
        return tuple(placed)
    left = list(free_cpus)
    worker_hosts = [h for h, n in enumerate(workers) if n > 0]
    if len(worker_hosts) == 1 and left[worker_hosts[0]] >= count * cpus_each:
        placed[worker_hosts[0]] = count
        return tuple(placed)
    for _ in range(count):
        room = [h for h in range(len(left)) if left[h] >= cpus_each]
        if not room:
            return None
        # spread over the worker hosts (by servers placed so far) before using others
        host = min(room, key=lambda h: (workers[h] == 0, placed[h], -workers[h], -left[h], h))
        placed[host] += 1
        left[host] -= cpus_each
    return tuple(placed)


def with_servers(
    cluster: Cluster,
    chosen: Sequence[tuple[str, Allocation]],
    needs: Mapping[str, ServerNeeds],
    current: Mapping[str, Allocation],
) -> dict[str, Allocation]:
    """Give each PS job in ``chosen`` (priority order, GPUs already placed) its servers: the ones it
    holds when its workers and server count are unchanged (no move), else :func:`place_servers`.
    A job whose servers do not fit is left out this round (its GPUs stay free). Allreduce jobs
    pass through unchanged."""
    result: dict[str, Allocation] = {}
    free = [cluster.cpus_per_host] * cluster.num_hosts
    pending: list[tuple[str, Allocation, int, int]] = []
    for name, allocation in chosen:
        need = needs[name]
        count = need.servers_for(allocation.replicas)
        held = current.get(name)
        if count == 0:
            result[name] = allocation
        elif held is not None and held.placement == allocation.placement and held.servers == count:
            result[name] = Allocation(
                allocation.placement, allocation.batch_size, held.ps_placement, held.ps_cpus
            )
            free = [f - held.cpus_on(h) for h, f in enumerate(free)]
        else:
            pending.append((name, allocation, count, need.server_cpus))
    for name, allocation, count, cpus in pending:
        servers = place_servers(free, allocation.placement, count, cpus)
        if servers is None:
            logger.debug("%s: %d servers of %d CPUs do not fit; left out this round", name, count, cpus)
            continue
        free = [f - n * cpus for f, n in zip(free, servers)]
        result[name] = Allocation(allocation.placement, allocation.batch_size, servers, cpus)
    order = [name for name, _ in chosen]
    return {name: result[name] for name in order if name in result}


def place_all(
    cluster: Cluster,
    wanted: Sequence[tuple[str, int, int]],
    current: Mapping[str, Allocation],
    needs: Mapping[str, ServerNeeds] | None = None,
    placer: Placer = pack,
) -> dict[str, Allocation]:
    """Placements for ``wanted`` = (job, GPUs, batch) in priority order. A job whose GPU count
    is unchanged keeps its current placement (moving it would cost a restart); the others are
    packed in order, and a job that no longer fits is left out. Callers keep the total within
    the cluster, so with spreading allowed every job fits in GPUs. ``placer`` puts a job's GPUs on
    the free ones (:data:`PLACERS`). With ``needs`` (per job, what its parameter servers take) PS
    jobs get servers by :func:`with_servers`."""
    result: dict[str, Allocation] = {}
    kept = [
        (name, count, batch)
        for name, count, batch in wanted
        if name in current and current[name].replicas == count
    ]
    for name, _, batch in kept:
        result[name] = Allocation(current[name].placement, batch)
    free = cluster.free(a.placement for a in result.values())
    for name, count, batch in wanted:
        if name in result or count < 1:
            continue
        placement = placer(free, count)
        if placement is None:
            logger.debug("%s: %d GPUs do not fit; left out this round", name, count)
            continue
        free = [left - used for left, used in zip(free, placement)]
        result[name] = Allocation(placement, batch)
    if needs is None:
        return result
    return with_servers(
        cluster, [(name, result[name]) for name, _, _ in wanted if name in result], needs, current
    )


def at_least(allocation: Allocation, count: int | None) -> Allocation:
    """``allocation`` cut to ``count`` workers (None: all of it), kept on the hosts where it has
    the most (the live ``clamp`` of a job to its ``--min-np``)."""
    if count is None or count >= allocation.replicas:
        return allocation
    out = [0] * len(allocation.placement)
    for host in sorted(range(len(out)), key=lambda h: (-allocation.placement[h], h)):
        out[host] = min(allocation.placement[host], count - sum(out))
    return dataclasses.replace(allocation, placement=tuple(out))
