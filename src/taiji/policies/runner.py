"""Running policies at a step boundary: a pure function from (policies, hooks, Context) to a Plan.

Conflict rule (documented in the README): policies run in the order given, and each sees the
Context as changed by the decisions of the policies before it at this boundary. So

* ``SetBatchSize``, ``Resize``, ``SetStrategy`` and ``SetTopology``: the last policy to decide wins (it saw
  the earlier value);
* ``ScaleLR`` factors multiply (an LR rule after a batch-size policy scales for the new batch);
* ``Stop`` is final: once any policy stops, training ends at this boundary whatever follows.

Invalid decisions are clamped (batch larger than the data set, size outside --min-np/--max-np)
or rejected (batch < 1, non-positive LR factor, Resize without a launcher), each with a note
the runtime logs; they never raise, so a bad decision cannot take a job down or hang it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..comm.topologies import TOPOLOGIES
from .base import (
    DECISION_TYPES,
    Context,
    Decision,
    Policy,
    PolicyError,
    Resize,
    ScaleLR,
    SetBatchSize,
    SetStrategy,
    SetTopology,
    Stop,
)


@dataclass(frozen=True)
class Applied:
    policy: str
    hook: str
    decision: Decision
    index: int = 0  # position of the policy in the Job's list


@dataclass(frozen=True)
class Plan:
    """The net effect of one boundary's decisions, for the runtime to carry out."""

    batch_size: int | None = None  # new global batch size, if it changes
    lr_factor: float = 1.0  # multiply learning rates by this
    resize: int | None = None  # ask the launcher for this many workers
    strategy: str | None = None  # switch to this strategy
    topology: str | None = None  # allreduce gradients with this plan
    stop: str | None = None  # reason, if training stops here
    applied: tuple[Applied, ...] = ()
    notes: tuple[str, ...] = ()  # clamped or rejected decisions, for the log

    @property
    def empty(self) -> bool:
        return not self.applied and not self.notes


def validate(ctx: Context, decision: Decision) -> tuple[Decision | None, str | None]:
    """The decision as it may be applied (possibly clamped), or None; and a note if changed."""
    if isinstance(decision, SetBatchSize):
        b = decision.batch_size
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            return None, f"rejected SetBatchSize({b!r}): the global batch size must be an integer >= 1"
        if b > ctx.num_samples:
            return SetBatchSize(ctx.num_samples), (
                f"clamped SetBatchSize({b}) to the data set's {ctx.num_samples} samples"
            )
        return (None, None) if b == ctx.batch_size else (decision, None)
    if isinstance(decision, ScaleLR):
        f = decision.factor
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not math.isfinite(f) or f <= 0:
            return None, f"rejected ScaleLR({f!r}): the factor must be a finite number > 0"
        return (None, None) if f == 1 else (ScaleLR(float(f)), None)
    if isinstance(decision, Resize):
        n = decision.size
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return None, f"rejected Resize({n!r}): the size must be an integer >= 1"
        if not ctx.elastic:
            return (
                None,
                f"ignored Resize({n}): not running under `taiji run`, so there is no cluster to resize",
            )
        clamped = max(n, ctx.min_size)
        if ctx.max_size is not None:
            clamped = min(clamped, ctx.max_size)
        note = None
        if clamped != n:
            note = (
                f"clamped Resize({n}) to {clamped} (bounds --min-np {ctx.min_size}, --max-np {ctx.max_size})"
            )
        return (None, note) if clamped == ctx.size else (Resize(clamped), note)
    if isinstance(decision, SetStrategy):
        if decision.name not in ctx.strategies:
            return None, (
                f"rejected SetStrategy({decision.name!r}): the Job has no such strategy "
                f"(available: {', '.join(ctx.strategies)})"
            )
        return (None, None) if decision.name == ctx.strategy else (decision, None)
    if isinstance(decision, SetTopology):
        if decision.name not in TOPOLOGIES:
            return None, f"rejected SetTopology({decision.name!r}): use one of {', '.join(TOPOLOGIES)}"
        return (None, None) if decision.name == ctx.topology else (decision, None)
    if isinstance(decision, Stop):
        return decision, None
    raise TypeError(decision)


def _results(result: object) -> list[object]:
    if result is None:
        return []
    if isinstance(result, DECISION_TYPES):
        return [result]
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


def run_hooks(policies: Sequence[Policy], hooks: Iterable[str], ctx: Context) -> tuple[Context, Plan]:
    """Run ``hooks`` (in order) on every policy (in order); return the final Context and the Plan.

    Raises PolicyError naming the policy, hook and step if a policy raises or returns
    something that is not a decision.
    """
    plan = Plan()
    for hook in hooks:
        for index, policy in enumerate(policies):
            try:
                results = _results(getattr(policy, hook)(ctx))
            except Exception as exc:
                raise PolicyError(
                    f"policy {policy.name}.{hook} raised at step {ctx.step} (epoch {ctx.epoch}): "
                    f"{type(exc).__name__}: {exc}. Training stops on every worker; fix the policy "
                    f"and start the job again."
                ) from exc
            for decision in results:
                if not isinstance(decision, DECISION_TYPES):
                    raise PolicyError(
                        f"policy {policy.name}.{hook} returned {decision!r} at step {ctx.step}; a hook "
                        f"returns None, a decision ({', '.join(t.__name__ for t in DECISION_TYPES)}) "
                        f"or a list of decisions"
                    )
                ctx, plan = _apply(ctx, plan, index, policy.name, hook, decision)
    return ctx, plan


def _apply(
    ctx: Context, plan: Plan, index: int, policy: str, hook: str, decision: Decision
) -> tuple[Context, Plan]:
    effective, note = validate(ctx, decision)
    if note is not None:
        plan = replace(plan, notes=plan.notes + (f"{policy}.{hook} at step {ctx.step}: {note}",))
    if effective is None:
        return ctx, plan
    plan = replace(plan, applied=plan.applied + (Applied(policy, hook, effective, index),))
    if isinstance(effective, SetBatchSize):
        return ctx.replace(batch_size=effective.batch_size), replace(plan, batch_size=effective.batch_size)
    if isinstance(effective, ScaleLR):
        return (
            ctx.replace(lr=ctx.lr * effective.factor),
            replace(plan, lr_factor=plan.lr_factor * effective.factor),
        )
    if isinstance(effective, Resize):
        return ctx, replace(plan, resize=effective.size)
    if isinstance(effective, SetStrategy):
        return ctx.replace(strategy=effective.name), replace(plan, strategy=effective.name)
    if isinstance(effective, SetTopology):
        return ctx.replace(topology=effective.name), replace(plan, topology=effective.name)
    assert isinstance(effective, Stop)
    return ctx, plan if plan.stop is not None else replace(plan, stop=effective.reason or policy)


def plan_digest(plan: Plan) -> int:
    """A 52-bit fingerprint of the decisions (exact in a float64, so it rides the control message)."""
    text = repr([(a.policy, a.hook, a.decision) for a in plan.applied])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 52) - 1)


def decision_trail(plan: Plan, length: int = 32) -> list[tuple[int, int, int]]:
    """``(fingerprint of the decisions up to here, policy index, hook index)`` for each of the
    first ``length`` decisions in the order they were applied (padded with ``(digest, -1, -1)``):
    comparing trails across workers finds the first decision that differs and who took it."""
    from .base import HOOKS

    trail = []
    for i in range(length):
        prefix = replace(plan, applied=plan.applied[: i + 1])
        if i < len(plan.applied):
            applied = plan.applied[i]
            trail.append((plan_digest(prefix), applied.index, HOOKS.index(applied.hook)))
        else:
            trail.append((plan_digest(plan), -1, -1))
    return trail
