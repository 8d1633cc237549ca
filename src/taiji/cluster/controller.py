"""The membership state machine, as a pure function: ``decide(state, event, now)``.

The launcher's driver feeds it events (a resize proposal, a joiner ready, a worker exit, a
failure report, the job done, a clock tick) and carries out the actions it returns (spawn,
kill, publish a config, log, finish). Nothing here touches processes, sockets or clocks.

Rules (docs/design.md#control-plane):
- grow: spawn joiners; publish ``v+1`` with them only once *all* are ready (or, after the
  join timeout, with those that are), so running workers never wait for a process to boot;
- shrink: publish ``v+1`` at once; the newest workers leave and exit 0;
- failure: a worker exits non-zero inside its training loop (or is suspected and killed):
  publish ``v+1`` without it;
  with ``replace`` spawn a replacement through the grow path. If removing it would leave
  fewer than ``min_np``, survivors wait and one config is published with the failed worker
  removed and its replacements added, or the job fails after the join timeout;
- a worker that exits 0 from inside its training loop is treated as leaving (no
  replacement); one that exits 0 after it (or without one) has finished;
- a worker failing outside a training loop (before it, or a script without one) stops the
  job: its peers have no way to recover, so its exit is reported as the root cause;
- the job ends when every worker of the latest config has exited 0;
- liveness (:mod:`~taiji.cluster.hangs`): every worker's heartbeat (``Beat``) says its process
  runs. When its peers report a failed collective, a silent member whose heartbeat is stale is hung
  and is killed at once; one whose heartbeat is fresh is *busy* (evaluating, checkpointing) and is
  left alone — it reports too when it comes back, and the groups are rebuilt with the same
  members — up to ``busy_timeout``; ``max_rebuilds`` versions in a row whose every worker failed at
  the same step stop the job. A worker without a heartbeat for ``liveness_timeout`` is stopped or
  frozen and is killed even if no collective waits on it (asynchronous phases). Workers that never
  sent a heartbeat are judged by the report rule alone: killed at once when one is silent.
- hosts: every worker runs on a host with a number of slots; the launcher's host is the first;
  a host beyond ``max_hosts`` is refused.
  Joiners are placed on the oldest hosts with free slots (so shrinking, which drops the newest
  workers, empties the newest host first) — unless a proposal names a placement (a scheduler's
  workers per host): then joiners go where it wants more than run, and a shrink drops the newest
  members of the hosts that hold more than it wants (:mod:`~taiji.cluster.placement`). A
  placement only adds or only removes (a move is a shrink, then a grow), is refused while joiners
  boot, and ends when membership changes on its own (an exit, a failure, a host joining or lost)
  or a controller takes over. A host that joins (``HostJoined``) adds its slots and the job grows
  onto them, up to ``max_np`` (or they serve a size asked for and not reached; with
  ``grow_on_join`` off only a resize uses them: a scheduler places the workers). A host whose
  agent stops beating for ``host_timeout`` — or, once its members' peers report failed
  collectives, for ``stale_after``
  — is lost (``HostLost`` does the same at once): all its members leave in one version, which
  counts as one failure.
"""

from __future__ import annotations

from dataclasses import replace

from . import spec
from .control_events import (  # noqa: F401 (re-exported: the controller's vocabulary)
    Action,
    Beat,
    Event,
    FailureReported,
    FatalReported,
    Finish,
    HostBeat,
    HostJoined,
    HostLost,
    JobDone,
    Kill,
    Log,
    Proposal,
    Publish,
    RefuseHost,
    Spawn,
    Tick,
    WorkerExited,
    WorkerReady,
)
from .control_state import (  # noqa: F401 (re-exported)
    Bounds,
    ControllerState,
    Host,
    Joiner,
    adopted_state,
    initial_state,
)
from .hangs import frozen, judge_silent
from .placement import check_placement, leavers, place

Reaction = tuple[ControllerState, list[Action]]


def decide(state: ControllerState, event: Event, now: float) -> Reaction:
    if state.finished:
        return state, []
    if isinstance(event, Proposal):
        return _on_proposal(state, event, now)
    if isinstance(event, WorkerReady):
        joiners = tuple(replace(j, ready=True) if j.id == event.id else j for j in state.joiners)
        return _reconcile(replace(state, joiners=joiners), now, [])
    if isinstance(event, (WorkerExited, FailureReported, HostJoined, HostLost)):
        # membership changing on its own ends a scheduler's placement: it was honoured once
        state = replace(state, placement=())
    if isinstance(event, WorkerExited):
        return _on_exit(state, event, now)
    if isinstance(event, FailureReported):
        return _on_report(state, event, now)
    if isinstance(event, FatalReported):
        state = replace(state, first_failure=state.first_failure or (event.id, 1))
        return _finish(
            state, [], f"worker {event.id} reported an error no worker can recover from: {event.message}"
        )
    if isinstance(event, JobDone):
        state = replace(state, done=True)
        kills = [Kill(j.id, "the job is done") for j in state.joiners]
        state = replace(state, joiners=(), killed=state.killed | {j.id for j in state.joiners})
        return _maybe_finish(state, kills)
    if isinstance(event, Beat):
        return replace(state, beats={**state.beats, event.id: event.at}), []
    if isinstance(event, HostJoined):
        return _on_host_joined(state, event, now)
    if isinstance(event, HostBeat):
        if event.address not in state.host_beats:
            return state, []
        return replace(state, host_beats={**state.host_beats, event.address: event.at}), []
    if isinstance(event, HostLost):
        return _lose_host(state, event.address, event.reason, now)
    if isinstance(event, Tick):
        return _on_tick(state, now)
    raise TypeError(f"unknown event {event!r}")


# -- handlers ---------------------------------------------------------------------------


def _on_proposal(state: ControllerState, event: Proposal, now: float) -> Reaction:
    b = state.bounds
    if state.done:
        return state, [Log("warning", f"resize to {event.size} ignored: the job is finishing")]
    if event.size < b.min_np:
        return state, [Log("error", f"resize to {event.size} refused: below --min-np {b.min_np}")]
    actions: list[Action] = []
    size = event.size
    if event.placement:
        refused = check_placement(state, event)
        if refused:
            return state, [
                Log("error", f"resize to {event.size} placed {dict(event.placement)} refused: {refused}")
            ]
    elif size > b.max_np:
        actions.append(Log("warning", f"resize to {size} clamped to --max-np {b.max_np}"))
        size = b.max_np
    where = f" placed {dict(event.placement)}" if event.placement else ""
    actions.append(
        Log("info", f"resize requested by {event.source}: {state.config.size} -> {size} workers{where}")
    )
    return _reconcile(replace(state, desired=size, placement=event.placement), now, actions)


def _spawn(state: ControllerState, count: int, now: float) -> Reaction:
    hosts = place(state, count)
    if not hosts:
        return state, []  # every slot is taken: the job grows when a host joins
    workers = tuple(spec.WorkerSpec(f"w{state.next_index + i}", h) for i, h in enumerate(hosts))
    joiners = state.joiners + tuple(Joiner(w.id, now, host=w.host) for w in workers)
    return replace(state, joiners=joiners, next_index=state.next_index + len(workers)), [Spawn(workers)]


def _publish(state: ControllerState, config: spec.ClusterConfig, reason: str) -> ControllerState:
    return replace(
        state, config=config, reports=frozenset(), report_started=None, noted_busy=frozenset(), failed_step=-1
    )


def _reconcile(state: ControllerState, now: float, actions: list[Action]) -> Reaction:
    """Move membership towards ``desired``: spawn or kill joiners, publish when possible."""
    if state.done or state.finished:
        return state, actions
    alive = len(state.alive_members)
    if state.desired < alive and not state.removed_pending:
        kills = [Kill(j.id, "no longer needed") for j in state.joiners]
        state = replace(state, joiners=(), killed=state.killed | {j.id for j in state.joiners})
        config = (
            spec.remove(state.config, leavers(state, alive - state.desired))
            if state.placement
            else spec.shrink(state.config, state.desired)
        )
        reason = f"shrink {alive} -> {state.desired}"
        return _publish(state, config, reason), actions + kills + [Publish(config, reason)]
    wanted_joiners = state.desired - alive
    if wanted_joiners > len(state.joiners):
        state, spawn = _spawn(state, wanted_joiners - len(state.joiners), now)
        actions = actions + spawn
    elif wanted_joiners < len(state.joiners):
        extra = state.joiners[max(wanted_joiners, 0) :]
        state = replace(
            state,
            joiners=state.joiners[: max(wanted_joiners, 0)],
            killed=state.killed | {j.id for j in extra},
        )
        actions = actions + [Kill(j.id, "no longer needed") for j in extra]
    if state.joiners and all(j.ready for j in state.joiners):
        return _admit(state, state.joiners, actions)
    return state, actions


def _admit(state: ControllerState, ready: tuple[Joiner, ...], actions: list[Action]) -> Reaction:
    """Publish one config: failed members removed, ``ready`` joiners appended."""
    survivors = tuple(w for w in state.config.workers if w.id not in state.removed_pending)
    config = spec.ClusterConfig(
        state.config.version + 1,
        survivors + tuple(spec.WorkerSpec(j.id, j.host) for j in ready),
        lost=tuple(sorted(state.removed_pending)),
    )
    admitted = {j.id for j in ready}
    reason = f"grow to {config.size}: admit {sorted(admitted)}"
    if state.removed_pending:
        reason += f", drop failed {list(state.removed_pending)}"
    state = replace(
        state,
        joiners=tuple(j for j in state.joiners if j.id not in admitted),
        removed_pending=(),
        exited=state.exited - set(state.removed_pending),
        short_since=None,
    )
    return _publish(state, config, reason), actions + [Publish(config, reason)]


def _on_exit(state: ControllerState, event: WorkerExited, now: float) -> Reaction:
    wid, code = event.id, event.code
    state = replace(state, beats={k: v for k, v in state.beats.items() if k != wid})
    if wid in state.killed and wid not in state.config.ids:
        return replace(state, killed=state.killed - {wid}), []
    joiner = next((j for j in state.joiners if j.id == wid), None)
    if joiner is not None:  # a joiner died while booting: count it, then try again
        state = replace(state, joiners=tuple(j for j in state.joiners if j.id != wid))
        return _count_failure(state, (wid,), code, now, f"joiner {wid} failed while booting")
    if wid not in state.config.ids:
        return state, []  # a worker that left in a shrink
    state = replace(state, exited=state.exited | {wid})
    if state.done and wid in state.killed:  # stopped because training had ended: not a failure
        return _maybe_finish(replace(state, killed=state.killed - {wid}), [])
    if code == 0 and (state.done or not event.training or not _others_running(state, wid)):
        return _maybe_finish(state, [])
    if code == 0 and wid not in state.killed:  # left training of its own accord: no replacement
        config = spec.remove(state.config, [wid])
        state = replace(state, desired=min(state.desired, config.size), exited=state.exited - {wid})
        reason = f"worker {wid} exited 0 and leaves"
        return _reconcile(_publish(state, config, reason), now, [Publish(config, reason)])
    if not event.training and wid not in state.killed:
        # it never reached an elastic training loop (or had left it): its peers cannot recover
        # without it, so the job stops with this failure as the root cause
        state = replace(state, first_failure=state.first_failure or (wid, code))
        return _finish(state, [], f"worker {wid} exited outside a training loop, so its peers cannot recover")
    reason = "was stopped as a suspected hang" if wid in state.killed else "failed"
    return _count_failure(
        replace(state, killed=state.killed - {wid}), (wid,), code, now, f"worker {wid} {reason}"
    )


def _others_running(state: ControllerState, wid: str) -> bool:
    return any(i not in state.exited for i in state.config.ids if i != wid)


def _count_failure(
    state: ControllerState, wids: tuple[str, ...], code: int, now: float, what: str
) -> Reaction:
    """One failure that took ``wids`` (one worker, or a host's): they leave in one version."""
    first = state.first_failure or (wids[0], code)
    state = replace(state, failures=state.failures + 1, first_failure=first)
    actions: list[Action] = [
        Log(
            "warning",
            f"{what} (exit {code}); failure {state.failures} of at most {state.bounds.max_failures}",
        )
    ]
    if state.failures > state.bounds.max_failures:
        return _finish(
            state, actions, f"{state.failures} failures exceed --max-failures {state.bounds.max_failures}"
        )
    members = tuple(w for w in wids if w in state.config.ids and w not in state.removed_pending)
    if not members:
        return _reconcile(state, now, actions)
    if state.done:
        return _maybe_finish(state, actions)
    gone = set(members)
    survivors = [i for i in state.alive_members if i not in gone]
    if not survivors:
        return _finish(state, actions, "no worker is left")
    reason = f"drop failed {', '.join(members)}"
    if state.bounds.replace or len(survivors) < state.bounds.min_np:
        # keep the failed members out of training, but publish only with their replacement(s)
        if len(survivors) >= state.bounds.min_np:
            config = spec.remove(state.config, members, lost=True)
            state = _publish(replace(state, exited=state.exited - gone), config, reason)
            actions.append(Publish(config, reason))
        else:
            state = replace(
                state,
                removed_pending=state.removed_pending + members,
                exited=state.exited - gone,
                short_since=state.short_since if state.short_since is not None else now,
            )
            actions.append(
                Log(
                    "warning",
                    f"{len(survivors)} worker(s) left, below --min-np "
                    f"{state.bounds.min_np}: waiting for replacements",
                )
            )
        return _reconcile(state, now, actions)
    config = spec.remove(state.config, members, lost=True)
    state = _publish(
        replace(state, exited=state.exited - gone, desired=min(state.desired, config.size)), config, reason
    )
    return _reconcile(state, now, actions + [Publish(config, reason)])


def _on_host_joined(state: ControllerState, event: HostJoined, now: float) -> Reaction:
    if state.done:
        return state, [Log("warning", f"host {event.address} joined as the job finishes: not used")]
    if event.slots < 1:
        return state, [Log("error", f"host {event.address} offered {event.slots} slots: ignored")]
    known = any(h.address == event.address for h in state.hosts)
    if known:
        return state, [
            Log(
                "warning",
                f"host {event.address} registered again while it is in the job: ignored "
                "(stop its old agent first)",
            )
        ]
    if len(state.hosts) >= state.bounds.max_hosts:
        return state, [
            RefuseHost(
                event.address,
                f"the job has its {state.bounds.max_hosts} host(s) already (the MAX of --nnodes MIN:MAX)",
            )
        ]
    state = replace(
        state,
        hosts=state.hosts + (Host(event.address, event.slots),),
        host_beats={**state.host_beats, event.address: now},
    )
    # a size asked for and not reached yet (no free slot) is what the new slots serve; otherwise
    # the job grows onto them
    unmet = state.desired > len(state.alive_members) + len(state.joiners)
    desired = state.desired if unmet else min(state.bounds.max_np, state.desired + event.slots)
    if not state.bounds.grow_on_join:  # a scheduler places workers there with a resize: nothing moves now
        return state, [
            Log(
                "info",
                f"host {event.address} joined with {event.slots} slot(s); {len(state.hosts)} "
                f"host(s), {state.capacity} slots, used where a resize places workers",
            )
        ]
    actions: list[Action] = [
        Log(
            "info",
            f"host {event.address} joined with {event.slots} slot(s); "
            f"{len(state.hosts)} host(s), {state.capacity} slots: the job "
            f"wants {desired} workers",
        )
    ]
    return _reconcile(replace(state, desired=desired), now, actions)


def _lose_host(state: ControllerState, address: str, reason: str, now: float) -> Reaction:
    """Host ``address`` is gone with its agent: its joiners are dropped and its members leave in
    one version (one failure); its slots leave the pool."""
    if address == state.hosts[0].address or not any(h.address == address for h in state.hosts):
        return state, []
    lost_joiners = {j.id for j in state.joiners if j.host == address}
    members = tuple(w.id for w in state.config.workers if w.host == address)
    state = replace(
        state,
        hosts=tuple(h for h in state.hosts if h.address != address),
        host_beats={k: v for k, v in state.host_beats.items() if k != address},
        joiners=tuple(j for j in state.joiners if j.id not in lost_joiners),
        killed=state.killed - lost_joiners - set(members),
        exited=state.exited - set(members),
        beats={k: v for k, v in state.beats.items() if k not in set(members) | lost_joiners},
    )
    actions: list[Action] = [
        Log(
            "warning",
            f"host {address} is lost ({reason}): {len(members)} worker(s) {list(members)} leave with it",
        )
    ]
    if state.done:
        state = replace(state, exited=state.exited | set(members))
        return _maybe_finish(state, actions)
    if not members:
        return _reconcile(state, now, actions)
    state, more = _count_failure(state, members, 128 + 9, now, f"host {address} lost")
    return state, actions + more


def _on_report(state: ControllerState, event: FailureReported, now: float) -> Reaction:
    if event.version != state.config.version or event.id not in state.config.ids:
        return state, []  # stale: a newer config is already out
    state = replace(
        state,
        reports=state.reports | {event.id},
        failed_step=max(state.failed_step, event.step),
        report_started=state.report_started if state.report_started is not None else now,
    )
    return _judge_suspects(state, now, final=False)


def _judge_suspects(state: ControllerState, now: float, final: bool) -> Reaction:
    """Members that did not report a failure when their peers did: hung (killed) or busy (waited for)."""
    if state.report_started is None:
        return state, []
    if state.done:
        # training has ended: a member that fails now (admitted as the others ran their last step)
        # has nobody left to recover with; rebuilding the groups would repeat for ever
        late = [i for i in state.reports if i in state.alive_members and i not in state.killed]
        kills = [Kill(i, "the job finished before it could train") for i in sorted(late)]
        return replace(state, killed=state.killed | set(late)), kills
    silent = [i for i in state.alive_members if i not in state.reports and i not in state.killed]
    if not silent:
        if state.removed_pending or state.joiners:
            return state, []  # a config is coming anyway
        # everyone failed and nobody is gone (timeouts under load, a busy member back): same
        # members, new groups -- unless that keeps failing at the same step (not transient)
        step, times = state.rebuilds
        rebuilds = (state.failed_step, times + 1 if state.failed_step == step else 1)
        if rebuilds[1] > state.bounds.max_rebuilds:
            return _finish(
                state,
                [],
                f"every worker failed at step {step} in {rebuilds[1]} cluster versions in a "
                "row: rebuilding the groups does not help (the workers' errors say what "
                "failed; collectives timing out on a loaded machine need a larger --timeout)",
            )
        config = spec.ClusterConfig(state.config.version + 1, state.config.workers)
        reason = "every worker reported a failure: rebuild the groups"
        return _publish(replace(state, rebuilds=rebuilds), config, reason), [Publish(config, reason)]
    return judge_silent(state, silent, now, final)


def _on_tick(state: ControllerState, now: float) -> Reaction:
    actions: list[Action] = []
    if (
        state.removed_pending
        and not state.joiners
        and state.short_since is not None
        and now - state.short_since > state.bounds.join_timeout
    ):  # no slot for a replacement anywhere
        return _finish(
            state,
            actions,
            f"below --min-np {state.bounds.min_np}: no free slot for a replacement "
            f"within {state.bounds.join_timeout:g}s",
        )
    late = [j for j in state.joiners if not j.ready and now - j.spawned_at > state.bounds.join_timeout]
    if late:
        ready = tuple(j for j in state.joiners if j.ready)
        late_ids = {j.id for j in late}
        state = replace(
            state,
            joiners=tuple(j for j in state.joiners if j.id not in late_ids),
            killed=state.killed | late_ids,
        )
        actions += [Kill(j.id, f"not ready after {state.bounds.join_timeout:g}s") for j in late]
        survivors = len(state.alive_members)
        if survivors + len(ready) < state.bounds.min_np:
            return _finish(
                state,
                actions,
                f"below --min-np {state.bounds.min_np}: no joiner became "
                f"ready within {state.bounds.join_timeout:g}s",
            )
        state = replace(state, desired=survivors + len(ready))
        if ready or state.removed_pending:
            return _admit(state, ready, actions)
    for address, at in list(state.host_beats.items()):
        silent = now - at
        if silent > state.bounds.host_timeout:
            why = f"its agent has not been heard from for {silent:.1f}s"
        elif (
            state.report_started is not None
            and silent > state.bounds.stale_after
            and any(w.host == address and w.id not in state.reports for w in state.config.workers)
        ):
            why = f"its workers' peers failed and its agent is silent for {silent:.1f}s"
        else:
            continue
        state, more = _lose_host(state, address, why, now)
        actions += more
        if state.finished:
            return state, actions
    if state.report_started is not None and now - state.report_started > state.bounds.suspect_window:
        state, more = _judge_suspects(state, now, final=True)
        actions += more
    if not state.finished:
        state, more = frozen(state, now)
        actions += more
    return state, actions


def _maybe_finish(state: ControllerState, actions: list[Action]) -> Reaction:
    if all(i in state.exited for i in state.config.ids):
        if state.first_failure is not None and not state.done:
            return _finish(state, actions, "the job failed")
        return replace(state, finished=True), actions + [Finish(0, "every worker exited 0")]
    return state, actions


def _finish(state: ControllerState, actions: list[Action], reason: str) -> Reaction:
    failed = state.first_failure
    code = 1
    if failed is not None:
        code = failed[1] if failed[1] > 0 else 128 - failed[1]
    kills = [
        Kill(i, "the job is stopping") for i in list(state.alive_members) + [j.id for j in state.joiners]
    ]
    state = replace(state, finished=True)
    return state, actions + kills + [Finish(code, reason, failed[0] if failed else None)]
