"""FrameworkLoop: a ``taiji.Job`` driven one step at a time from inside a loop a framework owns.

The framework's loop reads a train loader of **tickets** (``Tickets``): one ticket per global step,
none past the end of an epoch, so the framework's epochs are the Job's. The ticket itself carries no
data: at its training step the framework's code asks the loop for the batch of the Job's current
step (this worker's share of the global batch, for the cluster as it is *now*), runs forward and
``backward(loss)``, and then calls ``finish()``: the step's collectives complete and it commits, or a
peer failed, nothing was committed, the survivors re-formed and ``finish()`` returns False with the
same step begun again over the new cluster — the framework's code runs forward and backward again on
``batch`` (it changed: the share of a smaller cluster). Policies, batch-size changes, resizes and
checkpoints happen inside ``finish()``, at the step boundary, as in a Job's own loop.

A framework that loads one batch ahead (Lightning) asks for the next ticket while the current step
has not run yet: the loop hands it out only if the current step neither ends the epoch nor the job;
a later stop (a policy's ``Stop``) leaves that one ticket without a step (``step`` is None then).

**Checkpoints through the framework's own resume path.** The Job's whole TrainState (where the
data stands, the batch size, the optimizer, the LR scheduler, the policies' and monitors' state)
travels inside the framework's checkpoint (``saved_state``); resuming from that checkpoint loads it
into the new Job before its first step (``FrameworkLoop(resume=...)``), so the sampler continues at
the checkpoint's cursor: every sample of the epoch after the checkpoint's step is trained once.
"""

from __future__ import annotations

import atexit
import gc
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..checkpoint.config import Checkpoint
from ..errors import ConfigError

log = logging.getLogger(__name__)


class Ticket:
    """A place in the framework's train loader; the step's data comes from ``FrameworkLoop.batch``.
    (A plain object, not a dataclass: frameworks walk into dataclasses to move their tensors.)"""

    __slots__ = ("epoch", "ordinal")

    def __init__(self, epoch: int, ordinal: int):
        self.epoch, self.ordinal = epoch, ordinal  # ordinal: the ticket's place in its epoch's loader

    def __repr__(self) -> str:
        return f"Ticket(epoch={self.epoch}, ordinal={self.ordinal})"

    def __contains__(self, key: object) -> bool:  # a framework peeking for "labels" finds none
        return False


class FrameworkLoop:
    """A Job (made by ``make_job`` when training starts, over ``num_samples`` samples, at most
    ``max_steps``) stepped by a framework."""

    def __init__(
        self,
        make_job: Callable[[], Any],
        num_samples: int,
        max_steps: int | None,
        resume: Mapping[str, Any] | None = None,
    ):
        self._make_job = make_job
        self.resume = resume  # taiji's state from a framework's checkpoint (``saved_state``)
        self.job: Any = None
        self.num_samples = num_samples
        self.max_steps = max_steps
        self._steps: Iterator[Any] | None = None
        self.step: Any = None  # the Job's current Step (begun, not yet finished); None when ended
        self.ended = False
        self.handed: int | None = None  # the index of the last step a ticket was handed out for

    @property
    def started(self) -> bool:
        return self._steps is not None

    def start(self) -> None:
        """Join the job (a joiner waits to be admitted), sync the replicas, begin the first step."""
        if self._steps is None:
            self.job = self._make_job()
            if self.resume is not None:
                restore(self.job, self.resume)
            exit_quickly()
            self._steps = iter(self.job)
            self._advance()

    def finish(self) -> bool:
        """Finish the current step: True once it committed (or training ended), False if it failed
        and is begun again over the survivors (run forward and backward again on ``batch``)."""
        assert self.step is not None, "FrameworkLoop.finish() without a step"
        index = self.step.index
        self._advance()
        return self.step is None or self.step.index != index

    def _advance(self) -> None:
        assert self._steps is not None
        try:
            self.step = next(self._steps)
        except StopIteration:
            self.step, self.ended = None, True

    @property
    def batch(self) -> Any:
        assert self.step is not None, "no step: training has ended"
        return self.step.batch

    # -- the framework's train loader -------------------------------------------------------

    def ticket(self, epoch: int | None, ordinal: int) -> Ticket | None:
        """The next ticket of the loader serving ``epoch`` (None: its first read), or None: the epoch
        (or training) ends before the step it would be for."""
        self.start()
        current = self.step
        if current is None:
            return None
        target = current.index if self.handed is None else self.handed + 1
        if target == current.index:  # read as its step comes (no load ahead)
            ok = epoch is None or current.epoch == epoch
        elif target == current.index + 1:  # read one step ahead of its step
            ok = current.span[1] < self.num_samples and (self.max_steps is None or target < self.max_steps)
        else:
            raise ConfigError(
                "the framework read its train loader more than one batch ahead of training; "
                "taiji supports loading at most one batch ahead"
            )
        if not ok:
            return None
        self.handed = target
        return Ticket(current.epoch, ordinal)


class Tickets:
    """The train loader a framework reads: one ``Ticket`` per step of the Job's current epoch. It has
    no length: the epoch's number of steps changes with the batch size."""

    def __init__(self, loop: FrameworkLoop):
        self.loop = loop

    def __iter__(self) -> Iterator[Ticket]:
        epoch: int | None = None
        ordinal = 0
        while True:
            ticket = self.loop.ticket(epoch, ordinal)
            if ticket is None:
                return
            epoch = ticket.epoch
            ordinal += 1
            yield ticket


def step_metrics(job: Any, size: int) -> dict[str, float]:
    """What a framework's logger records of the last committed step: loss over the global batch,
    gradient noise scale, batch size, workers, samples/s (those measured)."""
    stats, gns = job.stats, job.gns
    metrics = {"taiji/batch_size": float(job.progress.sampler.batch_size), "taiji/workers": float(size)}
    if stats is not None and stats.loss is not None:
        metrics["taiji/loss"] = float(stats.loss)
    if gns.b_noise is not None:
        metrics["taiji/gns"] = float(gns.b_noise)
    if job.samples_per_second:
        metrics["taiji/samples_per_s"] = float(job.samples_per_second)
    return metrics


# -- taiji's state inside a framework's checkpoint -------------------------------------------------

STATE_FORMAT = 1


def saved_state(job: Any, size: int) -> dict[str, Any] | None:
    """What a framework's checkpoint carries of taiji's: the Job's state as of its last committed step
    (None before the Job holds state: a joiner not yet synced, no Job yet)."""
    if job is None or not job.has_state:
        return None
    return {"format": STATE_FORMAT, "step": job.progress.step, "size": size, "state": job.state_dict()}


def restore(job: Any, saved: Mapping[str, Any]) -> None:
    """Load ``saved_state`` into a new Job before its first step. A joiner skips it: it gets the
    state of the workers that loaded it when it is admitted."""
    if not job.has_state:
        return
    if saved.get("format") != STATE_FORMAT:
        raise ConfigError(
            f"the checkpoint's taiji state has format {saved.get('format')!r}; this taiji reads "
            f"format {STATE_FORMAT}: resume with the taiji version that wrote it"
        )
    job.load_state_dict(saved["state"])
    log.info(
        "resumed from the framework's checkpoint at step %d (written by %s worker(s))",
        job.progress.step,
        saved.get("size", "?"),
    )


def check_one_resume(faults: Any, source: str) -> None:
    """A framework checkpoint and taiji's own (``Checkpoint(resume=...)``, ``taiji run --resume``)
    would each load the model: refuse both at once rather than mix them."""
    config = Checkpoint.resolve(faults.checkpoint)
    if config is not None and config.resume is not None:
        raise ConfigError(
            f"resume from one checkpoint: {source} and taiji's own ({config.resume!r}, from "
            "taiji.Checkpoint(resume=...) or `taiji run --resume`) were both given"
        )


_exit_handled = False


def exit_quickly() -> None:
    """At this process's exit, collect once (cyclic garbage is still finalized) and freeze what is
    left, so that the interpreter's teardown does not scan every object again and again: with a
    framework loaded (~440k objects) that took 10-15 s on the 2-core VM at load 11-16 (2-3 s with
    the freeze), 2.2-3.0 s at load 2.5 (0.8-1.7 s with the collection and the freeze). Registered
    after ``taiji.init``, it runs before taiji's own exit handler stops the heartbeat: meanwhile the
    launcher still sees the worker alive."""
    global _exit_handled
    if not _exit_handled:
        _exit_handled = True
        atexit.register(_collect_and_freeze)


def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()
