"""Allreduce plans over one cluster version's ranks: KungFu's topology control.

- ``ring``: gloo's own allreduce over every rank (the default);
- ``tree``: a binary tree (rank r's children are 2r+1 and 2r+2): sums flow up to rank 0, the
  result flows back down;
- ``star``: every rank's tensor goes to rank 0, which sums and sends the result back;
- ``hierarchical``: reduce inside each host to its leader (its lowest rank), allreduce among the
  leaders, broadcast inside each host — each gradient byte crosses hosts once per leader, not
  once per rank (on one host, or with one rank per host, it is the ring).

Every plan is exact: the same sum as the ring up to floating-point reassociation, and every rank
ends with the *same bytes* (the result is computed in one place — rank 0, or the leaders' ring,
which hands each chunk's one reduction to everyone — and copied), so replicas stay bitwise
identical. Which ranks share a host comes from the cluster config (``ClusterView.hosts``); the
layout and the tree are plain functions here, the groups are the communicator's (one per host
and one for the leaders, built per version like every other group).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class HostLayout:
    """Ranks grouped by host; hosts in the order of their lowest rank."""

    groups: tuple[tuple[int, ...], ...]

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(group[0] for group in self.groups)

    def host_index(self, rank: int) -> int:
        return next(i for i, group in enumerate(self.groups) if rank in group)


def host_layout(hosts: Sequence[str]) -> HostLayout:
    """``hosts[r]`` is rank r's host -> the ranks of each host."""
    order: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        order.setdefault(host, []).append(rank)
    return HostLayout(tuple(tuple(ranks) for ranks in order.values()))


def tree_links(rank: int, size: int) -> tuple[int | None, tuple[int, ...]]:
    """Rank ``rank``'s parent (None for the root, rank 0) and children in a binary tree."""
    parent = None if rank == 0 else (rank - 1) // 2
    return parent, tuple(c for c in (2 * rank + 1, 2 * rank + 2) if c < size)


class Groups(Protocol):
    """What a plan needs from the communicator: this rank, the size, and process groups."""

    rank: int
    size: int

    def full(self) -> Any: ...  # every rank
    def among(self, name: str, members: tuple[int, ...]) -> Any: ...  # ``members`` only (this rank is one)
    def layout(self) -> HostLayout: ...


def _wait(work: Any) -> None:
    work.wait()


def ring(tensor: torch.Tensor, groups: Groups) -> None:
    _wait(groups.full().allreduce([tensor], dist.AllreduceOptions()))


# Star and tree move a large tensor in pieces of this many elements (4 MB of float32): a rank
# sends piece i+1 while its reduced piece i comes back, so a link is busy both ways at once.
CHUNK_ELEMENTS = 1 << 20
_UP, _DOWN = 0, 1  # message tags: piece i goes up as 2i, its sum comes down as 2i+1


def _pieces(tensor: torch.Tensor) -> list[torch.Tensor]:
    return list(tensor.view(-1).split(CHUNK_ELEMENTS))


def _in_place(plan: Callable[[torch.Tensor, Groups], None]) -> Callable[[torch.Tensor, Groups], None]:
    """``plan`` works on views of a contiguous tensor: give it one and copy the sum back."""

    def run(tensor: torch.Tensor, groups: Groups) -> None:
        if tensor.is_contiguous():
            plan(tensor, groups)
        else:
            flat = tensor.contiguous()
            plan(flat, groups)
            tensor.copy_(flat)

    return run


def star(tensor: torch.Tensor, groups: Groups) -> None:
    """Every rank sends to rank 0, which sums in rank order and sends the sum back, piece by piece."""
    group, others = groups.full(), range(1, groups.size)
    pieces = _pieces(tensor)
    if groups.rank != 0:
        works = [group.send([piece], 0, 2 * i + _UP) for i, piece in enumerate(pieces)]
        # a piece's sum arrives only after rank 0 has all of that piece: its send has left
        works += [group.recv([piece], 0, 2 * i + _DOWN) for i, piece in enumerate(pieces)]
        for work in works:
            _wait(work)
        return
    parts = [[torch.empty_like(piece) for piece in pieces] for _ in others]
    received = [
        [group.recv([part], peer, 2 * i + _UP) for i, part in enumerate(mine)]
        for peer, mine in zip(others, parts)
    ]
    sent = []
    for i, piece in enumerate(pieces):
        for peer_received, peer_parts in zip(received, parts):  # in rank order: one fixed sum
            _wait(peer_received[i])
            piece.add_(peer_parts[i])
        sent += [group.send([piece], peer, 2 * i + _DOWN) for peer in others]
    for work in sent:
        _wait(work)


def tree(tensor: torch.Tensor, groups: Groups) -> None:
    """Binary tree, piece by piece: sum the children's pieces into this rank's, pass it up, and
    pass the root's sum down."""
    group, rank = groups.full(), groups.rank
    parent, children = tree_links(rank, groups.size)
    pieces = _pieces(tensor)
    parts = [[torch.empty_like(piece) for piece in pieces] for _ in children]
    received = [
        [group.recv([part], child, 2 * i + _UP) for i, part in enumerate(mine)]
        for child, mine in zip(children, parts)
    ]
    # a piece's sum comes down only after this rank's piece went up: receiving into it is safe
    results = (
        [group.recv([piece], parent, 2 * i + _DOWN) for i, piece in enumerate(pieces)]
        if parent is not None
        else []
    )
    sent = []
    for i, piece in enumerate(pieces):
        for child_received, child_parts in zip(received, parts):  # children in order: a fixed reassociation
            _wait(child_received[i])
            piece.add_(child_parts[i])
        if parent is not None:
            sent.append(group.send([piece], parent, 2 * i + _UP))
        else:
            sent += [group.send([piece], child, 2 * i + _DOWN) for child in children]
    for i, piece in enumerate(pieces if parent is not None else []):
        _wait(results[i])
        sent += [group.send([piece], child, 2 * i + _DOWN) for child in children]
    for work in sent:
        _wait(work)


def runs_as_ring(name: str, hosts: Sequence[str]) -> bool:
    """Is plan ``name`` gloo's ring over these ranks? The ring itself, and hierarchical on one
    host or with one rank per host (then it goes straight to gloo, without the plan thread)."""
    groups = len(set(hosts))
    return name == "ring" or (name == "hierarchical" and (groups == 1 or groups == len(hosts)))


def hierarchical(tensor: torch.Tensor, groups: Groups) -> None:
    layout = groups.layout()
    mine = layout.groups[layout.host_index(groups.rank)]
    local = groups.among(f"host{layout.host_index(groups.rank)}", mine) if len(mine) > 1 else None
    if local is not None:
        options = dist.ReduceOptions()
        options.rootRank = 0
        _wait(local.reduce([tensor], options))
    if groups.rank == mine[0] and len(layout.groups) > 1:
        _wait(groups.among("leaders", layout.leaders).allreduce([tensor], dist.AllreduceOptions()))
    if local is not None:
        _broadcast(local, tensor, 0)


def _broadcast(group: Any, tensor: torch.Tensor, root: int) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = root
    options.rootTensor = 0
    _wait(group.broadcast([tensor], options))


PLANS: dict[str, Callable[[torch.Tensor, Groups], None]] = {
    "ring": ring,
    "tree": _in_place(tree),
    "star": _in_place(star),
    "hierarchical": hierarchical,
}


class PlanWork:
    """One plan's run on the plan thread: what a Handle waits on, like a gloo Work."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def finish(self, error: BaseException | None = None) -> None:
        # without its traceback: the plan's frames would keep its process groups alive wherever
        # the error is dropped last, instead of on the reaper
        self._error = None if error is None else error.with_traceback(None)
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the plan has run (at once if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error

    def is_completed(self) -> bool:
        return self._done.is_set()


class PlanRunner:
    """One daemon thread that runs a communicator's plans in the order they were submitted.
    Every rank submits the same plans in the same order, so each group sees its collectives in
    the same order everywhere; and a plan's stages run while the caller goes on (a bucket's
    allreduce overlaps the rest of backward, as gloo's own asynchronous ring does)."""

    def __init__(self, name: str, closed_error: Callable[[], BaseException]):
        self._name = name
        self._closed_error = closed_error
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], PlanWork] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, run: Callable[[], None]) -> PlanWork:
        work = PlanWork()
        with self._lock:  # so that nothing is queued behind the stop marker
            if self._closed:
                work.finish(self._closed_error())
                return work
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((run, work))
        return work

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, work = item
            del item
            try:
                run()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                work.finish(exc)
            else:
                work.finish()
            del run, work

    def close(self) -> None:
        """End the thread once the plans already submitted have run (they fail fast once the
        communicator's groups are aborted); later submissions fail at once."""
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after ``close``): the reaper does, before it destroys the
        groups the plans used, so no plan is inside gloo when they go."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
