"""Liveness: a heartbeat that tells the launcher this worker's process is running, and the watch
by which a worker exits when its launcher dies (``watch_launcher``).

A collective that waits on a peer cannot tell a peer that is *stuck* (SIGSTOPped, frozen, its
host gone) from one that is *busy* (an evaluation on rank 0 between epochs, a checkpoint). The
heartbeat can: a thread bumps this worker's counter every ``interval`` seconds in a file on its
host (cluster/beats.py), which the launcher or agent that started it reads and sums up, one
record per host, for the controller. It keeps beating while the training thread runs user code
for minutes, and stops when the process stops. The controller (cluster/controller.py) judges
the counts: a stale heartbeat is a hang, a fresh one is busy.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from pathlib import Path

from .. import env
from ..cluster.beats import BeatSink, LocalBeats

log = logging.getLogger(__name__)

LATE_S = 1.0  # a beat this late is said (the launcher's --liveness-timeout is 2 s or more)


class Heartbeat:
    def __init__(self, sink: BeatSink, worker_id: str, interval: float):
        if interval <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval}")
        self.sink = sink
        self.worker_id = worker_id
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taiji-heartbeat", daemon=True)

    @staticmethod
    def on_this_host(worker_id: str, interval: float) -> Heartbeat | None:
        """Started, beating into the file its launcher or agent reads (``TAIJI_BEAT_DIR``); None
        where nothing reads one (a worker no taiji launcher started)."""
        where = env.BEAT_DIR.get()
        return Heartbeat(LocalBeats(Path(where)), worker_id, interval).start() if where else None

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        count, due = 0, time.monotonic()
        while True:
            count += 1
            began = time.monotonic()
            try:
                self.sink.beat(self.worker_id, count)
            except OSError:
                # the launcher is gone (its beat directory with it): the launcher watch (or the next
                # collective) ends this worker; a heartbeat that cannot be delivered has nothing else to do
                log.debug("heartbeat of worker %s not delivered", self.worker_id)
            self._say_if_late(began - due, time.monotonic() - began)
            due = time.monotonic() + self.interval
            if self._stopped.wait(self.interval):
                return

    def _say_if_late(self, started_late: float, took: float) -> None:
        """A beat far behind its time makes the launcher take this worker for frozen: say why."""
        if max(started_late, took) > LATE_S:
            log.warning(
                "worker %s: a heartbeat went out %.2fs late (%s)",
                self.worker_id,
                started_late + took,
                f"its write took {took:.2f}s"
                if took > started_late
                else f"this thread ran {started_late:.2f}s late: the host is overloaded, or the process held "
                "Python's lock that long",
            )

    def stop(self) -> None:
        """Stop and join: a thread still inside a call at interpreter exit can abort the process."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(self.interval * 4, 1.0))


def _exit_with_own_children() -> None:
    # the launcher starts each worker as the leader of its own process group: take the
    # worker's children (data-loader processes, ...) down with it
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def watch_launcher(pid: int) -> None:
    """Exit this worker (and its children) when the launcher dies: nothing outlives its job."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    if fd is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _exit_with_own_children()
        return  # no pidfd support: rely on the launcher's parent-death signal

    def wait() -> None:
        select.select([fd], [], [])
        log.error("the launcher (pid %d) died; this worker exits so that nothing is orphaned", pid)
        _exit_with_own_children()

    threading.Thread(target=wait, name="taiji-launcher-watch", daemon=True).start()
