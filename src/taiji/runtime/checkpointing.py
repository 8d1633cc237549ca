"""The Job's durable state: when to checkpoint, what goes in, resuming, and preemption notices.

After each committed step (or closed decoupled phase) every worker evaluates the same pure rule
(``checkpoint.config.due``) on agreed values — the committed step and rank 0's clock from the
step's control message — so all checkpoint at the same boundary without a message of their own.
Each worker stages only the tensors ``assign`` gives it (replicated state is written once in
all) and writes them in the background; the lowest rank adds the manifest. A SIGTERM asks the
job to stop at the next step boundary, where the final checkpoint is taken.

Where replicas are exact (SyncSGD), parameters and optimizer state change only at the next
optimizer update or a sync: those tensors are staged by the writer thread while the next step's
forward and backward run, and the update (an optimizer step pre-hook) or sync (a TrainState guard)
first waits for them (``settle``). The rest (buffers, which a forward changes; small state) is
staged at the boundary. ``Checkpoint(overlap=False)`` stages everything at the boundary.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .. import env
from ..checkpoint.config import NOTICE_SIGNAL, Checkpoint, due
from ..checkpoint.layout import (
    FORMAT,
    Manifest,
    assign,
    checkpoint_name,
    rng_key,
    taiji_version,
    tensor_keys,
    to_prune,
)
from ..checkpoint.reader import Found, find, load_into, model_info
from ..checkpoint.storage import Storage
from ..checkpoint.writer import SaveRecord, Writer, until_update
from ..comm.transfer import encode
from .peer import Member
from .reporting import Event, Reporter
from .state import TrainState

log = logging.getLogger(__name__)


def rng_state() -> tuple[torch.Tensor, int]:
    """This process's random streams as one byte tensor, and how many of its bytes are the CUDA
    generator's: torch's CPU generator, then (where the job has initialised CUDA) the current
    device's, which dropout on a GPU draws from."""
    cpu = torch.get_rng_state()
    if not torch.cuda.is_initialized():  # a CPU job: CUDA is never initialised for it
        return cpu, 0
    cuda = torch.cuda.get_rng_state()
    return torch.cat([cpu, cuda]), cuda.numel()


def set_rng_state(state: torch.Tensor, cuda_bytes: int) -> None:
    """Restore ``rng_state``'s streams; a CUDA stream saved by a job resumed without CUDA (or
    the reverse) is left as it is."""
    torch.set_rng_state(state[: state.numel() - cuda_bytes].clone())
    if cuda_bytes and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state[state.numel() - cuda_bytes :].clone())


class Checkpointer:
    """Checkpoints of one Job (see module doc); ``config`` None: none are taken."""

    def __init__(
        self,
        config: Checkpoint | None,
        state: TrainState,
        peer: Member,
        exact: Callable[[], bool],
        request_stop: Callable[[], None],
    ):
        self.config = config
        self.state = state
        self.peer = peer
        self.exact = exact
        self.request_stop = request_stop
        self.storage = Storage(config.path) if config is not None and config.saves else None
        if self.storage is not None:
            self.storage.check_writable()
        self.writer = Writer(self.storage, after_write=self._prune) if self.storage is not None else None
        self.records: list[SaveRecord] = []
        self._unsettled: tuple[SaveRecord, int] | None = (
            None  # a save (and its parts) whose staging may still run
        )
        self._hook = None
        if self.writer is not None and config is not None and config.overlap:
            self._hook = state.optimizer.register_step_pre_hook(lambda *args: self.settle())
            state.guard(self.settle)
        self.resumed: Found | None = None
        self.load_seconds = 0.0  # how long the resume's load took (find, read, check, load)
        self._last_step, self._last_clock = -1, None
        self._clock = time.time()  # the last agreed clock (rank 0's, from the control message)
        self._previous_handler: Any = None
        self._notice = signal.SIGTERM
        self._reporter: Reporter | None = None

    # -- resuming ----------------------------------------------------------------------------

    def resume(self) -> None:
        """Load the checkpoint ``config.resume`` names (a worker with state, before the loop)."""
        config = self.config
        if config is None or config.resume is None or not self.state.has_state:
            return  # a joiner gets its state from its peers
        path, began = config.path if config.resume == "auto" else config.resume, time.perf_counter()
        found = find(path, missing_ok=config.resume == "auto")
        if found is None:
            log.info("no complete checkpoint in %s yet: starting fresh", path)
            return
        rng: dict[str, torch.Tensor] = {}
        self.state.load_state_dict(load_into(found, self.state.model, rng))
        mine = rng.get(rng_key(self.peer.view.rank))
        if mine is not None and found.manifest.size == self.peer.view.size:
            # the same rank's random streams continue (dropout, ...)
            set_rng_state(mine, int(found.manifest.extra.get("cuda_rng_bytes", 0)))
        self._last_step, self.resumed, self.load_seconds = found.step, found, time.perf_counter() - began
        log.info(
            "resumed from %s (step %d, written by %d worker(s)) in %.3fs",
            found.url,
            found.step,
            found.manifest.size,
            self.load_seconds,
        )

    def start(self, reporter: Reporter) -> None:
        """The loop starts: record the resume (if any), listen for preemption notices."""
        self._reporter = reporter
        found = self.resumed
        if found is not None:
            # how far the lost run got, from its own records in this run directory (to within
            # its metrics interval): the steps this run trains again
            reached = reporter.recorded_step()
            redone = (
                {}
                if reached is None
                else {"lost_run_step": reached, "steps_redone": max(0, reached - found.step)}
            )
            reporter.on(
                Event(
                    "resume",
                    found.step,
                    {
                        "checkpoint": found.url,
                        "written_by": found.manifest.size,
                        "size": self.peer.view.size,
                        "epoch": self.state.progress.epoch,
                        "load_s": round(self.load_seconds, 4),
                        **redone,
                    },
                )
            )
        self.listen_for_notice()

    # -- saving ------------------------------------------------------------------------------

    def committed(self, clock: float) -> None:
        """After a committed step (or a closed phase): checkpoint if the schedule says so."""
        if self.writer is None:
            return
        assert self.config is not None
        self._clock = clock
        if self._last_clock is None:
            self._last_clock = clock
        if due(self.state.progress.step, clock, self._last_step, self._last_clock, self.config.interval):
            self.save(clock)

    def ended(self) -> None:
        """Training stopped (every worker at the same boundary): the final checkpoint (staged
        now: no update follows to overlap it with, and its event precedes the run's end)."""
        if (
            self.writer is not None
            and self.config is not None
            and self.config.final
            and self.state.progress.step > self._last_step
        ):
            self.save()
        self.settle()

    def save(self, clock: float | None = None) -> SaveRecord:
        """Checkpoint now (every worker at the same boundary), stamped with the last agreed clock.
        The record (and the run log's event) comes once its staging is done (``settle``)."""
        assert self.writer is not None
        self.settle()
        clock = self._clock if clock is None else clock
        view, step = self.peer.view, self.state.progress.step
        tensors: list[torch.Tensor] = []
        image = encode(self.state.state_dict(), tensors)
        model = self.state.model.state_dict()
        everything = tensor_keys(model, tensors)
        writers = view.size if self.exact() else 1  # replicas differ: the lowest rank writes all
        owners = assign({k: t.numel() * t.element_size() for k, t in everything.items()}, writers)
        owners.update({rng_key(r): r for r in range(writers)})
        mine = {k: t for k, t in everything.items() if owners[k] == view.rank}
        mine[rng_key(view.rank)], cuda_rng_bytes = rng_state()
        manifest = None
        if view.rank == 0:
            manifest = Manifest(
                format=FORMAT,
                taiji_version=taiji_version(),
                step=step,
                size=view.size,
                time=clock,
                parts=writers,
                model=model_info(self.state.model),
                owners=owners,
                state=image,
                strategy=self.state.strategy,
                extra={
                    "bounds": {"min_np": env.MIN_NP.get(), "max_np": env.MAX_NP.get()},
                    "rng_bytes": mine[rng_key(view.rank)].numel(),
                    "cuda_rng_bytes": cuda_rng_bytes,
                    "version": view.version,
                    "epoch": self.state.progress.epoch,
                },
            )
        later: dict[str, torch.Tensor] = {}
        if self._hook is not None and self.exact():  # else replicas drift: averaging may change them first
            mine, later = until_update(mine, self.state.optimizer)
        record = (
            self.writer.save(step, view.rank, mine, manifest, later)
            if view.rank < writers
            else SaveRecord(step, 0.0, 0)
        )
        self._last_step, self._last_clock = step, clock
        self._unsettled = (record, writers)
        if not later:
            self.settle()
        return record

    def settle(self) -> None:
        """Before the state changes: the last save's overlapped staging is done; its record."""
        unsettled, self._unsettled = self._unsettled, None
        if unsettled is None or self.writer is None:
            return
        record, writers = unsettled
        record = replace(record, stall_seconds=record.stall_seconds + self.writer.settle())
        self.records.append(record)
        if self._reporter is not None:  # the run log's checkpoint event; the metrics' stall and time
            self._reporter.on(
                Event(
                    "checkpoint",
                    record.step,
                    {
                        "stall_s": round(record.stall_seconds, 4),
                        "staged_bytes": record.staged_bytes,
                        "overlapped_bytes": record.overlapped_bytes,
                        "parts": writers,
                    },
                )
            )
        if self.peer.view.rank == 0:
            log.info(
                "checkpoint at step %d: staged in %.3fs, writing to %s in the background",
                record.step,
                record.stall_seconds,
                self.storage.url_of(checkpoint_name(record.step)) if self.storage else "",
            )

    def _prune(self, step: int) -> None:
        if self.storage is None or self.config is None or self.peer.view.rank != 0:
            return
        for old in to_prune(self.storage.listing(), self.config.keep, in_flight=(step,)):
            self.storage.remove(checkpoint_name(old))

    # -- preemption notices ------------------------------------------------------------------

    def listen_for_notice(self) -> None:
        """A preemption notice: stop at the next step boundary, where the final checkpoint is
        taken. Under `taiji run` the notice is the launcher's SIGUSR1 (a worker's own SIGTERM stays
        a failure the others recover from); in a plain process, SIGTERM. Only with checkpoints,
        and only from the main thread."""
        if self.writer is None or threading.current_thread() is not threading.main_thread():
            return
        signum = NOTICE_SIGNAL if env.JOB_ID.is_set() else signal.SIGTERM

        def notice(received: int, frame: Any) -> None:
            log.warning(
                "%s: stopping at the next step boundary with a final checkpoint in %s",
                signal.Signals(received).name,
                self.config.path if self.config else "",
            )
            self.request_stop()

        self._notice = signum
        self._previous_handler = signal.signal(signum, notice)

    def close(self) -> None:
        """Wait for the write in flight (a checkpoint is complete or invisible, never half)."""
        self.settle()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._previous_handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(self._notice, self._previous_handler)
            self._previous_handler = None
        if self.writer is not None:
            self.writer.wait()
