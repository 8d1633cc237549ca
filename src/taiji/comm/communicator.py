"""One set of process groups per cluster version, one group per channel.

Each channel (``grad``, ``ctrl``, ...) is its own torch process group, built directly
from a ``PrefixStore("pg/v{N}/{channel}/")`` and never registered as the global default
group, so moving to a new cluster version is just building new objects. Traffic on
different channels never queues behind each other (KungFu's named asynchronous
collectives). Every collective has a timeout; failures become ``PeerLost`` or
``CollectiveTimeout``, never a hang or a silently wrong result.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .. import env
from ..errors import CommError, ConfigError, ConsensusError, PeerLost, TaijiError
from .addresses import gloo_device
from .digest import tensor_digest
from .handle import REAP_DELAY_S, Handle, comm_error, comm_where, when_done
from .signature import check_signatures, signature
from .teardown import Pending, Teardown, keep_forever, reap_closed_groups, reaper  # noqa: F401 (reap_closed_groups: re-exported)
from .topologies import check_topology
from .topology import PLANS, HostLayout, PlanRunner, PlanWork, host_layout, runs_as_ring

log = logging.getLogger(__name__)

T = TypeVar("T")

CHANNELS = ("grad", "ctrl")
_DEBUG_CHANNEL = "debug"
_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,  # gloo has no AVG: sum, then divide by the live size
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}
_ABANDON_SLICE = datetime.timedelta(milliseconds=10)  # how soon a wait sees its version abandoned


class _PlanGroups:
    """The groups a topology plan uses (comm/topology.py ``Groups``), handed over by the
    communicator that owns them."""

    def __init__(
        self,
        rank: int,
        size: int,
        full: Callable[[], Any],
        among: Callable[[str, tuple[int, ...]], Any],
        layout: Callable[[], HostLayout],
    ):
        self.rank, self.size = rank, size
        self.full, self.among, self.layout = full, among, layout


@dataclass(frozen=True)
class CommOptions:
    timeout: float = 60.0
    debug: bool = False
    host: str = "127.0.0.1"
    hosts: tuple[str, ...] = ()  # each rank's host (hierarchical plans); empty: unknown
    topology: str = "ring"  # how the grad channel allreduces (comm/topology.py)
    cuda_backend: str = field(default_factory=env.CUDA_BACKEND.get)  # nccl | gloo (GPUs shared)


class Communicator:
    """Collectives among the ``size`` workers of one cluster version."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        version: int,
        options: CommOptions = CommOptions(),
        side_store: dist.Store | None = None,
    ):
        if not 0 <= rank < size:
            raise ConfigError(f"rank {rank} is outside a cluster of size {size}")
        if options.timeout <= 0 or options.cuda_backend not in ("nccl", "gloo"):
            raise ConfigError(
                f"collective timeout must be positive (got {options.timeout}) and cuda_backend "
                f"nccl or gloo (got {options.cuda_backend!r})"
            )
        self.store = store
        # the same store on a connection of its own: a second group's rendezvous runs beside the
        # first's (a TCPStore connection waits for one key at a time); None: one after the other
        self.side_store = side_store
        self.rank = rank
        self.size = size
        self.version = version
        self.options = options
        self._groups: dict[str, Any] = {}
        self._in_flight: weakref.WeakSet[Pending] = weakref.WeakSet()  # while its Handle lives
        self._lock = threading.Lock()
        self._connecting = threading.Lock()  # held by connect(), which may run on a thread of its own
        self._connect_failed: CommError | None = None
        self._closed = False
        self._abandoned: str | None = None  # why this version can no longer complete a collective
        self._waiters: set[threading.Event] = set()  # Handles waiting for a collective to end
        self._waiting_since: float | None = None  # (monotonic) a wait for a collective began, still on
        self._plans = PlanRunner(
            f"taiji-plans-v{version}",
            lambda: CommError(
                f"{self._where()} communicator of version {version} is closed",
                channel="grad",
                version=version,
            ),
        )
        self.set_topology(options.topology)

    # -- process groups ---------------------------------------------------------------

    def _group(self, channel: str, device: torch.device, op: str = "connect") -> Any:
        nccl = device.type == "cuda" and self.options.cuda_backend == "nccl"  # else gloo (also for CUDA)
        key = f"{channel}-nccl" if nccl else channel
        with self._lock:
            if self._closed:
                raise CommError(
                    f"{self._where()} communicator of version {self.version} is closed",
                    channel=channel,
                    version=self.version,
                )
            group = self._groups.get(key)
            if group is None:
                group = self._build_group(key, device, op)
                self._groups[key] = group
            return group

    def _build_group(
        self,
        key: str,
        device: torch.device,
        op: str,
        members: tuple[int, ...] | None = None,
        store: dist.Store | None = None,
    ) -> Any:
        """A group of every rank, or of ``members`` only (a plan's host or leaders' group)."""
        prefixed = dist.PrefixStore(f"pg/v{self.version}/{key}", self.store if store is None else store)
        rank, size = (self.rank, self.size) if members is None else (members.index(self.rank), len(members))
        timeout = datetime.timedelta(seconds=self.options.timeout)
        try:
            if device.type == "cuda" and self.options.cuda_backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [gloo_device(self.options.host)]
            return dist.ProcessGroupGloo(prefixed, rank, size, opts)
        except RuntimeError as exc:
            raise self._error(exc, f"{op} (connecting the group)", key) from exc

    def _subgroup(self, key: str, members: tuple[int, ...]) -> Any:
        """A plan's group of ``members``, built on the plan thread (the only one that builds these)
        *outside* the lock: its rendezvous waits for the other ranks' plan threads, and holding
        the lock meanwhile could deadlock with a main thread building another group."""
        closed = CommError(
            f"{self._where()} communicator of version {self.version} is closed",
            channel=key,
            version=self.version,
        )
        with self._lock:
            if self._closed:
                raise closed
            group = self._groups.get(key)
        if group is not None:
            return group
        group = self._build_group(key, torch.device("cpu"), "allreduce", members)
        with self._lock:
            if not self._closed:
                self._groups[key] = group
                return group
        reaper.submit(Teardown(self.version, [group], [], REAP_DELAY_S))  # closed meanwhile
        raise closed

    # -- topology -----------------------------------------------------------------------

    def set_topology(self, name: str) -> None:
        """How the grad channel allreduces from the next call on; every rank must switch at the
        same point (a step boundary)."""
        self.topology = check_topology(name)
        self._ring_plan = runs_as_ring(name, self.options.hosts or ("?",) * self.size)

    def layout(self) -> HostLayout:
        if len(self.options.hosts) != self.size:
            raise ConfigError(
                f"{self._where()} the {self.topology} topology needs each rank's host "
                f"(got {len(self.options.hosts)} for {self.size} ranks)"
            )
        return host_layout(self.options.hosts)

    def _planned(self, channel: str, tensor: torch.Tensor) -> Any:
        """Run the current topology's plan for ``tensor`` on the plan thread."""
        # a group of every rank of the plans' own: the main thread's ops on the channel's group
        # (an integer buffer's max, say) must not interleave with a plan's in different orders
        everyone = tuple(range(self.size))
        groups = _PlanGroups(
            self.rank,
            self.size,
            lambda: self._subgroup(f"{channel}:plan", everyone),
            lambda name, members: self._subgroup(f"{channel}:{name}", members),
            self.layout,
        )
        plan = PLANS[self.topology]
        return self._plans.submit(lambda: plan(tensor, groups))

    def connect(
        self, channels: Sequence[str] | None = None, via: tuple[dist.Store, dist.Store] | None = None
    ) -> None:
        """Build the CPU groups of ``channels`` now rather than on first use (default: the ones a
        step uses): a new version's groups are ready before its first step, two side by side (with
        ``side_store``), so that a recovery pays about one rendezvous, not one per channel. ``via``:
        two store connections to meet on instead (a build ahead: runtime/ahead.py). One call at a
        time: a second (the transition, while a thread builds them ahead) waits for the first, and
        a failed build fails every later call alike (never rebuilt)."""
        with self._connecting:
            if self._connect_failed is not None:
                raise self._connect_failed
            with self._lock:  # every rank the same channels: a joiner learns the plan in use only after this
                wanted = [c for c in channels or CHANNELS if c not in self._groups]
            if self.size > 1 and wanted:
                self._connect_failed = self._build_groups(wanted, *(via or (None, self.side_store)))
            if self._connect_failed is not None:
                raise self._connect_failed

    def _build_groups(
        self, wanted: list[str], store: dist.Store | None, side: dist.Store | None
    ) -> CommError | None:
        built: dict[str, Any] = {}
        failed: list[CommError] = []

        def build(channel: str, store: dist.Store | None = None) -> None:
            try:
                built[channel] = self._build_group(channel, torch.device("cpu"), "connect", store=store)
            except CommError as exc:
                failed.append(exc)

        beside = None
        if len(wanted) > 1 and side is not None:
            beside = threading.Thread(target=build, args=(wanted.pop(), side), daemon=True)
            beside.start()
        for channel in wanted:
            build(channel, store)
        if beside is not None:
            beside.join()
        with self._lock:
            if not self._closed:
                self._groups.update(built)
                built = {}
        if built:  # closed meanwhile
            reaper.submit(Teardown(self.version, list(built.values()), [], REAP_DELAY_S))
        return failed[0] if failed else None

    def close(self) -> None:
        """Tear down this version's groups; later collectives on it raise CommError.

        Cheap for the calling thread: the groups, and the collectives still in flight on them
        (a Handle dropped or kept unwaited), are destroyed by the reaper thread a moment later.
        A Handle waited after close() still gets its collective's result or error.
        """
        with self._lock:
            self._closed = True
            self._plans.close()
            groups, self._groups = list(self._groups.values()), {}
            in_flight, self._in_flight = list(self._in_flight), weakref.WeakSet()
        if self._abandoned is not None:  # stuck collectives: kept; a plan thread in gloo is joined by the
            keep_forever(*groups, *[p.work for p in in_flight if p.work is not None])  # reaper (leaving gloo
            reaper.submit(Teardown(self.version, [], [], 0.0, plans=self._plans))  # at finalization aborts)
            return
        orphans = [pending for pending in in_flight if pending.orphan()]
        del in_flight
        for group in groups:
            try:
                group.abort()
            except (RuntimeError, AttributeError):  # already broken, or a torch without abort()
                pass
        if groups or orphans:
            # Destroying a gloo group waits on each peer's connection (~10 ms per peer and
            # channel), and peers may still be reading what we sent last: the reaper does it
            # a moment later.
            reaper.submit(Teardown(self.version, groups, orphans, REAP_DELAY_S, plans=self._plans))

    # -- abandoning a dead version -------------------------------------------------------

    def abandon(self, reason: str) -> None:
        """A newer version dropped members of this one as lost: every wait on it ends at once with
        PeerLost, not at gloo's timeout (gloo cannot abort a collective: see ``leave_behind``)."""
        with self._lock:
            if self._abandoned is not None:
                return
            self._abandoned = reason
            waiters, self._waiters = list(self._waiters), set()
        log.info("%s %s: collectives still waiting on this version are abandoned", self._where(), reason)
        for woken in waiters:
            woken.set()

    @property
    def abandoned(self) -> str | None:
        return self._abandoned

    def waiting_for(self) -> float:
        """Seconds this worker has been waiting for a collective of this version (0: not waiting)."""
        since = self._waiting_since
        return 0.0 if since is None else time.monotonic() - since

    def wait_unless_abandoned(self, work: Any, sliced: bool = True) -> bool:
        """Block until ``work`` ends (True) or this version is abandoned first (False). ``sliced``:
        a gloo Work, waited in short slices of its own condition variable (no cost when it ends);
        else (a PlanWork; an NCCL Work, whose timed wait may abort it) a callback wakes an event."""
        self._waiting_since = time.monotonic()
        try:
            return self._wait_unless_abandoned(work, sliced)
        finally:
            self._waiting_since = None

    def _wait_unless_abandoned(self, work: Any, sliced: bool) -> bool:
        if sliced and not isinstance(work, PlanWork):
            while True:
                try:
                    work.wait(_ABANDON_SLICE)
                    return True
                except RuntimeError:
                    if work.is_completed():  # it failed: the caller's wait() raises its error
                        return True
                if self._abandoned is not None:  # (the slice ran out)
                    return False
        woken, ended = threading.Event(), threading.Event()
        with self._lock:
            if self._abandoned is not None:
                return work.is_completed()
            self._waiters.add(woken)

        def end() -> None:  # (a gloo future ends a moment before its Work says it is completed)
            ended.set()
            woken.set()

        try:
            when_done(work, end)
            woken.wait()
        finally:
            with self._lock:
                self._waiters.discard(woken)
        return ended.is_set() or work.is_completed()

    def leave_behind(self, pending: Pending) -> None:
        """An abandoned collective: never destroyed (no thread waits for gloo's timeout to end it)."""
        work, pending.work = pending.work, None
        if work is not None:
            keep_forever(work)

    def abandoned_error(self, op: str, channel: str) -> PeerLost:
        return PeerLost(
            f"{self._where()} {op} on channel '{channel}' abandoned: {self._abandoned}. "
            "The survivors retry the step in the new version.",
            channel=channel,
            op=op,
            version=self.version,
        )

    # -- errors -----------------------------------------------------------------------

    def _where(self) -> str:
        return comm_where(self)

    def _error(self, exc: BaseException, op: str, channel: str) -> TaijiError:
        return comm_error(self, exc, op, channel)

    # -- debug-mode signature check ---------------------------------------------------

    def _check_signature(self, op: str, tensor: torch.Tensor | None, extra: int = 0) -> None:
        check_signatures(
            self._allgather_raw(signature(op, tensor, extra), _DEBUG_CHANNEL),
            op,
            self._where(),
            self.version,
            _DEBUG_CHANNEL,
        )

    # -- collectives ------------------------------------------------------------------

    def _run(
        self,
        op: str,
        channel: str,
        tensor: torch.Tensor,
        submit: Callable[[Any], Any],
        finish: Callable[[], T],
        async_op: bool,
        extra: int = 0,
        planned: bool = False,
    ) -> T | Handle[T]:
        """``planned``: ``submit`` hands the tensor to a topology plan, which uses groups of its
        own — the channel's group is not needed (nor built)."""
        if self.options.debug and self.size > 1:
            self._check_signature(op, tensor, extra)
        if self.size == 1:
            handle: Handle[T] = Handle(None, finish, self, op, channel)
        else:
            group = None if planned else self._group(channel, tensor.device, op)
            try:
                work = submit(group)
            except RuntimeError as exc:
                raise self._error(exc, op, channel) from exc
            pending = Pending(work)
            del work
            handle = Handle(pending, finish, self, op, channel, sliced=not tensor.is_cuda)
            if async_op:
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._in_flight.add(pending)
                if closed and pending.orphan():  # closed by another thread meanwhile
                    reaper.submit(
                        Teardown(self.version, [group] if group is not None else [], [pending], REAP_DELAY_S)
                    )
        return handle if async_op else handle.wait()

    def allreduce(
        self, tensor: torch.Tensor, op: str = "sum", *, channel: str = "grad", async_op: bool = False
    ) -> torch.Tensor | Handle[torch.Tensor]:
        """Reduce ``tensor`` in place across all workers (``sum``, ``avg``, ``min``, ``max``)."""
        if op not in _REDUCE_OPS:
            raise ConfigError(f"unknown reduce op {op!r}; use one of {sorted(_REDUCE_OPS)}")
        if op == "avg" and not tensor.is_floating_point():
            raise ConfigError(f"allreduce avg needs a floating tensor, got {tensor.dtype}")
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE_OPS[op]
        size = self.size

        def finish() -> torch.Tensor:
            if op == "avg" and size > 1:
                tensor.div_(size)
            return tensor

        planned = channel == "grad" and not self._ring_plan and op in ("sum", "avg") and not tensor.is_cuda
        submit = (
            (lambda g: self._planned(channel, tensor)) if planned else (lambda g: g.allreduce([tensor], opts))
        )
        return self._run(
            "allreduce",
            channel,
            tensor,
            submit,
            finish,
            async_op,
            extra=list(_REDUCE_OPS).index(op),
            planned=planned,
        )

    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, *, channel: str = "ctrl", async_op: bool = False
    ) -> torch.Tensor | Handle[torch.Tensor]:
        """Overwrite ``tensor`` on every worker with rank ``src``'s."""
        if not 0 <= src < self.size:
            raise ConfigError(f"broadcast source rank {src} is outside a cluster of size {self.size}")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return self._run(
            "broadcast",
            channel,
            tensor,
            lambda g: g.broadcast([tensor], opts),
            lambda: tensor,
            async_op,
            extra=src,
        )

    def allgather(
        self, tensor: torch.Tensor, *, channel: str = "ctrl", async_op: bool = False
    ) -> list[torch.Tensor] | Handle[list[torch.Tensor]]:
        """Every worker's ``tensor`` (all of equal shape), in rank order."""
        outputs = [torch.empty_like(tensor) for _ in range(self.size)]

        def finish() -> list[torch.Tensor]:
            if self.size == 1:
                outputs[0].copy_(tensor)
            return outputs

        return self._run(
            "allgather", channel, tensor, lambda g: g.allgather([outputs], [tensor]), finish, async_op
        )

    def _allgather_raw(self, tensor: torch.Tensor, channel: str) -> list[torch.Tensor]:
        outputs = [torch.empty_like(tensor) for _ in range(self.size)]
        group = self._group(channel, tensor.device, "allgather")
        try:
            group.allgather([outputs], [tensor]).wait()
        except RuntimeError as exc:
            raise self._error(exc, "allgather", channel) from exc
        return outputs

    def barrier(self, *, channel: str = "ctrl", async_op: bool = False) -> None | Handle[None]:
        """Return once every worker reached this barrier (or raise on timeout / peer loss)."""
        token = torch.zeros(1)
        return self._run(
            "barrier",
            channel,
            token,
            lambda g: g.allreduce([token], dist.AllreduceOptions()),
            lambda: None,
            async_op,
        )

    def consensus(
        self, value: torch.Tensor | bytes | str | int | float, name: str = "value", *, channel: str = "ctrl"
    ) -> None:
        """Raise ConsensusError naming the ranks whose ``value`` differs from rank 0's."""
        if isinstance(value, torch.Tensor):
            digest = tensor_digest([value])
        else:
            raw = value if isinstance(value, bytes) else repr(value).encode()
            digest = hashlib.sha256(raw).digest()
        mine = torch.frombuffer(bytearray(digest), dtype=torch.int64).clone()
        rows = self.allgather(mine, channel=channel)
        assert isinstance(rows, list)
        bad = [r for r, row in enumerate(rows) if not torch.equal(row, rows[0])]
        if bad:
            raise ConsensusError(
                f"{self._where()} workers disagree on {name}: ranks {bad} differ from rank 0 "
                f"(cluster of {self.size}). This is a bug in code that must run identically "
                "on every worker (a policy, a seed, or data-dependent control flow).",
                op="consensus",
                channel=channel,
                version=self.version,
            )
