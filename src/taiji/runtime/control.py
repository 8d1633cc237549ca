"""The one control message per step (and per sync point): an allgather of one small float64
row per worker on the ``ctrl`` channel.

Every worker sends a ``ControlRow`` (newest config version it knows, stop request, the
monitors' local sums, loss, compute time, decision fingerprint, rank 0's clock) and receives
every worker's row, so all derive the same ``StepStats`` from the same numbers. In a step it
rides in the last gradient bucket where the strategy can carry it (``SupportsCarry``: SyncSGD's
float32 buckets), otherwise it is launched right after the last bucket, overlapping the
allreduce's tail. From ``compact_at`` workers on (``TAIJI_CONTROL_COMPACT_AT``) the message is
compact instead (``monitor.compact``: a sum-allreduce of the sums and a slot per worker), sent on
its own: the sums cannot ride a float32 bucket exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .. import env
from ..comm.communicator import Handle
from ..monitor.compact import agree_compact, compact_above, compact_message
from ..monitor.stats import ControlRow, StepStats
from .membership import Membership
from .peer import Member


@dataclass
class Signals:
    """What this worker asks of the others through the next control message."""

    stop_requested: bool = False


@dataclass(frozen=True)
class Measurements:
    """This worker's part of a step, for its control row."""

    local_batch: float = 0.0
    local_sqnorm: float | None = None
    sqnorm_batch: float = 0.0
    loss: float | None = None
    compute_seconds: float = 0.0
    previous_global_sqnorm: float = math.nan  # this worker's share of it (see ``monitor.monitors``)
    previous_allreduce_wait: float = math.nan
    previous_monitor_seconds: float = math.nan


class PendingControl:
    def __init__(self, handle: Handle | None, own: ControlRow, compact_of: int = 0):
        self._handle = handle
        self._own = own
        self._compact_of = compact_of  # workers of a compact message (0: the rows allgathered)

    def wait(self) -> StepStats:
        """The agreed statistics (raises CommError if a peer failed)."""
        if self._handle is None:
            return StepStats.reduce([self._own], None)
        if self._compact_of:
            return agree_compact(self._handle.wait().numpy(), self._compact_of)
        return agree([r.tolist() for r in self._handle.wait()])


def agree(rows: list[list[float]]) -> StepStats:
    """The statistics every worker derives from every worker's row (rank order)."""
    return StepStats.reduce([ControlRow.from_row(r) for r in rows], None)


class ControlChannel:
    WIDTH = ControlRow.WIDTH  # floats in a row

    def __init__(self, peer: Member, membership: Membership, signals: Signals, compact_at: int | None = None):
        self.peer = peer
        self.membership = membership
        self.signals = signals
        self.compact_at = env.CONTROL_COMPACT_AT.get() if compact_at is None else compact_at
        self._last_sent = 0.0

    @property
    def compact(self) -> bool:
        """Whether this cluster's control message is compact (then no strategy carries it)."""
        return compact_above(self.peer.comm.size, self.compact_at)

    def send(self, decisions: int, measured: Measurements = Measurements()) -> PendingControl:
        """Launch this worker's row; ``wait()`` on the result gives the agreed statistics."""
        report = self._report(decisions, measured)
        comm = self.peer.comm
        if comm.size < 2:
            return PendingControl(None, report)
        if compact_above(comm.size, self.compact_at):
            message = torch.tensor(compact_message(report, comm.rank, comm.size), dtype=torch.float64)
            return PendingControl(
                comm.allreduce(message, "sum", channel="ctrl", async_op=True),  # type: ignore[arg-type]
                report,
                comm.size,
            )
        handle = comm.allgather(
            torch.tensor(report.to_row(), dtype=torch.float64), channel="ctrl", async_op=True
        )
        return PendingControl(handle, report)  # type: ignore[arg-type]

    def row(self, decisions: int, measured: Measurements) -> list[float]:
        """This worker's row, for a strategy to carry (its clock starts over, as ``send``'s)."""
        return self._report(decisions, measured).to_row()

    def meet(self, decisions: int) -> StepStats:
        """A sync point's control message: no measurements (and no step time), just agreement."""
        self.restart_clock()
        pending = self.send(decisions, Measurements(local_batch=1.0))
        self.restart_clock()
        return pending.wait()

    def _report(self, decisions: int, measured: Measurements) -> ControlRow:
        now = time.perf_counter()
        wall, self._last_sent = (now - self._last_sent if self._last_sent else 0.0), now
        view = self.peer.view
        lead = view.rank == 0
        # the newest version any worker reports wins: one worker watching the store is enough
        seen = self.membership.newest_version() if lead else view.version
        return ControlRow(
            version_seen=float(seen),
            stop=float(self.signals.stop_requested),
            local_sqnorm=math.nan if measured.local_sqnorm is None else measured.local_sqnorm,
            sqnorm_batch=measured.sqnorm_batch,
            local_batch=measured.local_batch,
            loss_sum=(measured.loss or 0.0) * measured.local_batch,
            compute_seconds=measured.compute_seconds,
            clock=time.time() if lead else 0.0,
            decisions=float(decisions),
            wall_seconds=wall,
            previous_global_sqnorm=measured.previous_global_sqnorm,
            previous_allreduce_wait=measured.previous_allreduce_wait,
            previous_monitor_seconds=measured.previous_monitor_seconds,
        )

    def restart_clock(self) -> None:
        """A pause (a transition, a sync point) is not a worker's step time."""
        self._last_sent = 0.0
