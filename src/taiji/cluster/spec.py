"""Cluster membership as immutable data, and the pure transitions between versions.

A worker's rank is its index in ``ClusterConfig.workers``. Joiners are appended and
shrinks drop the newest workers, so rank 0 is always the oldest survivor: the worker
that certainly holds the current training state.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class WorkerSpec:
    id: str
    host: str = "127.0.0.1"

    def to_dict(self) -> dict:
        return {"id": self.id, "host": self.host}

    @staticmethod
    def from_dict(data: dict) -> WorkerSpec:
        return WorkerSpec(id=str(data["id"]), host=str(data.get("host", "127.0.0.1")))


@dataclass(frozen=True)
class ClusterConfig:
    """One version of the membership. ``lost``: the previous version's members this one drops
    because they failed (a crash, a lost host, a suspected hang) rather than by plan: a worker
    still waiting in a collective of an older version that counted any of them knows at once
    that it can never complete."""

    version: int
    workers: tuple[WorkerSpec, ...]
    lost: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ids = [w.id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"cluster v{self.version} lists a worker twice: {ids}")
        if self.version < 0:
            raise ConfigError(f"cluster version must be >= 0, got {self.version}")

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(w.id for w in self.workers)

    def rank_of(self, worker_id: str) -> int | None:
        """This worker's rank in this version, or None if it is not a member."""
        for rank, worker in enumerate(self.workers):
            if worker.id == worker_id:
                return rank
        return None

    def to_dict(self) -> dict:
        """Hosts listed once, workers as runs in rank order: ``[host index, first id, count]``
        stands for ``count`` workers on that host whose ids count up from the first (``w8``,
        ``w9``, ...). At 1,024 workers on 128 hosts that is a few KB, not one entry per worker."""
        hosts: dict[str, int] = {}
        runs: list[list] = []
        for worker in self.workers:
            host = hosts.setdefault(worker.host, len(hosts))
            if runs and runs[-1][0] == host and _next_id(runs[-1][1], runs[-1][2]) == worker.id:
                runs[-1][2] += 1
            else:
                runs.append([host, worker.id, 1])
        data: dict = {"version": self.version, "hosts": list(hosts), "runs": runs}
        if self.lost:
            data["lost"] = list(self.lost)
        return data

    @staticmethod
    def from_dict(data: dict) -> ClusterConfig:
        if "runs" in data:
            hosts = [str(h) for h in data["hosts"]]
            workers = tuple(
                w
                for host, first, count in data["runs"]
                for w in _run(hosts[int(host)], str(first), int(count))
            )
        else:  # one entry per worker
            workers = tuple(WorkerSpec.from_dict(w) for w in data["workers"])
        return ClusterConfig(
            version=int(data["version"]), workers=workers, lost=tuple(str(i) for i in data.get("lost", ()))
        )

    def dooms(self, members: Iterable[str]) -> tuple[str, ...]:
        """Which of ``members`` (an older version's) this version dropped as lost."""
        return tuple(i for i in self.lost if i in set(members))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> ClusterConfig:
        return ClusterConfig.from_dict(json.loads(text))


@functools.lru_cache(maxsize=1 << 14)
def _run(host: str, first: str, count: int) -> tuple[WorkerSpec, ...]:
    """The workers of a run, made once per run seen, not at every read: every worker reads each
    new config, whose runs are mostly those of the last one (1,024 workers: 0.1 ms, not 5 ms)."""
    return tuple(WorkerSpec(wid, host) for wid in _run_ids(first, count))


def _run_ids(first: str, count: int) -> list[str]:
    """The ids of a run of ``count`` from ``first`` (the stem and number split once per run, not per
    worker)."""
    if count == 1:
        return [first]
    stem = first.rstrip("0123456789")
    if _next_id(first, 1) is None:
        raise ConfigError(f"a run of {count} worker ids from {first!r}, which does not end in a number")
    base = int(first[len(stem) :])
    return [f"{stem}{base + k}" for k in range(count)]


def _next_id(first: str, k: int) -> str | None:
    """The id ``k`` after ``first`` in a run (``w8``, 2 -> ``w10``); None when ``first`` does not
    end in a number written without leading zeros (such an id is a run of its own)."""
    if k == 0:
        return first
    stem = first.rstrip("0123456789")
    digits = first[len(stem) :]
    if not digits or (len(digits) > 1 and digits[0] == "0"):
        return None
    return f"{stem}{int(digits) + k}"


def initial(workers: Sequence[WorkerSpec], version: int = 1) -> ClusterConfig:
    if not workers:
        raise ConfigError("a cluster needs at least one worker")
    return ClusterConfig(version=version, workers=tuple(workers))


def grow(config: ClusterConfig, joiners: Iterable[WorkerSpec]) -> ClusterConfig:
    """Next version with ``joiners`` appended after every current worker."""
    joiners = tuple(joiners)
    if not joiners:
        raise ConfigError("grow needs at least one joiner")
    return ClusterConfig(version=config.version + 1, workers=config.workers + joiners)


def shrink(config: ClusterConfig, size: int) -> ClusterConfig:
    """Next version keeping the ``size`` oldest workers."""
    if not 1 <= size < config.size:
        raise ConfigError(f"cannot shrink a cluster of {config.size} to {size}")
    return ClusterConfig(version=config.version + 1, workers=config.workers[:size])


def remove(config: ClusterConfig, ids: Iterable[str], lost: bool = False) -> ClusterConfig:
    """Next version without the workers ``ids``; survivors keep their relative order.
    ``lost``: they failed (see ``ClusterConfig.lost``), rather than leaving by plan."""
    gone = set(ids)
    unknown = gone - set(config.ids)
    if unknown:
        raise ConfigError(f"cannot remove workers {sorted(unknown)}: not in cluster v{config.version}")
    survivors = tuple(w for w in config.workers if w.id not in gone)
    if not survivors:
        raise ConfigError(f"removing {sorted(gone)} would leave cluster v{config.version} empty")
    return ClusterConfig(
        version=config.version + 1, workers=survivors, lost=tuple(sorted(gone)) if lost else ()
    )


@dataclass(frozen=True)
class ClusterView:
    """One worker's frozen view of the cluster version it trains in: what strategies, policies
    and reports may read about membership. A new version gives a new view."""

    worker_id: str
    rank: int
    size: int
    version: int
    members: tuple[str, ...]  # worker ids by rank
    hosts: tuple[str, ...]  # each rank's host address, by rank
    min_size: int = 1
    max_size: int | None = None
    elastic: bool = False  # started by `taiji run` (a launcher can change membership)

    @property
    def host(self) -> str:
        return self.hosts[self.rank]

    @property
    def per_host(self) -> dict[str, int]:
        """Workers on each host (what a scheduler audits its slots against)."""
        return dict(Counter(self.hosts))

    @staticmethod
    def of(
        config: ClusterConfig,
        worker_id: str,
        *,
        min_size: int = 1,
        max_size: int | None = None,
        elastic: bool = False,
    ) -> ClusterView:
        rank = config.rank_of(worker_id)
        if rank is None:
            raise ConfigError(f"worker {worker_id} is not a member of cluster v{config.version}")
        return ClusterView(
            worker_id,
            rank,
            config.size,
            config.version,
            config.ids,
            tuple(w.host for w in config.workers),
            min_size,
            max_size,
            elastic,
        )
