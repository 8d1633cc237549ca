"""Adaptation: the agreed Context in, a Plan out (policies run through the pure runner), and the
check that every worker decided the same. Nothing here applies a decision: the Job does.

The check costs nothing per step: a 52-bit fingerprint of the boundary's decisions rides the next
step's control message. If the rows disagree, the step is not committed; all workers (they all
see the same rows) then allgather one fingerprint per policy to name the policy that diverged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..cluster.spec import ClusterView
from ..comm.communicator import Communicator
from ..errors import CommError, ConsensusError
from ..monitor.gns import GNSEstimator
from ..monitor.stats import StepStats
from ..policies.base import HOOKS, Context, Metrics, Policy, Resize, ScaleLR, SetBatchSize
from ..policies.runner import Plan, decision_trail, plan_digest, run_hooks
from .reporting import Event
from .state import Progress

log = logging.getLogger(__name__)


class Adaptation:
    def __init__(self, policies: Sequence[Policy]):
        self.policies = list(policies)
        for policy in self.policies:
            if not isinstance(policy, Policy):
                raise TypeError(f"policies must be taiji.policies.Policy instances, got {policy!r}")
        self.plan = Plan()
        self.digest = 0  # of the last boundary's decisions; rides the control message
        self.last_clock: float | None = None  # rank 0's clock at the previous control message
        self.metrics = Metrics()  # of the last committed step (or decoupled phase)
        self._noted: set[str] = set()

    def observe(
        self,
        stats: StepStats,
        gns: GNSEstimator,
        grad_variance: float | None = None,
        samples: int | None = None,
    ) -> None:
        """Record the agreed statistics of a committed step (or of a decoupled phase that
        consumed ``samples``)."""
        seconds = stats.clock - self.last_clock if self.last_clock is not None and stats.clock > 0 else None
        if seconds is not None and seconds <= 0:
            seconds = None
        samples = int(stats.global_batch) if samples is None else samples
        self.metrics = Metrics(
            samples=samples,
            loss=stats.loss,
            gns=gns.b_noise,
            grad_sqnorm=gns.grad_sqnorm,
            trace_sigma=gns.trace_sigma,
            grad_variance=grad_variance,
            straggler=stats.straggler,
            step_seconds=seconds,
            samples_per_s=samples / seconds if seconds else None,
            worker_step_seconds=stats.wall_seconds,
            allreduce_seconds=stats.previous_allreduce_wait,
        )
        self.last_clock = stats.clock if stats.clock > 0 else self.last_clock

    def context(
        self,
        progress: Progress,
        num_samples: int,
        view: ClusterView,
        lr: float,
        strategy: str,
        strategies: tuple[str, ...],
        topology: str = "ring",
    ) -> Context:
        """What the policies see at this boundary: agreed state and metrics only."""
        return Context(
            step=progress.step,
            epoch=progress.epoch,
            cursor=progress.sampler.cursor,
            num_samples=num_samples,
            size=view.size,
            version=view.version,
            batch_size=progress.sampler.batch_size,
            lr=lr,
            strategy=strategy,
            time=self.last_clock or 0.0,
            metrics=self.metrics,
            min_size=view.min_size,
            max_size=view.max_size,
            elastic=view.elastic,
            strategies=strategies,
            topology=topology,
        )

    def decide(self, hooks: Sequence[str], context: Context, lead: bool) -> Plan:
        """Run ``hooks`` on every policy over ``context`` (as it reads after the metrics were
        observed); remember the plan's fingerprint for the next control message."""
        if not self.policies:
            return Plan()
        _, plan = run_hooks(self.policies, hooks, context)
        self.plan, self.digest = plan, plan_digest(plan)
        for note in plan.notes:
            kind = note.split(": ", 1)[-1].split("(")[0]  # e.g. "ignored Resize": say it loudly once
            if lead:
                log.log(logging.DEBUG if kind in self._noted else logging.WARNING, "policy decision %s", note)
            self._noted.add(kind)
        return plan

    # -- consensus ----------------------------------------------------------------------

    def check(self, digests: Sequence[float], step: int, comm: Communicator) -> None:
        """Raise ConsensusError if the workers' decision fingerprints in the control message differ."""
        if len(set(digests)) <= 1:
            return
        detail = ""
        try:
            mine = torch.tensor(decision_trail(self.plan), dtype=torch.int64)
            rows = comm.allgather(mine, channel="ctrl")
            assert isinstance(rows, list)
            detail = self._first_difference(rows)
        except CommError as exc:
            detail = f" (could not compare the decisions one by one: {exc})"
        ranks = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ConsensusError(
            f"[rank {comm.rank} v={comm.version} step={step}] workers disagree on the decisions taken at "
            f"the step boundary before step {step}: ranks {ranks} differ from rank 0.{detail} Policies must "
            "decide only from the Context they are given (no rank, local clock or randomness); the step "
            "was not committed and training stops on every worker.",
            op="consensus",
            channel="ctrl",
            version=comm.version,
        )

    def _first_difference(self, trails: list[torch.Tensor]) -> str:
        """Name the first decision (in the order applied) that differs between workers."""
        for position in range(trails[0].shape[0]):
            digests = [int(t[position, 0]) for t in trails]
            if len(set(digests)) == 1:
                continue
            ranks = [r for r, d in enumerate(digests) if d != digests[0]]
            takers = {(int(t[position, 1]), int(t[position, 2])) for t in trails if int(t[position, 1]) >= 0}
            names = sorted(
                f"{self.policies[i].name} (#{i}).{HOOKS[h]}" for i, h in takers if 0 <= i < len(self.policies)
            )
            return (
                f" The first decision that differs (#{position + 1} at this boundary) was taken by "
                f"{' / '.join(names) or 'an unknown policy'}; ranks {ranks} differ from rank 0 there."
            )
        return ""

    # -- synced state -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "policies": [p.state_dict() for p in self.policies],
            "digest": self.digest,
            "last_clock": self.last_clock,
            "metrics": self.metrics.__dict__,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for policy, policy_state in zip(self.policies, state.get("policies", [])):
            policy.load_state_dict(policy_state)
        self.digest = int(state.get("digest", 0))
        self.last_clock = state.get("last_clock")
        metrics = dict(state.get("metrics", {}))
        metrics["worker_step_seconds"] = tuple(metrics.get("worker_step_seconds", ()))
        self.metrics = Metrics(**metrics)
        self.plan = Plan()


def boundary_hooks(epoch_ended: bool, done: bool) -> list[str]:
    """The hooks of the boundary after a committed step (or a closed decoupled phase)."""
    hooks = ["after_step"] + (["after_epoch"] if epoch_ended else [])
    if not done:
        hooks += (["before_epoch"] if epoch_ended else []) + ["before_step"]
    return hooks


def who(plan: Plan, kind: type) -> str:
    names = [a.policy for a in plan.applied if isinstance(a.decision, kind)]
    return names[-1] if names else "?"


def policy_events(plan: Plan, context: Context, lead: bool) -> list[Event]:
    """The run-log events of a plan's applied decisions (logged by the lead worker); ScaleLR's
    show in the metrics' "lr" (AdaScale changes it every step)."""
    events = []
    for applied in plan.applied:
        if isinstance(applied.decision, ScaleLR):
            continue
        if lead:
            log.info("policy %s.%s: %s", applied.policy, applied.hook, describe(applied.decision, context))
        events.append(
            Event(
                "policy",
                context.step,
                {
                    "policy": applied.policy,
                    "hook": applied.hook,
                    "decision": repr(applied.decision),
                    "gns": context.metrics.gns,
                },
            )
        )
    return events


def describe(decision: Any, context: Context) -> str:
    if isinstance(decision, SetBatchSize):
        return (
            f"global batch {context.batch_size} -> {decision.batch_size} at step {context.step} "
            f"(GNS {_fmt(context.metrics.gns)})"
        )
    if isinstance(decision, Resize):
        return f"asks for {decision.size} workers (now {context.size}) at step {context.step}"
    return f"{decision!r} at step {context.step}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.0f}"


def scale_lr(optimizer: torch.optim.Optimizer, scheduler: Any, factor: float) -> None:
    """Scale the learning rate where PyTorch keeps it: each group's ``lr`` (and ``initial_lr``),
    and a scheduler's ``base_lrs``, so closed-form schedulers do not undo the change."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group:
                value = group[key]
                group[key] = value * factor if not isinstance(value, torch.Tensor) else value.mul_(factor)
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
