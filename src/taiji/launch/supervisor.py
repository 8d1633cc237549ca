"""Spawns, watches, signals and reaps this host's worker processes.

Each worker runs in its own session (so a signal can reach its whole process tree) with
a parent-death signal, so it dies with the launcher even if the launcher is SIGKILLed.
Exits are observed through pidfds and signals through a wakeup fd, in one ``select``:
no polling loops.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from .. import env
from ..cluster.beats import LocalBeats
from ..errors import LaunchError

log = logging.getLogger(__name__)
BEAT_DIR = env.BEAT_DIR.name

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_prctl = _libc.prctl


def die_with_parent(parent_pid: int, ignore_sigterm: bool = False) -> None:  # between fork and exec: tiny
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if ignore_sigterm:  # kept across exec
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os._exit(1)


@dataclass
class WorkerProcess:
    worker_id: str
    rank: int
    popen: subprocess.Popen
    pidfd: int
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))
    reader: threading.Thread | None = None
    exit_code: int | None = None
    local_rank: int = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.exit_code is None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Local worker processes with rank-prefixed output and a tail of each one's output.

    Inside a Slurm job (``ignore_sigterm``, by default where ``SLURM_JOB_ID`` is set) workers start
    with SIGTERM ignored: Slurm signals every process of a step at once (scancel --signal, a time
    limit, preemption), and their launcher or agent decides what a notice means (a final
    checkpoint, a planned shrink); ``stop_all`` then ends them with SIGKILL after its grace."""

    def __init__(
        self,
        output: IO[str] | None = None,
        tail_lines: int = 40,
        prefix: str = "",
        ignore_sigterm: bool | None = None,
    ):
        self.ignore_sigterm = env.SLURM_JOB_ID.is_set() if ignore_sigterm is None else ignore_sigterm
        self.output = output or sys.stdout
        self.prefix = prefix  # e.g. the host, when workers of several hosts print to one terminal
        self.tail_lines = tail_lines
        self.workers: dict[str, WorkerProcess] = {}
        self.beats = LocalBeats.create()  # its workers' heartbeat files (cluster/beats.py)
        self._ahead: dict[
            str, tuple
        ] = {}  # started ahead of their spawn: id -> (rank, command, env, local rank)
        self._write_lock = threading.Lock()
        self._reap_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.signals: list[int] = []
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup: int | None = None
        self._output_broken = False

    # -- signals ----------------------------------------------------------------------

    def install_signal_handlers(self, signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        if self._old_handlers:
            return  # installed already (an agent that became its job's controller keeps them)

        def handler(signum, _frame):
            self.signals.append(signum)

        self._old_wakeup = signal.set_wakeup_fd(self._wake_w)
        for signum in signums:
            self._old_handlers[signum] = signal.signal(signum, handler)

    def restore_signal_handlers(self) -> None:
        for signum, old in self._old_handlers.items():
            signal.signal(signum, old)  # type: ignore[arg-type]
        self._old_handlers.clear()
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            self._old_wakeup = None

    # -- processes --------------------------------------------------------------------

    def free_local_rank(self) -> int:
        """The lowest local rank (slot index on this host) no running worker holds (a worker
        started ahead holds none until its spawn adopts it)."""
        taken = {w.local_rank for w in self.running() if w.worker_id not in self._ahead}
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def start_ahead(
        self, worker_id: str, rank: int, command: Sequence[str], env: dict[str, str], local_rank: int = 0
    ) -> WorkerProcess:
        """Start a worker before its spawn is decided (`taiji run` starts its first workers while
        it imports torch to serve the store): ``spawn`` with the same arguments adopts it, any
        other ``spawn`` of that id or ``drop_ahead`` ends it."""
        worker = self._start(worker_id, rank, command, env, local_rank)
        self._ahead[worker_id] = (rank, list(command), dict(env), local_rank)
        return worker

    def drop_ahead(self) -> None:
        """End the workers started ahead that no spawn adopted."""
        for worker_id in list(self._ahead):
            del self._ahead[worker_id]
            self._end(self.workers.pop(worker_id))

    def spawn(
        self, worker_id: str, rank: int, command: Sequence[str], env: dict[str, str], local_rank: int = 0
    ) -> WorkerProcess:
        """Start a worker (or adopt the one started ahead with these very arguments: a worker that
        has exited meanwhile is adopted too, and its exit observed as any other)."""
        ahead = self._ahead.pop(worker_id, None)
        if ahead is not None:
            if ahead == (rank, list(command), dict(env), local_rank):
                log.debug(
                    "adopted worker %s (rank %d), started ahead as pid %d",
                    worker_id,
                    rank,
                    self.workers[worker_id].pid,
                )
                return self.workers[worker_id]
            log.warning(
                "worker %s was started ahead with other arguments than its spawn's: restarting it", worker_id
            )
            self._end(self.workers.pop(worker_id))
        return self._start(worker_id, rank, command, env, local_rank)

    def _end(self, worker: WorkerProcess) -> None:
        if worker.running:
            self._reap(worker)  # SIGKILLs its process group first

    def _start(
        self, worker_id: str, rank: int, command: Sequence[str], env: dict[str, str], local_rank: int
    ) -> WorkerProcess:
        try:
            popen = subprocess.Popen(
                list(command),
                env={**env, BEAT_DIR: str(self.beats.directory)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid(), self.ignore_sigterm),
            )
        except FileNotFoundError:
            raise LaunchError(f"cannot start worker {worker_id}: command not found: {command[0]!r}") from None
        except PermissionError:
            raise LaunchError(f"cannot start worker {worker_id}: {command[0]!r} is not executable") from None
        except OSError as exc:
            raise LaunchError(f"cannot start worker {worker_id} ({command[0]!r}): {exc}") from None
        worker = WorkerProcess(
            worker_id,
            rank,
            popen,
            os.pidfd_open(popen.pid),
            collections.deque(maxlen=self.tail_lines),
            local_rank=local_rank,
        )
        worker.reader = threading.Thread(
            target=self._pump, args=(worker,), name=f"taiji-out-{worker_id}", daemon=True
        )
        worker.reader.start()
        self.workers[worker_id] = worker
        log.debug("spawned worker %s (rank %d) as pid %d", worker_id, rank, popen.pid)
        return worker

    def _pump(self, worker: WorkerProcess) -> None:
        assert worker.popen.stdout is not None
        for raw in iter(worker.popen.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            worker.tail.append(line)
            self.write(f"{self.prefix}rank {worker.rank} | {line}\n")
        worker.popen.stdout.close()

    def running(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.running]

    def wake(self) -> None:
        """End a ``wait`` now (from any thread): something it should look at happened."""
        try:
            os.write(self._wake_w, b"w")
        except (BlockingIOError, OSError):  # a full pipe wakes it anyway; a closed one: nobody waits
            pass

    def wait(self, timeout: float | None = None) -> tuple[list[WorkerProcess], list[int]]:
        """Block until a worker exits or a signal arrives; returns (exited workers, signals)."""
        alive = self.running()
        fds = [w.pidfd for w in alive] + [self._wake_r]
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except OSError:  # another thread reaped one of them meanwhile and closed its pidfd
            readable = []
        exited = []
        with self._reap_lock:  # one reaper per worker: a pidfd is closed once, its exit reported once
            for worker in alive:
                if worker.running and worker.pidfd in readable:
                    self._reap(worker)
                    exited.append(worker)
        if self._wake_r in readable:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        received, self.signals = self.signals, []
        return exited, received

    def _reap(self, worker: WorkerProcess) -> None:
        # Not reaped yet, so its pid (= its process group id) cannot have been reused: kill
        # whatever it left behind in its group (e.g. data-loader processes) before reaping.
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        worker.exit_code = worker.popen.wait()
        os.close(worker.pidfd)
        try:
            os.write(self._wake_w, b"r")  # another thread selecting on that pidfd looks again
        except (BlockingIOError, OSError):
            pass
        if worker.reader is not None:
            worker.reader.join(timeout=5.0)  # drain the last lines before anyone reports them

    def kill(self, worker_id: str) -> None:
        """SIGKILL one worker's process group (its exit is then observed by ``wait``)."""
        worker = self.workers.get(worker_id)
        if worker is not None and worker.running:
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def signal_all(self, signum: int) -> None:
        for worker in self.running():
            try:
                os.killpg(worker.pid, signum)
            except ProcessLookupError:
                pass

    def drain(self, signum: int, timeout: float) -> None:
        """Send ``signum`` to every running worker's own process (not its group: its children keep
        their default actions) and wait up to ``timeout`` for them to exit by themselves."""
        for worker in self.running():
            try:
                os.kill(worker.pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            self.wait(timeout=deadline - time.monotonic())

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every running worker's process group; SIGKILL what is left after ``grace``."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.running():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.signal_all(signal.SIGKILL)
                deadline = time.monotonic() + 10.0
                remaining = 10.0
            self.wait(timeout=remaining)

    def beat_counts(self) -> dict[str, int]:
        """Its running workers' heartbeat counts (0: none yet), read from their files here."""
        return self.beats.counts(w.worker_id for w in self.running())

    def close(self) -> None:
        self.restore_signal_handlers()
        self.beats.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def write(self, text: str) -> None:
        """Write to the launcher's output; if that is gone (e.g. `| head`), keep supervising
        and keep draining workers' pipes, so nothing blocks on a full pipe."""
        with self._write_lock:
            if self._output_broken:
                return
            try:
                self.output.write(text)
                self.output.flush()
            except (OSError, ValueError):
                self._output_broken = True
