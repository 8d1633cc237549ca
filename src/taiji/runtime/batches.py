"""Batches: a Job's data for each attempt — this worker's share of the global batch, and the next one.

``attempt`` cuts this worker's share of the next global batch out of the epoch's permutation
(``ElasticSampler``) and loads it (``BatchFetcher``); it also guesses the share the step after will
ask for if nothing changes at the boundary, so that ``load_ahead`` can load it while the step's
allreduce is in flight (the engine calls it there): loading hides in a wait the worker would spend
idle. A guess the boundary proves wrong (a new batch size, a new cluster) is dropped
(``drop_ahead``); none is made across an epoch's end, where users change their data set (a new
epoch's augmentation), nor past ``max_steps``. ``claimed`` loads the runs a decoupled worker
claimed. A loop the user writes (``taiji.Optimizer``) has no Batches: its data is the user's.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from ..cluster.spec import ClusterView
from ..data.fetch import BatchFetcher
from ..data.sampler import ElasticSampler, advance, global_span
from .state import Progress
from .step import Attempt


class LoadsAhead(Protocol):
    """What the engine asks of its data while a step's gradients travel, and when an attempt fails."""

    def load_ahead(self) -> float: ...  # load the next step's share now; the seconds it took

    def drop_ahead(self) -> None: ...  # the retry reads the same batch, not the next one


class NothingAhead:
    """The data of a loop the user writes: nothing is loaded by taiji."""

    def load_ahead(self) -> float:
        return 0.0

    def drop_ahead(self) -> None:
        pass


class Batches:
    """This worker's share of each global batch (see module doc)."""

    def __init__(self, fetch: BatchFetcher, sampler: ElasticSampler, max_steps: int | None):
        self.fetch = fetch
        self.sampler = sampler
        self.max_steps = max_steps  # no batch is loaded ahead for the step after the last
        self._next_share: tuple[int, int, int] | None = None  # the guess for the next step

    @property
    def num_samples(self) -> int:
        return self.sampler.num_samples

    def attempt(self, progress: Progress, view: ClusterView, decisions: int) -> Attempt:
        """An attempt at step ``progress.step`` over this worker's share, its batch loaded."""
        sampler = self.sampler
        lo, hi = global_span(progress.sampler, sampler.num_samples)
        share = sampler.local_share(progress.sampler, view.rank, view.size)
        indices = sampler.indices_of(share)
        batch = self.fetch(indices, key=share)
        after = advance(progress.sampler, hi - lo, sampler.num_samples)
        last = self.max_steps is not None and progress.step + 1 >= self.max_steps
        self._next_share = (
            sampler.local_share(after, view.rank, view.size)
            if after.epoch == progress.epoch and not last
            else None
        )
        return Attempt(
            progress.step,
            progress.epoch,
            batch,
            indices,
            (lo, hi),
            [(progress.epoch, lo, hi)],
            hi - lo,
            decisions=decisions,
        )

    def claimed(self, segments: list[tuple[int, int, int]], index: int) -> Attempt:
        """A decoupled step's attempt over the runs (epoch, lo, hi) this worker claimed."""
        indices = torch.cat([self.sampler.permutation(epoch)[lo:hi] for epoch, lo, hi in segments])
        batch = self.fetch(indices)
        return Attempt(index, segments[0][0], batch, indices, (0, len(indices)), segments, len(indices))

    def reach(self, segments: list[tuple[int, int, int]]) -> int:
        """The global position (epoch·N + offset) just past the furthest claimed run."""
        return max(epoch * self.sampler.num_samples + hi for epoch, _, hi in segments)

    def load_ahead(self) -> float:
        if self._next_share is None or not self.fetch.ahead:  # (load_ahead=False: nothing)
            return 0.0
        started = time.perf_counter()
        self.fetch.fetch_ahead(self._next_share, self.sampler.indices_of(self._next_share))
        self._next_share = None
        return time.perf_counter() - started

    def drop_ahead(self) -> None:
        self.fetch.drop_ahead()
        self._next_share = None
