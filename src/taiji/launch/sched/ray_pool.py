"""The host pool of `taiji sched serve --ray`: a Ray cluster's node list as the scheduler's hosts.

Pure decisions on data (``ray.nodes()``'s dicts), no Ray here. The scheduler has a fixed number
of identical hosts (``--max-hosts`` *seats* of ``--slots`` slots each); a Ray node takes a free
seat the first time it is seen and keeps it for good (a node that leaves and comes back at the
same address, with a new node id, is the same host). A seat is *up* while a live node at its
address has room for ``--slots`` workers (``--ray-cpus-per-worker``/``--ray-gpus-per-worker``
each); a seat never bound to a node is down. So the pool follows the cluster: a node added
takes a seat that comes up, a node removed (its raylet gone) takes its seat down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pool:
    """Seat -> the address bound to it (None: free), and the live node id on each up seat."""

    seats: tuple[str | None, ...]
    live: Mapping[int, str]  # seat -> NodeID of the live node there
    too_small: tuple[str, ...] = ()  # live nodes that cannot hold --slots workers (not in the pool)
    unseated: tuple[str, ...] = ()  # live nodes with no free seat left (--max-hosts is full)


def node_slots(node: Mapping[str, Any], per_worker: Mapping[str, float]) -> int:
    """How many workers the node's resources hold (``per_worker``: Ray resources one worker takes)."""
    resources = node.get("Resources", {}) or {}
    fits = [
        math.floor(resources.get(name, 0.0) / amount + 1e-9)
        for name, amount in per_worker.items()
        if amount > 0
    ]
    return min(fits) if fits else 0


def seat_nodes(
    seats: Sequence[str | None],
    nodes: Sequence[Mapping[str, Any]],
    per_worker: Mapping[str, float],
    slots: int,
) -> Pool:
    """Bind each live node big enough for ``slots`` workers to a seat (its own, else the first free
    one); which seats are up, with their nodes."""
    bound = list(seats)
    live: dict[int, str] = {}
    too_small: list[str] = []
    unseated: list[str] = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        address = str(node.get("NodeManagerAddress", ""))
        if node_slots(node, per_worker) < slots:
            too_small.append(address)
            continue
        if address not in bound:
            if None not in bound:
                unseated.append(address)
                continue
            bound[bound.index(None)] = address
        live[bound.index(address)] = str(node["NodeID"])
    return Pool(tuple(bound), live, tuple(too_small), tuple(unseated))


def seat_changes(previous: Sequence[bool | None], pool: Pool) -> list[tuple[int, bool]]:
    """(seat, up) for every seat whose state differs from ``previous`` (None: never said)."""
    return [
        (seat, seat in pool.live)
        for seat, was in enumerate(previous)
        if was is None or was != (seat in pool.live)
    ]


def seat_name(seats: Sequence[str | None], seat: int) -> str:
    """What the daemon calls a seat: its node's address ("" while no node has taken it: never up,
    never shown as a host that is down)."""
    return seats[seat] or ""


def pool_slots(nodes: Sequence[Mapping[str, Any]], per_worker: Mapping[str, float]) -> int:
    """``--slots``'s default on Ray: what the smallest live node holds (0: none holds a worker)."""
    fits = [node_slots(node, per_worker) for node in nodes if node.get("Alive")]
    return min([n for n in fits if n > 0], default=0)
