"""Transitions: the one path by which a worker moves between cluster versions.

``enter``: a joiner waits to be admitted; then every worker syncs (forced: replicas may have been
initialised differently). ``to(config)``: switch groups, sync the TrainState from the most
advanced replica, tell the Job. ``recover(error)``: a collective failed and nothing was committed:
report it to the launcher, wait for its next config, then ``to`` it — the retried step runs over
the survivors. If a sync fails too, the same report → wait → switch repeats.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import NoReturn

from ..cluster.spec import ClusterConfig
from ..errors import CommError
from .membership import Membership
from .peer import Member
from .phases import PhaseClock
from .reporting import Event, Paused, Reporter
from .state import TrainState

log = logging.getLogger(__name__)


class LeftCluster(Exception):
    """This worker is not a member of the new version: it leaves the job (exit 0)."""


def leave() -> NoReturn:
    """This worker left the job (``LeftCluster``): exit 0. The objects alive now are frozen first,
    so the interpreter's exit does not scan them all again: with torch loaded that is ~300k
    objects, seconds on a busy host, during which a host being drained still counts as in use."""
    gc.freeze()
    raise SystemExit(0)


class Transitions:
    def __init__(
        self,
        peer: Member,
        membership: Membership,
        state: TrainState,
        reporter: Reporter,
        fire: Callable[[str, int], None],
        recovery_timeout: float,
        changed: Callable[[], None],
    ):
        self.peer = peer
        self.membership = membership
        self.state = state
        self.reporter = reporter
        self.fire = fire
        self.recovery_timeout = recovery_timeout
        self.changed = changed  # the Job's reaction to a new version (strategy, views)
        self.records: list[dict] = []  # what each change cost (for tests and benchmarks)

    def enter(self) -> None:
        """Join (a joiner), build the groups and sync; the run log's ``start`` event, with the
        seconds each took (``phases``: ``admitted``, ``groups``, ``sync``)."""
        phases = PhaseClock(time.perf_counter())
        if not self.peer.joined:
            self.fire("boot", self.state.progress.step)
            self.peer.transition(self.membership.join(self.recovery_timeout))
            view = self.peer.view
            log.info(
                "joined the job as rank %d of %d (v%d) after %.2fs at the door",
                view.rank,
                view.size,
                view.version,
                phases.mark("admitted") - phases.started,
            )
        self.sync(force=True, phases=phases)
        view, progress = self.peer.view, self.state.progress
        self.reporter.on(
            Event(
                "start",
                progress.step,
                {
                    "size": view.size,
                    "version": view.version,
                    "hosts": view.per_host,
                    "batch_size": progress.sampler.batch_size,
                    "phases": phases.rounded(),
                },
            )
        )

    def to(
        self,
        config: ClusterConfig,
        reason: str,
        started: float | None = None,
        phases: PhaseClock | None = None,
    ) -> None:
        phases = phases or PhaseClock(time.perf_counter() if started is None else started)
        before = self.peer.view
        self._switch(config)
        switched = phases.mark("switch")
        self.sync(force=False, phases=phases)
        finished, started = phases.last, phases.started
        after = self.peer.view
        step = self.state.progress.step
        record = {
            "reason": reason,
            "from_version": before.version,
            "to_version": after.version,
            "from_size": before.size,
            "to_size": after.size,
            "step": step,
            "switch_s": switched - started,
            "sync_s": finished - switched,
            "total_s": finished - started,
            "phases": phases.seconds,
        }
        self.records.append(record)
        if reason == "failure":
            self.reporter.on(
                Event(
                    "failure",
                    step,
                    {
                        "time": time.time() - (finished - started),
                        "size": before.size,
                        "version": before.version,
                    },
                )
            )
            self.reporter.on(
                Event(
                    "recovery",
                    step,
                    {
                        "size": after.size,
                        "version": after.version,
                        "hosts": after.per_host,
                        "seconds": record["total_s"],
                        "phases": phases.rounded(),
                    },
                )
            )
        else:
            self.reporter.on(
                Event(
                    "resize",
                    step,
                    {
                        "size": after.size,
                        "from_size": before.size,
                        "hosts": after.per_host,
                        "version": after.version,
                        "seconds": record["total_s"],
                        "phases": phases.rounded(),
                    },
                )
            )
        self.reporter.on(Paused(transition=True))
        log.info(
            "cluster v%d -> v%d (%s): %d -> %d workers at step %d in %.3fs (%s)",
            before.version,
            after.version,
            reason,
            before.size,
            after.size,
            step,
            finished - started,
            phases,
        )

    def recover(self, error: BaseException | None, since: float | None = None) -> None:
        """A collective failed: nothing was committed here. Move to the launcher's next config.
        ``since``: when the failed attempt began (perf_counter): training stood still from then
        on, and that is the recovery time recorded."""
        phases = PhaseClock(time.perf_counter() if since is None else since)
        phases.mark("failed")
        log.warning(
            "step %d failed (%s); waiting for a new cluster config",
            self.state.progress.step,
            str(error).split(". ")[0] if error else "collective failed",
        )
        config = self._next_config()
        phases.mark("config")
        self.to(config, reason="failure", phases=phases)

    def sync(self, force: bool, phases: PhaseClock | None = None) -> None:
        """Build the current version's groups and sync the TrainState on them; while that fails,
        recover and try again."""
        while True:
            try:
                if not force:
                    self.fire("sync", self.state.progress.step)
                self.peer.comm.connect()
                if phases is not None:
                    phases.mark("groups")
                self.state.sync(self.peer.comm, force=force)
                break
            except CommError as exc:
                log.warning(
                    "state sync failed (%s); waiting for a new cluster config", str(exc).split(". ")[0]
                )
                self._switch(self._next_config())
        if phases is not None:
            phases.mark("sync")
        self.peer.at_step(self.state.progress.step)
        self.membership.watch()
        self.changed()

    def _next_config(self) -> ClusterConfig:
        self.membership.report_failure()
        return self.membership.wait_for_newer(self.recovery_timeout)

    def _switch(self, config: ClusterConfig) -> None:
        if not self.peer.transition(config):
            log.info(
                "not a member of cluster v%d: leaving at step %d", config.version, self.state.progress.step
            )
            raise LeftCluster(config.version)
