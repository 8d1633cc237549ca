"""Decoupled training for strategies that are not lockstep (pair averaging): each worker runs
at its own pace, claiming batches from a shared counter, and all workers meet only at sync points.

A **phase** runs between two sync points. Its batches are runs of global positions (epoch·N +
offset into that epoch's permutation) claimed with one atomic ``add`` on the job store, so
every position is claimed exactly once however fast each worker is. A worker records the run it
is training (``inflight``) and clears it when the step is committed.

A phase ends (every worker stops claiming and goes to the sync point) when a newer cluster
config is published, a worker asked to stop, the phase consumed ``sync_every`` samples, or the
data budget is used up. At the **sync point** (a collective on the current groups) every worker
reads the final counter, so all agree on the new progress; policies run; then a new phase
starts. The open phase is part of the synced state: a worker that joins at a sync point takes
part in closing it. If a member died during the phase, the survivors recover first; the run it
was training (its ``inflight`` record) is adopted by the new rank 0 and trained first, so no
sample is lost.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Iterator

import torch

from ..data.sampler import position_segments
from ..errors import CommError, StoreError
from ..monitor.stats import StepStats, WorkerReport

if TYPE_CHECKING:
    from .job import Job
    from .step import Step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseState:
    """What every worker agrees on about a phase (synced to joiners while it is open)."""
    index: int
    start: int              # global position where it began
    limit: int              # no position at or beyond this is claimed (data budget)
    mark: int               # a sync point once claims reach this position
    local_batch: int
    members: tuple[str, ...]
    open: bool = True

    def key(self, name: str) -> str:
        return f"decoupled/{self.index}/{name}"


@dataclass
class PhaseRun:
    """This worker's view of a running phase."""
    state: PhaseState
    adopted: list[tuple[int, int]] = field(default_factory=list)
    local_steps: int = 0
    local_samples: int = 0
    ended: bool = False


def plan_phase(job: "Job", index: int) -> PhaseState:
    sampler, n = job.progress.sampler, job.sampler.num_samples
    start = sampler.epoch * n + sampler.cursor
    limit = job.epochs * n
    if job.max_steps is not None:
        limit = min(limit, start + (job.max_steps - job.progress.step) * sampler.batch_size)
    every = job.decoupled_sync_every or n
    return PhaseState(index=index, start=start, limit=limit, mark=min(limit, start + every),
                      local_batch=max(1, math.ceil(sampler.batch_size / job.peer.size)),
                      members=tuple(job.peer.config.ids) if job.peer.config is not None else ("solo",))


class Decoupled:
    """The Job's decoupled mode: phases, claims, sync points."""

    def __init__(self, job: "Job"):
        self.job = job
        self.next_index = 0
        self.open: PhaseState | None = None      # a phase that ended but is not closed yet
        self.adopted: list[tuple[int, int]] = []  # rank 0: runs of departed workers to train first
        self._local_counter = 0                  # without a job store (one worker, no launcher)

    # -- store helpers ------------------------------------------------------------------

    def _add(self, key: str, amount: int) -> int:
        store = self.job.peer.job_store
        if store is None:
            self._local_counter += amount
            return self._local_counter
        return store.add(key, amount)

    def _set(self, key: str, value: str) -> None:
        store = self.job.peer.job_store
        if store is not None:
            store.set(key, value)

    def _flag_raised(self, key: str) -> bool:
        store = self.job.peer.job_store
        return store is not None and store.has(key)

    # -- one phase ------------------------------------------------------------------------

    def run_phase(self) -> Iterator["Step"]:
        job = self.job
        state = plan_phase(job, self.next_index)
        self.next_index += 1
        if state.start >= state.limit:
            return
        run = PhaseRun(state, adopted=self.adopted)
        self.adopted = []
        self.open = state
        if run.adopted:
            self._set(state.key(f"inflight/{job.peer.worker_id}"), json.dumps(run.adopted))
        started = time.perf_counter()
        while True:
            claimed = self._claim(run)
            if claimed is None:
                break
            step = self._make_step(position_segments(*claimed, job.sampler.num_samples), run.local_steps)
            try:
                yield step
            except GeneratorExit:
                job.strategy.abort_step()
                raise
            self._commit(step)
            run.local_steps += 1
            run.local_samples += step.local_batch_size
            self._set(state.key(f"inflight/{job.peer.worker_id}"), json.dumps(run.adopted))
            if self._should_end(run, claimed[1]):
                break
        self._set(state.key("end"), "1")
        if job.peer.rank == 0:
            log.info("decoupled phase %d: %d local steps (%d samples) in %.1fs on rank 0",
                     state.index, run.local_steps, run.local_samples, time.perf_counter() - started)

    def _claim(self, run: PhaseRun) -> tuple[int, int] | None:
        state = run.state
        if run.adopted:
            return run.adopted.pop(0)
        if self._flag_raised(state.key("end")):
            return None
        end = self._add(state.key("pos"), state.local_batch)
        lo, hi = state.start + end - state.local_batch, min(state.start + end, state.limit)
        if lo >= state.limit:
            return None
        self._set(state.key(f"inflight/{self.job.peer.worker_id}"), json.dumps([[lo, hi]] + run.adopted))
        return lo, hi

    def _should_end(self, run: PhaseRun, claimed_to: int) -> bool:
        job = self.job
        if job._stop_requested or claimed_to >= run.state.mark:
            return True
        if job.peer.elastic and job.peer.newer_version_published() > job.peer.version:
            return True
        return self._flag_raised(run.state.key("end"))

    # -- sync point ---------------------------------------------------------------------

    def close_phase(self) -> None:
        """Meet the other workers, agree on the phase's consumption, and advance progress."""
        job = self.job
        state = self.open
        if state is None:
            return
        while True:
            try:
                stats = self._meet()
                consumed = min(self._add(state.key("pos"), 0), state.limit - state.start)
                break
            except (CommError, StoreError) as exc:
                job._recover(exc if isinstance(exc, CommError) else CommError(str(exc)))
        self._adopt_departed(state)
        position = state.start + max(consumed, 0)
        n = job.sampler.num_samples
        epoch, cursor = divmod(position, n)
        self.open = None
        previous_epoch = job.progress.epoch
        job.progress = replace(job.progress, step=job.progress.step + math.ceil(
            max(consumed, 0) / job.progress.sampler.batch_size),
            sampler=replace(job.progress.sampler, epoch=epoch, cursor=cursor))
        job.peer.step = job.progress.step
        job._stop_agreed = job._stop_agreed or stats.stop
        job.adaptation.observe(stats, samples=max(consumed, 0))
        job.reporter.phase_closed(max(consumed, 0), job.adaptation.metrics.step_seconds)
        job._adapt(epoch_ended=job.progress.epoch != previous_epoch)
        if stats.version_seen > job.peer.version:
            job._transition(job.peer.read_config(stats.version_seen), reason="resize")

    def _make_step(self, segments: list[tuple[int, int, int]], local_steps: int) -> "Step":
        from .step import Step
        job = self.job
        indices = indices_of(job, segments)
        index = job.progress.step + local_steps
        job.peer.step = index
        job.strategy.begin_step(1.0, index)
        job.strategy.measure_norms = False
        step = Step(job, index, segments[0][0], job._fetch(indices), indices, (0, len(indices)))
        step.segments = segments
        job._fire("compute")
        return step

    def _commit(self, step: "Step") -> None:
        """A decoupled step commits locally: nothing can fail between workers."""
        job = self.job
        if not step.synchronized:
            job._synchronize(step)
        job.optimizer.step()
        job.strategy.after_update()
        job.optimizer.zero_grad(set_to_none=True)
        if job.lr_scheduler is not None:
            job.lr_scheduler.step()
        if job.on_commit is not None:
            job.on_commit(step)

    def _meet(self) -> "StepStats":
        """The sync point's one collective: every worker's row (version seen, stop, clock,
        decision fingerprint), the same rows everywhere."""
        job = self.job
        seen = job.peer.newer_version_published() if job.peer.elastic else job.peer.version
        report = WorkerReport(version_seen=float(seen), stop=float(job._stop_requested), local_batch=1.0,
                              clock=time.time() if job.peer.rank == 0 else 0.0,
                              decisions=float(job.adaptation.digest))
        rows = [report]
        if job.peer.size > 1:
            gathered = job.peer.comm.allgather(torch.tensor(report.to_row(), dtype=torch.float64), channel="ctrl")
            assert isinstance(gathered, list)
            rows = [WorkerReport.from_row(r.tolist()) for r in gathered]
        stats = StepStats.reduce(rows, None)
        job.adaptation.check(stats.decisions, job.progress.step)
        return stats

    def _adopt_departed(self, state: PhaseState) -> None:
        """Rank 0 takes over the runs that departed workers claimed but never committed."""
        job = self.job
        store = job.peer.job_store
        if store is None or job.peer.rank != 0 or job.peer.config is None:
            return
        current = set(job.peer.config.ids)
        for worker_id in state.members:
            if worker_id in current:
                continue
            try:
                raw = store.get(state.key(f"inflight/{worker_id}")) if store.has(
                    state.key(f"inflight/{worker_id}")) else b"[]"
            except StoreError:
                continue
            runs = [tuple(r) for r in json.loads(raw.decode() or "[]")]
            if runs:
                log.info("adopting %d sample(s) that departed worker %s claimed but did not commit",
                         sum(hi - lo for lo, hi in runs), worker_id)
                self.adopted.extend(runs)  # type: ignore[arg-type]
                store.set(state.key(f"inflight/{worker_id}"), "[]")

    # -- synced state ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"next_index": self.next_index, "open": asdict(self.open) if self.open else None}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = int(state.get("next_index", 0))
        opened = state.get("open")
        self.open = PhaseState(**{**opened, "members": tuple(opened["members"])}) if opened else None


def indices_of(job: "Job", segments: list[tuple[int, int, int]]) -> torch.Tensor:
    return torch.cat([job.sampler.permutation(epoch)[lo:hi] for epoch, lo, hi in segments])


__all__ = ["Decoupled", "PhaseState", "indices_of"]
