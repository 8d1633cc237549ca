"""One global batch (Step) and where training stands (Progress)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..data.sampler import SamplerState
from ..errors import CommError
from ..monitor.stats import StepStats

if TYPE_CHECKING:
    from .job import Job


@dataclass(frozen=True)
class Progress:
    """Where training stands; identical on every replica after each committed step."""
    step: int = 0
    sampler: SamplerState = SamplerState()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def to_json(self) -> dict:
        return {"step": self.step, **asdict(self.sampler)}

    @staticmethod
    def from_json(data: dict) -> "Progress":
        return Progress(step=int(data["step"]), sampler=SamplerState(
            epoch=int(data["epoch"]), cursor=int(data["cursor"]), batch_size=int(data["batch_size"])))


class Step:
    """One global batch: this worker's slice of it, and the way to submit its loss."""

    def __init__(self, job: "Job", index: int, epoch: int, batch: Any, indices: torch.Tensor,
                 span: tuple[int, int]):
        self.job = job
        self.index = index
        self.epoch = epoch
        self.batch = batch
        self.indices = indices
        self.local_batch_size = len(indices)
        self.span = span  # positions [lo, hi) of the epoch's permutation this step consumes
        # decoupled strategies: the (epoch, lo, hi) pieces this worker's batch came from
        self.segments: list[tuple[int, int, int]] = [(epoch, span[0], span[1])]
        self.global_batch_size = span[1] - span[0]
        self.loss: float | None = None
        self.synchronized = False
        self.error: CommError | None = None
        self.started = time.perf_counter()
        self.split_sqnorm: float | None = None  # one worker: mean |g|² of two half-batches
        self.stats: StepStats | None = None     # agreed by all workers once synchronised

    @property
    def failed(self) -> bool:
        return self.error is not None

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` and synchronise gradients.

        ``loss`` is the mean over this worker's slice, or the per-sample losses (a vector, as
        from ``reduction="none"``; their mean is used). Afterwards every worker holds the
        gradient of the mean loss over the global batch. If a peer fails meanwhile this does
        not raise: the step is marked failed and the Job retries it on the surviving workers.
        """
        try:
            if self.local_batch_size > 0:
                if loss.dim() == 1 and self.job._split_for_gns(self):
                    self._split_backward(loss)
                else:
                    loss = loss.mean() if loss.dim() == 1 else loss
                    loss.backward()
                self.loss = float(loss.detach().mean())
            self.job._fire("allreduce")
            self.job._synchronize(self)
        except CommError as exc:
            self.error = self.error or exc

    def _split_backward(self, losses: torch.Tensor) -> None:
        """One worker, per-sample losses: backward the two halves separately so the gradient
        noise scale has two batch sizes to compare (b/2 and b); the summed gradient is the
        same as one backward of the mean."""
        n, half = len(losses), len(losses) // 2
        params = [p for p in self.job.model.parameters() if p.requires_grad]
        with self.job.strategy.no_sync():  # type: ignore[attr-defined]
            (losses[:half].sum() / n).backward(retain_graph=True)
        first = [p.grad.detach().clone() if p.grad is not None else None for p in params]
        (losses[half:].sum() / n).backward()
        sq_a = sq_b = 0.0
        for p, g_a in zip(params, first):
            if p.grad is None or g_a is None:
                continue
            sq_a += float((g_a * (n / half)).square().sum())
            sq_b += float(((p.grad - g_a) * (n / (n - half))).square().sum())
        self.split_sqnorm = (sq_a + sq_b) / 2
