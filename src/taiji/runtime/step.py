"""The user's handle on one global batch (``Step``) and the engine's record of it (``Attempt``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CommError
from ..monitor.stats import StepStats


@dataclass
class Attempt:
    """One try at a step: its data, and what happened to it."""

    index: int
    epoch: int
    batch: Any
    indices: torch.Tensor
    span: tuple[int, int]  # positions [lo, hi) of the epoch's permutation
    segments: list[tuple[int, int, int]]  # (epoch, lo, hi) pieces the batch came from
    global_batch_size: int
    decisions: int = 0  # fingerprint of the decisions taken before this step
    measure: bool = False  # take the gradient norms the monitors need
    carried: bool = False  # the strategy carries this step's control rows
    started: float = field(default_factory=time.perf_counter)
    loss: float | None = None
    split_sqnorm: float | None = None  # one worker: mean |g|² of two half-batches
    error: CommError | None = None
    stats: StepStats | None = None  # agreed by all workers once synchronised
    synchronized: bool = False
    allreduce_wait: float | None = (
        None  # seconds the step waited, after backward, for the gradients' allreduce
    )
    topology: str = ""  # the allreduce plan those gradients went through (comm/topology.py)
    local_samples: int | None = None  # a user's own loop: not its samples (unknown here) but one share

    @property
    def local_batch_size(self) -> int:
        return len(self.indices) if self.local_samples is None else self.local_samples

    @property
    def failed(self) -> bool:
        return self.error is not None


class Step:
    """One global batch: this worker's slice of it, and the way to submit its loss."""

    def __init__(self, attempt: Attempt, submit: Callable[[Attempt, torch.Tensor], None]):
        self._attempt = attempt
        self._submit = submit

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` and synchronise gradients.

        ``loss`` is the mean over this worker's slice, or the per-sample losses (a vector, as
        from ``reduction="none"``; their mean is used). Afterwards every worker holds the
        gradient of the mean loss over the global batch. If a peer fails meanwhile this does
        not raise: the step is marked failed and the Job retries it on the surviving workers.
        While the gradients travel, the next step's batch is loaded (``Job(load_ahead=False)``: not).
        """
        self._submit(self._attempt, loss)

    @property
    def index(self) -> int:
        """This step's index: committed steps before it."""
        return self._attempt.index

    @property
    def epoch(self) -> int:
        """The epoch this step's batch belongs to."""
        return self._attempt.epoch

    @property
    def batch(self) -> Any:
        """This worker's share of the global batch, as the data set's items collated."""
        return self._attempt.batch

    @property
    def indices(self) -> torch.Tensor:
        """The sample indices of this worker's share."""
        return self._attempt.indices

    @property
    def span(self) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the global batch in the epoch's permutation."""
        return self._attempt.span

    @property
    def segments(self) -> list[tuple[int, int, int]]:
        """The ``(epoch, lo, hi)`` pieces this worker's share came from."""
        return self._attempt.segments

    @property
    def local_batch_size(self) -> int:
        """Samples in this worker's share."""
        return self._attempt.local_batch_size

    @property
    def global_batch_size(self) -> int:
        """Samples in the global batch (all workers)."""
        return self._attempt.global_batch_size

    @property
    def loss(self) -> float | None:
        """This worker's loss for the step, once ``backward`` ran."""
        return self._attempt.loss

    @property
    def stats(self) -> StepStats | None:
        """The step's statistics agreed by every worker, once synchronised."""
        return self._attempt.stats

    @property
    def failed(self) -> bool:
        """Whether a collective of this step failed (nothing is committed; the step is retried)."""
        return self._attempt.failed
