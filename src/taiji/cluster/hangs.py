"""How the membership controller (:mod:`~taiji.cluster.controller`) judges workers that fall
silent (pure): after their peers reported a failed collective, a member that did not report is
hung (its heartbeat is stale, or it never sent one) and is killed, or busy (its heartbeat is fresh)
and is waited for up to ``busy_timeout``; and a worker whose heartbeat stopped for
``liveness_timeout`` is stopped or frozen, whether or not a collective waits on it.
"""

from __future__ import annotations

from dataclasses import replace

from .control_events import Action, Kill, Log
from .control_state import ControllerState

BOOTING_SLACK = 4  # a joiner not yet ready is taken for frozen after this many --liveness-timeouts


def judge_silent(
    state: ControllerState, silent: list[str], now: float, final: bool
) -> tuple[ControllerState, list[Action]]:
    """The ``silent`` members (alive, not killed, not among the reports) of a failure report:
    hung ones killed (one that never sent a heartbeat at once if it is the only one, else once the
    suspect window is over, ``final``), busy ones waited for, up to ``busy_timeout``."""
    unknown = [i for i in silent if i not in state.beats]
    stuck = [i for i in silent if i in state.beats and now - state.beats[i] > state.bounds.stale_after]
    busy = [i for i in silent if i not in unknown and i not in stuck]
    kills = [
        Kill(
            i,
            f"suspected hang: its peers' collectives failed and its heartbeat stopped "
            f"{now - state.beats[i]:.1f}s ago",
        )
        for i in stuck
    ]
    if unknown and (len(unknown) == 1 or final):
        kills += [
            Kill(i, "suspected hang: its peers' collectives failed and it did not report") for i in unknown
        ]
    waited = now - state.report_started
    if waited > state.bounds.busy_timeout:
        kills += [
            Kill(
                i,
                f"busy outside training for {waited:.0f}s while its peers wait "
                f"(more than --busy-timeout {state.bounds.busy_timeout:g}s)",
            )
            for i in busy
        ]
        busy = []
    actions: list[Action] = [
        Log(
            "info",
            f"worker {i} is busy outside a collective (its heartbeat is fresh): "
            "its peers wait for it to come back",
        )
        for i in busy
        if i not in state.noted_busy
    ]
    state = replace(
        state, killed=state.killed | {k.id for k in kills}, noted_busy=state.noted_busy | set(busy)
    )
    return state, actions + kills


def frozen(state: ControllerState, now: float) -> tuple[ControllerState, list[Action]]:
    """Running workers whose heartbeat stopped for ``liveness_timeout``: stopped or frozen. A
    joiner still booting holds nobody up, and its imports and model building can hold Python's
    lock for seconds on a loaded host (its heartbeat thread waits): it gets ``BOOTING_SLACK``
    times as long."""
    running = set(state.alive_members) | {j.id for j in state.joiners}
    booting = {j.id for j in state.joiners if not j.ready}
    # once training has ended a heartbeat stops as its process exits (taiji's exit handler; then the
    # interpreter's teardown, seconds with a framework loaded on a busy host): slow to exit, not frozen
    limit = (
        max(state.bounds.liveness_timeout, state.bounds.exit_timeout)
        if state.done
        else state.bounds.liveness_timeout
    )
    frozen = sorted(
        i
        for i, at in state.beats.items()
        if i in running
        and i not in state.killed
        and now - at > limit * (BOOTING_SLACK if i in booting else 1)
    )
    if state.done:
        kills = [
            Kill(
                i,
                f"still running {now - state.beats[i]:.1f}s after it stopped its heartbeat at the "
                "end of training",
            )
            for i in frozen
        ]
    else:
        kills = [
            Kill(
                i,
                f"no heartbeat for {now - state.beats[i]:.1f}s (more than --liveness-timeout "
                f"{state.bounds.liveness_timeout:g}s): its process is stopped or frozen",
            )
            for i in frozen
        ]
    return replace(state, killed=state.killed | set(frozen)), kills
