"""Declarative fault injection: "kill / hang rank r at step s in phase p", or make its
collectives fail there (``raise``: a CommError, as a lost peer would).

A plan comes from ``TAIJI_FAULTS`` (JSON list). Each fault fires at most once per job
(claimed through the store), so a retried step or a replacement worker does not fire it
again -- unless it says ``repeat`` (every matching worker, every time: a failure that is not
transient). Phases: ``compute`` (batch built, before forward), ``allreduce`` (backward done,
gradients in flight), ``commit`` (every collective of the step done, before this worker
applies the update: its peers commit the step with its share in it), ``sync`` (state sync
after a membership change), ``boot`` (a joiner before it reports ready). ``raise`` has no
meaning at ``commit``: no collective is left to fail there.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import env
from ..errors import CommError, ConfigError

log = logging.getLogger(__name__)

PHASES = ("compute", "allreduce", "commit", "sync", "boot")
ACTIONS = ("kill", "hang", "exit", "raise")


@dataclass(frozen=True)
class Fault:
    action: str
    phase: str
    step: int = -1  # -1: any step
    rank: int = -1  # -1: any rank
    worker: str = ""  # match by worker id instead of rank
    code: int = 1  # for action "exit"
    repeat: bool = False  # fire every time it matches, on every matching worker

    def __post_init__(self) -> None:
        if self.action not in ACTIONS or self.phase not in PHASES:
            raise ConfigError(f"bad fault {self}: action in {ACTIONS}, phase in {PHASES}")
        if self.action == "raise" and self.phase == "commit":
            raise ConfigError(
                f"bad fault {self}: no collective is left to fail at 'commit'; "
                "use 'allreduce' for a failed collective, or kill/hang/exit at 'commit'"
            )

    def matches(self, phase: str, rank: int, step: int, worker: str) -> bool:
        return (
            phase == self.phase
            and self.step in (-1, step)
            and (self.worker == worker if self.worker else self.rank in (-1, rank))
        )


def parse(text: str) -> tuple[Fault, ...]:
    if not text:
        return ()
    try:
        return tuple(Fault(**item) for item in json.loads(text))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"TAIJI_FAULTS is not a valid fault list: {exc}") from None


class FaultPlan:
    def __init__(self, faults: tuple[Fault, ...], claim: Callable[[int], bool]):
        self.faults = faults
        self._claim = claim  # claim(i) -> True for the one worker that may fire fault i

    def fire(self, phase: str, rank: int, step: int, worker: str) -> None:
        for i, fault in enumerate(self.faults):
            if fault.matches(phase, rank, step, worker) and (fault.repeat or self._claim(i)):
                log.warning(
                    "injected fault: %s rank %d (worker %s) at step %d in phase %s",
                    fault.action,
                    rank,
                    worker,
                    step,
                    phase,
                )
                for handler in logging.getLogger().handlers:
                    handler.flush()
                if fault.action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif fault.action == "hang":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif fault.action == "raise":
                    raise CommError(f"injected collective failure at step {step} in phase {phase}")
                else:
                    os._exit(fault.code)


def for_worker(store: Any, who: Callable[[], tuple[int, str]]) -> Callable[[str, int], None]:
    """``fire(phase, step)`` for the plan in ``TAIJI_FAULTS``, for the worker ``who()`` names
    (rank, worker id) at that moment; each fault fires once per job, claimed on the job store."""
    plan = FaultPlan(parse(env.FAULTS.get()), lambda i: store.add(f"fault/{i}", 1) == 1)

    def fire(phase: str, step: int) -> None:
        if plan.faults:
            rank, worker = who()
            plan.fire(phase, rank, step, worker)

    return fire
