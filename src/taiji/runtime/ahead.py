"""Groups built ahead: a newer cluster version that keeps this worker and lost nobody of its current
version — a planned shrink (a preemption notice, a resize), or a grow whose joiners wait at the door —
has its process groups built on a thread of their own while training goes on in the current version.
The transition at the agreed step boundary then adopts that communicator: no rendezvous on the
critical path. The lead worker reports such a version in its control row only once its own groups
are built (``ElasticMembership.newest_version``), and a version's groups form only when every member
has joined them, so by that boundary every member's are built or about to be.

Groups built ahead meet on store connections of their own (``Ahead``). A version
that dropped members as lost is never built ahead: that is a failure, and the step fails at once
(``comm.abandon``). A build that fails is reported when the transition adopts it (its ``connect``
raises), and the usual recovery follows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed import Store

from ..cluster.spec import ClusterConfig
from ..comm.communicator import Communicator
from ..errors import CommError

log = logging.getLogger(__name__)


def worth_building_ahead(current: ClusterConfig | None, newer: ClusterConfig, worker_id: str) -> bool:
    """Whether ``newer``'s groups are built ahead by the member ``worker_id`` of ``current``: a
    later version that keeps it and dropped none of ``current``'s members as lost."""
    return (
        current is not None
        and newer.version > current.version
        and current.rank_of(worker_id) is not None
        and newer.rank_of(worker_id) is not None
        and not newer.dooms(current.ids)
    )


@dataclass
class _Built:
    comm: Communicator
    thread: threading.Thread


class Ahead:
    """The communicators of newer versions being built (or built) ahead, by version. Each build
    meets on a pair of store connections that ``connections`` makes, reused once it ends: the
    training thread's store calls never queue behind a rendezvous, nor does one build behind
    another that still waits for a member (a store connection serves one wait at a time)."""

    def __init__(self, connections: Callable[[], tuple[Store, Store]]):
        self._connections = connections
        self._lock = threading.Lock()
        self._built: dict[int, _Built] = {}
        self._idle: list[tuple[Store, Store]] = []  # connections no build uses now
        self._passed = 0  # the version this worker moved to last: nothing at or below it is built

    def start(self, version: int, make: Callable[[], Communicator]) -> bool:
        """Build ``make()``'s groups on a thread of their own (once per version); False if this
        worker has already moved to ``version`` or past it, or builds it already."""
        with self._lock:
            if version <= self._passed or version in self._built:
                return False
            via = self._idle.pop() if self._idle else None
        # (made here, not under the lock a transition takes: connecting costs round trips)
        via, comm = via or self._connections(), make()
        with self._lock:
            fresh = version > self._passed and version not in self._built
            if fresh:
                thread = threading.Thread(
                    target=self._build, args=(comm, via), name=f"taiji-ahead-v{version}", daemon=True
                )
                self._built[version] = _Built(comm, thread)
                thread.start()
            else:
                self._idle.append(via)
        if not fresh:
            comm.close()
        return fresh

    def _build(self, comm: Communicator, via: tuple[Store, Store]) -> None:
        try:
            comm.connect(via=via)
        except CommError as exc:  # raised again to the transition that adopts it, if one does
            log.info(
                "building the groups of cluster v%d ahead failed: %s", comm.version, str(exc).split(". ")[0]
            )
        finally:
            with self._lock:
                self._idle.append(via)

    def ready(self, version: int) -> bool:
        """Whether nothing is being built for ``version`` any more (built, failed, or never begun)."""
        with self._lock:
            built = self._built.get(version)
        return built is None or not built.thread.is_alive()

    def take(self, version: int) -> Communicator | None:
        """This worker moves to ``version``: its communicator built ahead (its groups may still be
        forming: ``connect()`` waits for them), or None. Older ones are closed."""
        with self._lock:
            self._passed = max(self._passed, version)
            taken = self._built.pop(version, None)
            older = [v for v in self._built if v < version]
            stale = [self._built.pop(v).comm for v in older]
        for comm in stale:
            comm.close()
        return taken.comm if taken is not None else None

    def close(self) -> None:
        with self._lock:
            stale, self._built = [b.comm for b in self._built.values()], {}
        for comm in stale:
            comm.close()
