"""Tearing closed cluster versions' process groups down, on one background thread.

Used by comm/communicator.py: ``close()`` hands a version's groups and its collectives still in
flight to the reaper, which destroys them a moment later.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import sys
import threading
import time
from typing import Any

# -- tearing closed versions down ---------------------------------------------------------
#
# Destroying a gloo group closes its connections and joins its worker threads (~10 ms per
# peer and channel), so close() leaves it to one background thread. That thread is the only
# place where a closed version's C++ objects die, and it must never be destroying one when
# the interpreter starts finalizing: torch's bindings release the GIL around the C++
# destructor of a ProcessGroup (and of a Work), and a non-main thread that re-takes the GIL
# once finalization has begun is ended by CPython with pthread_exit(). Its forced unwind
# runs into the noexcept pybind11 destructor that was re-taking the GIL, and the process dies
# with "terminate called without an active exception" (SIGABRT, exit 134). So the reaper is
# drained and joined at exit (atexit runs before finalization starts), and anything closed
# after that is destroyed on the closing thread itself.


def keep_forever(*objects: Any) -> None:
    """Never destroy ``objects``: a gloo group (or its Work) whose collective is stuck on a peer that
    is gone for good cannot be aborted, and destroying it waits for that collective's timeout (a
    minute by default) — on the reaper, and at exit. An abandoned version's few objects are kept
    instead, for the life of the process; its gloo threads go idle once the timeout ends the
    collective."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class Pending:
    """An asynchronous collective's Work, shared by its Handle and its communicator: when the
    communicator closes first, the reaper takes it over (``orphaned``), waits for it and keeps
    how it ended for a late ``Handle.wait()``."""

    __slots__ = ("work", "orphaned", "done", "error", "__weakref__")

    def __init__(self, work: Any):
        self.work = work
        self.orphaned = False
        self.done: threading.Event | None = None
        self.error: BaseException | None = None

    def orphan(self) -> bool:
        if self.work is None or self.orphaned:
            return False
        self.done = threading.Event()
        self.orphaned = True
        return True

    def settle(self) -> None:
        work = self.work
        try:
            if work is not None:
                work.wait()
        except Exception as exc:  # noqa: BLE001 - kept for a late waiter, never raised here
            self.error = exc
        finally:
            self.work = work = None
            assert self.done is not None
            self.done.set()


class Teardown:
    """One closed version's groups and its collectives still in flight."""

    def __init__(
        self, version: int, groups: list[Any], pending: list[Pending], delay: float, plans: Any = None
    ):
        self.version = version
        self.groups = groups
        self.pending = pending
        self.due = time.monotonic() + delay
        self.plans = plans  # the version's plan thread (comm/topology.py PlanRunner), closed already

    def run(self) -> None:
        if self.plans is not None:
            self.plans.join()  # its plans end fast once the groups are aborted
            self.plans = None
        # A Work holds its group's gloo context (the connections): wait for each collective
        # still in flight and let go of its Work first, so that every C++ object of the version
        # dies here, never on whichever thread happens to drop the last Handle.
        for pending in self.pending:
            pending.settle()
        self.pending = []
        while self.groups:
            self.groups.pop()  # the last reference: waits for its queued work, joins its threads


class Reaper:
    """The one thread that destroys closed versions' groups, a delay after their close()."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[Teardown] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False  # drain() in progress: the closing thread destroys its own
        self._exiting = False  # past the exit hook: no background destruction any more

    def submit(self, teardown: Teardown) -> None:
        with self._cond:
            inline = self._stopping or self._exiting or sys.is_finalizing()
            if not inline:
                if self._thread is None or not self._thread.is_alive():
                    thread = threading.Thread(target=self._run, name="taiji-comm-reaper", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError:  # "can't create new thread at interpreter shutdown"
                        thread, inline = None, True
                    self._thread = thread
                if not inline:
                    self._queue.append(teardown)
                    self._cond.notify_all()
        if inline:
            teardown.run()

    def _run(self) -> None:
        with self._cond:
            while self._queue or not self._stopping:
                wait_s = self._queue[0].due - time.monotonic() if self._queue else None
                if wait_s is None or (wait_s > 0 and not self._stopping):
                    self._cond.wait(wait_s)
                    continue
                teardown = self._queue.popleft()
                self._cond.release()
                try:
                    teardown.run()
                finally:
                    del teardown
                    self._cond.acquire()
            self._thread = None

    def drain(self, exiting: bool = False) -> None:
        """Destroy everything closed so far, now, and end the thread (a later close() starts
        another one unless ``exiting``)."""
        with self._cond:
            self._stopping = True
            self._exiting = self._exiting or exiting
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._cond:
            self._stopping = False
            leftovers = list(self._queue) if self._thread is None or not self._thread.is_alive() else []
            if leftovers:
                self._queue.clear()
        for teardown in leftovers:  # the thread is gone without running them (after a fork)
            teardown.run()


reaper = Reaper()


def reap_closed_groups() -> None:
    """Destroy closed versions' groups now and end the background reaper. Runs at exit by
    itself; calling it earlier is harmless (a later close() starts a new reaper)."""
    reaper.drain()


@atexit.register  # at import: so it runs after the exit hooks registered later (Peer's)
def _reap_at_exit() -> None:
    reaper.drain(exiting=True)
