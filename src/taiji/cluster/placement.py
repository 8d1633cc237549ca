"""Where a job's workers go among its hosts (pure, for the membership controller,
:mod:`~taiji.cluster.controller`): whether a scheduler's placed proposal can be honoured, the hosts
new workers are spawned on, and the members a shrink drops.

Without a placement, joiners take the oldest hosts' free slots first and a shrink drops the newest
members (so the newest host empties first). A placement (a scheduler's workers per host) only adds
or only removes: joiners go where it wants more than run, and a shrink drops the newest members of
the hosts that hold more than it wants.
"""

from __future__ import annotations

from .control_events import Proposal
from .control_state import ControllerState


def check_placement(state: ControllerState, event: Proposal) -> str:
    """Why a placed proposal cannot be honoured ('' if it can)."""
    slots = {h.address: h.slots for h in state.hosts}
    wanted = dict(event.placement)
    if len(wanted) != len(event.placement):
        return "it names a host twice"
    if sum(wanted.values()) != event.size:
        return f"its hosts' workers add up to {sum(wanted.values())}, not {event.size}"
    if event.size > state.bounds.max_np:
        return f"{event.size} workers exceed --max-np {state.bounds.max_np}"
    for address, count in wanted.items():
        if address not in slots:
            return f"host {address} is not one of this job's hosts ({', '.join(slots)})"
        if not 0 <= count <= slots[address]:
            return f"host {address} has {slots[address]} slot(s), not {count}"
    if state.joiners:
        return "workers are still joining from an earlier change; ask again once it has landed"
    more = [h for h in slots if wanted.get(h, 0) > state.used_slots(h)]
    fewer = [h for h in slots if wanted.get(h, 0) < state.used_slots(h)]
    if more and fewer:
        return (
            f"it moves workers between hosts (more on {', '.join(more)}, fewer on {', '.join(fewer)}); "
            f"ask for the shrink first, then the grow"
        )
    return ""


def place(state: ControllerState, count: int) -> list[str]:
    """Hosts for ``count`` new workers: where the placement wants more than run there, else the
    oldest hosts' free slots first (fewer if full)."""
    placed: list[str] = []
    for host in state.hosts:
        free = host.slots - state.used_slots(host.address)
        wanted = state.wanted_on(host.address)
        if wanted is not None:
            free = min(free, wanted - state.used_slots(host.address))
        placed += [host.address] * max(0, min(free, count - len(placed)))
    return placed


def leavers(state: ControllerState, count: int) -> list[str]:
    """``count`` members to drop in a shrink: the newest on hosts holding more than the placement
    wants there, then the newest anywhere (without a placement: the newest)."""
    alive = set(state.alive_members)
    members = [w for w in state.config.workers if w.id in alive]
    leaving: list[str] = []
    if state.placement:
        surplus = {
            h.address: state.used_slots(h.address) - (state.wanted_on(h.address) or 0) for h in state.hosts
        }
        for worker in reversed(members):
            if len(leaving) < count and surplus.get(worker.host, 0) > 0:
                leaving.append(worker.id)
                surplus[worker.host] -= 1
    for worker in reversed(members):
        if len(leaving) < count and worker.id not in leaving:
            leaving.append(worker.id)
    return leaving
