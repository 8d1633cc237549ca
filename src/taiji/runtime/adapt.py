"""The Job's side of adaptation: build the agreed Context, run the policies, carry out their Plan,
and check that every worker decided the same.

The check costs nothing per step: a 52-bit fingerprint of the boundary's decisions rides the next
step's control message. If the rows disagree, the step is not committed; all workers (they all
see the same rows) then allgather one fingerprint per policy to name the policy that diverged.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .. import env
from ..errors import CommError, ConsensusError
from ..policies.base import HOOKS, Context, Metrics, Policy, Resize, ScaleLR, SetBatchSize, Stop
from ..policies.runner import Plan, decision_trail, plan_digest, run_hooks

if TYPE_CHECKING:
    from ..monitor.stats import StepStats
    from .job import Job

log = logging.getLogger(__name__)


class Adaptation:
    def __init__(self, job: "Job", policies: Sequence[Policy]):
        self.job = job
        self.policies = list(policies)
        for policy in self.policies:
            if not isinstance(policy, Policy):
                raise TypeError(f"policies must be taiji.Policy instances, got {policy!r}")
        self.plan = Plan()
        self.digest = 0               # of the last boundary's decisions; rides the control message
        self.last_clock: float | None = None  # rank 0's clock at the previous control message
        self.metrics = Metrics()      # of the last committed step
        self.lr_changes = 0
        self._noted: set[str] = set()

    # -- context ------------------------------------------------------------------------

    def observe(self, stats: "StepStats", samples: int | None = None) -> None:
        """Record the agreed statistics of a step that is being committed (or of a decoupled
        phase that consumed ``samples``)."""
        gns = self.job.gns
        seconds = stats.clock - self.last_clock if self.last_clock is not None and stats.clock > 0 else None
        if seconds is not None and seconds <= 0:
            seconds = None
        samples = int(stats.global_batch) if samples is None else samples
        self.metrics = Metrics(
            samples=samples, loss=stats.loss, gns=gns.b_noise, grad_sqnorm=gns.grad_sqnorm,
            trace_sigma=gns.trace_sigma, grad_variance=stats.grad_variance, straggler=stats.straggler,
            step_seconds=seconds, samples_per_s=samples / seconds if seconds else None,
            worker_step_seconds=stats.wall_seconds)
        self.last_clock = stats.clock if stats.clock > 0 else self.last_clock

    def context(self) -> Context:
        job = self.job
        progress = job.progress
        max_np = env.MAX_NP.get()
        return Context(
            step=progress.step, epoch=progress.epoch, cursor=progress.sampler.cursor,
            num_samples=job.sampler.num_samples, size=job.peer.size, version=job.peer.version,
            batch_size=progress.sampler.batch_size, lr=float(job.optimizer.param_groups[0]["lr"]),
            strategy=job.strategy_name, time=self.last_clock or 0.0, metrics=self.metrics,
            min_size=max(env.MIN_NP.get(), 1), max_size=max_np or None, elastic=job.peer.elastic,
            strategies=tuple(job.strategies))

    # -- boundaries ---------------------------------------------------------------------

    def boundary(self, hooks: Sequence[str]) -> Plan:
        """Run ``hooks`` on every policy and carry out the result. Returns the plan."""
        if not self.policies:
            return Plan()
        _, plan = run_hooks(self.policies, hooks, self.context())
        self.plan, self.digest = plan, plan_digest(plan)
        if not plan.empty:
            self._carry_out(plan)
        return plan

    def _carry_out(self, plan: Plan) -> None:
        job = self.job
        lead = job.peer.rank == 0
        for note in plan.notes:
            kind = note.split(": ", 1)[-1].split("(")[0]  # e.g. "ignored Resize": say it loudly once
            if lead:
                log.log(logging.DEBUG if kind in self._noted else logging.WARNING, "policy decision %s", note)
            self._noted.add(kind)
        for applied in plan.applied:
            decision = applied.decision
            if isinstance(decision, ScaleLR):
                continue  # reported through the metrics' "lr"; AdaScale changes it every step
            if lead:
                log.info("policy %s.%s: %s", applied.policy, applied.hook, _describe(decision, job))
            job._report_event("policy", policy=applied.policy, hook=applied.hook, decision=repr(decision),
                              gns=self.metrics.gns)
        if plan.batch_size is not None:
            job._set_batch_size(plan.batch_size)
        if plan.lr_factor != 1.0:
            _scale_lr(job.optimizer, job.lr_scheduler, plan.lr_factor)
            self.lr_changes += 1
        if plan.strategy is not None:
            job._request_strategy(plan.strategy)
        if plan.resize is not None and lead:
            job.peer.propose_size(plan.resize, source=f"policy {_who(plan, Resize)}")
        if plan.stop is not None:
            if lead:
                log.info("policy %s stops training at step %d: %s", _who(plan, Stop), job.progress.step, plan.stop)
            job._stop_agreed = True

    # -- consensus ----------------------------------------------------------------------

    def check(self, digests: Sequence[float], step: int) -> None:
        """Raise ConsensusError if the workers' decision fingerprints in the control message differ."""
        if len(set(digests)) <= 1:
            return
        comm = self.job.peer.comm
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
            op="consensus", channel="ctrl", version=comm.version)

    def _first_difference(self, trails: list[torch.Tensor]) -> str:
        """Name the first decision (in the order applied) that differs between workers."""
        for position in range(trails[0].shape[0]):
            digests = [int(t[position, 0]) for t in trails]
            if len(set(digests)) == 1:
                continue
            ranks = [r for r, d in enumerate(digests) if d != digests[0]]
            takers = {(int(t[position, 1]), int(t[position, 2])) for t in trails if int(t[position, 1]) >= 0}
            names = sorted(f"{self.policies[i].name} (#{i}).{HOOKS[h]}" for i, h in takers
                           if 0 <= i < len(self.policies))
            return (f" The first decision that differs (#{position + 1} at this boundary) was taken by "
                    f"{' / '.join(names) or 'an unknown policy'}; ranks {ranks} differ from rank 0 there.")
        return ""

    # -- synced state -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"policies": [p.state_dict() for p in self.policies], "digest": self.digest,
                "last_clock": self.last_clock, "metrics": self.metrics.__dict__}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for policy, policy_state in zip(self.policies, state.get("policies", [])):
            policy.load_state_dict(policy_state)
        self.digest = int(state.get("digest", 0))
        self.last_clock = state.get("last_clock")
        metrics = dict(state.get("metrics", {}))
        metrics["worker_step_seconds"] = tuple(metrics.get("worker_step_seconds", ()))
        self.metrics = Metrics(**metrics)
        self.plan = Plan()


def _who(plan: Plan, kind: type) -> str:
    names = [a.policy for a in plan.applied if isinstance(a.decision, kind)]
    return names[-1] if names else "?"


def _describe(decision: Any, job: "Job") -> str:
    if isinstance(decision, SetBatchSize):
        return (f"global batch {job.progress.sampler.batch_size} -> {decision.batch_size} "
                f"at step {job.progress.step} (GNS {_fmt(job.gns.b_noise)})")
    if isinstance(decision, Resize):
        return f"asks for {decision.size} workers (now {job.peer.size}) at step {job.progress.step}"
    return f"{decision!r} at step {job.progress.step}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.0f}"


def _scale_lr(optimizer: torch.optim.Optimizer, scheduler: Any, factor: float) -> None:
    """Scale the learning rate where PyTorch keeps it: each group's ``lr`` (and ``initial_lr``),
    and a scheduler's ``base_lrs``, so closed-form schedulers do not undo the change."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr"):
            if key in group:
                value = group[key]
                group[key] = value * factor if not isinstance(value, torch.Tensor) else value.mul_(factor)
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]

