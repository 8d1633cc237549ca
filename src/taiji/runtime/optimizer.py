"""``taiji.Optimizer``: elastic, fault-tolerant data parallelism for a loop you write yourself.

Wrap your optimizer and model; ``zero_grad`` begins a step (and, the first time, joins the job),
backward sends the gradients as it runs (SyncSGD's buckets), and ``step`` applies the update
**only if every collective of the step succeeded**. If a peer failed, nothing is applied: the
survivors re-form, sync the model and optimizer from the most advanced replica, and ``step``
returns False — your loop retries the batch::

    opt = taiji.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for x, y in my_batches():
        while True:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if opt.step():
                break

Each step is the Job's step (``StepEngine.begin_own``): a tiny control message (one row per worker,
riding in the last gradient bucket) moves all workers to a newer cluster version at the same
step; running statistics (BatchNorm buffers) are averaged every step, so the replicas stay
identical, and put back if the step fails; a worker that was away longer than its peers' collective
timeout (an evaluation) first checks whether they gave up on it, and re-forms with them before the
step begins. Gradients are averaged with equal weights (1/size): give each worker an equal share
of your batch.

``checkpoint=taiji.Checkpoint(path, steps=N)`` (or `taiji run --checkpoint-dir`) checkpoints the
model and optimizer on the same schedule as a Job, and resumes them (``opt.steps`` then says
where your loop stands: your data position is yours to restore); ``opt.save()`` checkpoints now
(every worker calls it after the same step).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from ..checkpoint.config import Checkpoint
from ..errors import CommError, ConfigError
from ..monitor.monitors import Monitors
from ..strategies.sync_sgd import SyncSGD
from .engine import Failed
from .peer import Peer, default_peer
from .reporting import Reporter
from .step import Attempt
from .transitions import LeftCluster, leave
from .worker import Callbacks, WorkerParts

log = logging.getLogger(__name__)


class Optimizer:
    """Elastic, fault-tolerant data parallelism for your own loop: wraps ``optimizer`` and ``model``;
    ``step()`` applies the update only if every worker's collectives succeeded and returns False
    when the batch must be run again."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        *,
        sync: SyncSGD | None = None,
        peer: Peer | None = None,
        recovery_timeout: float | None = None,
        checkpoint: Checkpoint | None = None,
    ):
        self.optimizer, self.model = optimizer, model
        self._peer = peer = peer or default_peer()
        self.sync = (sync or SyncSGD()).attach(model, lambda: peer.comm)
        parts = WorkerParts.build(
            model,
            optimizer,
            self.sync,
            peer,
            callbacks=Callbacks(
                self._cluster_changed, _no_decisions, exact=lambda: True, request_stop=lambda: None
            ),
            monitors=Monitors(every=0),
            reporter=Reporter(None, 0, lead=lambda: False, write_status=lambda status: None),
            clear_grads=False,  # the user's loop clears them itself
            recovery_timeout=recovery_timeout,
            checkpoint=checkpoint,
        )
        self._membership, self._state, self._fire = parts.membership, parts.state, parts.fire
        self._engine, self._transitions, self._durable = parts.engine, parts.transitions, parts.durable
        self._attempt: Attempt | None = None  # the step zero_grad began
        self._entered = False
        self._durable.resume()

    @property
    def steps(self) -> int:
        """Steps committed so far (agreed by every worker)."""
        return self._state.progress.step

    @property
    def transitions(self) -> list[dict]:
        """What each membership change cost (as ``Job.transitions``)."""
        return self._transitions.records

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Begin a step (the first call joins the job and syncs the replicas); a step begun and
        not yet stepped is forgotten."""
        if not self._entered:
            self._leave_if_not_member(self._transitions.enter)
            self._membership.set_training(True)
            self._entered = True
        if self._attempt is not None:
            self._engine.abort(self._attempt)
            self._attempt = None
        self.optimizer.zero_grad(set_to_none=set_to_none)
        while self._attempt is None:
            try:
                self._attempt = self._engine.begin_own(self.steps)
            except CommError as exc:  # the peers gave up on this worker while it was away
                self._leave_if_not_member(functools.partial(self._transitions.recover, exc))

    def step(self) -> bool:
        """Apply the update if the step's collectives all succeeded; else recover and return False
        (run the batch again) — or True if the peers committed the step meanwhile (the sync brought it)."""
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            raise ConfigError(
                "opt.step() without opt.zero_grad() before the backward: zero_grad() begins "
                "each step (it joins the job, and the gradients are sent as backward runs)"
            )
        try:
            self._fire("allreduce", attempt.index)
        except CommError as exc:  # an injected collective failure: this attempt fails, as in the Job
            attempt.error = attempt.error or exc
        outcome = self._engine.finish(attempt)
        if isinstance(outcome, Failed):
            self._leave_if_not_member(lambda: self._transitions.recover(outcome.error))
            return self.steps == attempt.index + 1  # a commit is one fact: adopted, as its peers made it
        self._state.count_step()
        self._durable.committed(outcome.stats.clock)
        if outcome.newest_version > self._peer.view.version:
            config = self._membership.read_config(outcome.newest_version)
            self._leave_if_not_member(lambda: self._transitions.to(config, reason="resize"))
        return True

    def save(self) -> None:
        """Checkpoint now, in the background (every worker calls it after the same step)."""
        if self._durable.writer is None:
            raise ConfigError(
                "opt.save() needs a checkpoint path: taiji.Optimizer(..., checkpoint="
                "taiji.Checkpoint(path)) or `taiji run --checkpoint-dir`"
            )
        self._durable.save()

    def close(self) -> None:
        """Detach from the model; tell the launcher this worker's training loop has ended (after
        the checkpoint being written, if any, is complete)."""
        self._durable.close()
        if self._attempt is not None:
            self._engine.abort(self._attempt)
            self._attempt = None
        if self._entered:
            self._membership.set_training(False)
            self._membership.finish()
        self.sync.detach()
        self._membership.close()

    def _cluster_changed(self) -> None:
        self.sync.cluster_changed(self._peer.view, self._peer.job_store)

    def _leave_if_not_member(self, move: Any) -> None:
        try:
            move()
        except LeftCluster:
            self.close()
            leave()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state dict."""
        self.optimizer.load_state_dict(state)


def _no_decisions(digests: object, step: int) -> None:
    """A loop the user writes takes no decisions through taiji: there is no fingerprint to compare."""
