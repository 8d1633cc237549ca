"""Decisions: where the policies' plan at a step boundary takes effect, identically on every worker.

Every worker runs the same policies on the same agreed figures (``Adaptation``), so every worker
holds the same ``Plan``; ``Decisions.decide`` applies it here — the batch size from the next step on,
the learning rate, the allreduce topology — and proposes a resize (rank 0 only: one proposal per
job). What the Job itself must do (switch the strategy after any transition at this boundary, stop)
it reads from the returned plan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ..policies.base import Context, Resize, Stop
from ..policies.runner import Plan
from .adaptation import Adaptation, policy_events, scale_lr, who
from .peer import Peer
from .reporting import Reporter
from .state import TrainState

log = logging.getLogger(__name__)


class Decisions:
    """Applies each boundary's plan (see module doc)."""

    def __init__(
        self,
        adaptation: Adaptation,
        state: TrainState,
        reporter: Reporter,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        peer: Peer,
        num_samples: int,
    ):
        self.adaptation, self.state, self.reporter = adaptation, state, reporter
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.peer = peer
        self.num_samples = num_samples

    def decide(self, hooks: Sequence[str], strategy: str, strategies: tuple[str, ...]) -> Plan:
        """Run the policies of ``hooks`` and apply their plan; ``strategy``: the one in use."""
        if not self.adaptation.policies:
            return Plan()  # the Context costs microseconds a step: build it only for policies
        context = self.context(strategy, strategies)
        lead = self.peer.joined and self.peer.view.rank == 0
        plan = self.adaptation.decide(list(hooks), context, lead=lead)
        self._apply(plan, context, lead)
        return plan

    def context(self, strategy: str, strategies: tuple[str, ...]) -> Context:
        """What the policies read at this boundary."""
        return self.adaptation.context(
            self.state.progress,
            self.num_samples,
            self.peer.view,
            float(self.optimizer.param_groups[0]["lr"]),
            strategy,
            strategies,
            self.state.topology,
        )

    def _apply(self, plan: Plan, context: Context, lead: bool) -> None:
        for event in policy_events(plan, context, lead):
            self.reporter.on(event)
        if plan.batch_size is not None:
            self.state.set_batch_size(plan.batch_size)
        if plan.lr_factor != 1.0:
            scale_lr(self.optimizer, self.lr_scheduler, plan.lr_factor)
        if plan.topology is not None:  # from the next step's buckets on (this one's are done)
            self.state.topology = plan.topology
            self.peer.comm.set_topology(plan.topology)
        if plan.resize is not None and lead:
            self.peer.propose_size(plan.resize, source=f"policy {who(plan, Resize)}")
        if plan.stop is not None and lead:
            log.info("policy %s stops training at step %d: %s", who(plan, Stop), context.step, plan.stop)
