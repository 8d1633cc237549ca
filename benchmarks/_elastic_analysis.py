"""The analysis of ``benchmarks/elastic.py``: pure functions from step-log records to figures.

Records are the dicts that ``_elastic_train.py`` writes, one JSON line each: ``boot`` (wall-clock
times of a process's start-up), ``commit`` (one committed step: its wall-clock ``time``, step,
size, rank; taiji's also carry version, worker and, on the first step after a change, the Job's
``transitions``), ``broadcast`` (torchrun: a state-sized broadcast timed) and ``done``. A stall is
(first commit at the new size - last commit at the old size) - one normal step at the new size.
Nothing here starts a process or reads a file.
"""
from __future__ import annotations

from _common import median

BOOT_STAGES = ("worker_import_s", "rendezvous_s", "build_model_optimizer_s", "checkpoint_load_s", "ddp_init_s")


def select(records: list[dict], event: str, **match) -> list[dict]:
    """The records of one event whose fields equal ``match``, oldest first."""
    found = [r for r in records if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]
    return sorted(found, key=lambda r: r.get("time", r.get("ready", 0.0)))


def step_intervals(commits: list[dict]) -> list[float]:
    """Seconds between consecutive commits."""
    return [b["time"] - a["time"] for a, b in zip(commits, commits[1:])]


def normal_step(after: list[dict], settle: int) -> float:
    """One normal step at a new size: the median interval between its commits, leaving out the
    first commit (which carries the change)."""
    return median(step_intervals(after[:settle + 1])[1:])


def boot_stages(boots: list[dict]) -> dict[str, float]:
    """Where the restarted workers' start-up went, stage by stage (the slowest worker each)."""
    latest = {key: max(b[key] for b in boots) for key in ("imported", "joined", "built", "loaded", "ready")}
    return {"worker_import_s": max(b["imported"] - b["exec"] for b in boots),
            "rendezvous_s": latest["joined"] - latest["imported"],
            "build_model_optimizer_s": latest["built"] - latest["joined"],
            "checkpoint_load_s": latest["loaded"] - latest["built"],
            "ddp_init_s": latest["ready"] - latest["loaded"]}


def taiji_change_figures(records: list[dict], change: dict, settle: int) -> dict:
    """One membership change of a taiji job (``change``: to_version, to_size and the wall-clock
    time it was requested): the running workers' stall and what it is made of."""
    to_version = change["to_version"]
    commits = select(records, "commit")
    stalls, transitions, firsts, per_worker, first_parts, joiners = [], [], [], {}, [], []
    for worker in sorted({c["worker"] for c in commits}):
        mine = [c for c in commits if c["worker"] == worker]
        before = [c for c in mine if c["version"] < to_version]
        after = [c for c in mine if c["version"] == to_version]
        if not after:
            continue
        if not before:
            joiners.append(worker)
            continue
        stall = after[0]["time"] - before[-1]["time"] - normal_step(after, settle)
        # where the first step at the new size spent its time, against a normal step there
        body = [c["time"] - c["began"] for c in after[1:settle + 1]]
        first_parts.append({"to_loop_s": after[0]["began"] - before[-1]["time"],
                            "first_step_body_s": after[0]["time"] - after[0]["began"],
                            "normal_step_body_s": median(body)})
        stalls.append(stall)
        firsts.append(after[0]["time"])
        transitions.append((after[0].get("transitions") or [{}])[-1])
        per_worker[worker] = round(stall, 4)
    if not stalls:
        raise ValueError(f"no worker committed both before and after version {to_version}")
    boots = [b for b in select(records, "boot") if b["worker"] in joiners]
    w0 = [c for c in commits if c["worker"] == "w0"]
    old = [c for c in w0 if c["version"] < to_version][-(settle + 1):]
    new = [c for c in w0 if c["version"] == to_version]
    return {
        "to_size": change["to_size"],
        "stall_s": max(stalls),
        "stall_s_by_worker": per_worker,
        "transition_total_s": max(t.get("total_s", 0.0) for t in transitions),
        "transition_switch_s": max(t.get("switch_s", 0.0) for t in transitions),
        "transition_sync_s": max(t.get("sync_s", 0.0) for t in transitions),
        # commit -> next step handed to the loop (transition included), and that step's own time
        "to_loop_s": max(f["to_loop_s"] for f in first_parts),
        "first_step_extra_s": max(f["first_step_body_s"] - f["normal_step_body_s"] for f in first_parts),
        # not a stall: joiners boot while the running workers keep training
        "request_to_new_size_s": min(firsts) - change["requested"],
        "steps_while_joiners_booted": sum(1 for c in w0 if change["requested"] < c["time"] < min(firsts)),
        "joiner_import_s": max((b["imported"] - b["exec"] for b in boots), default=None),
        "step_ms_before": median(step_intervals(old)) * 1e3,
        "step_ms_after": normal_step(new, settle) * 1e3,
    }


def taiji_fault_figures(records: list[dict], hit: float, survivors: list[str]) -> dict:
    """A taiji job after one worker was killed or stopped at wall-clock ``hit`` (cluster version
    1 before it): seconds to the survivors' next committed step, and what was redone."""
    commits = [c for c in select(records, "commit") if c["worker"] in survivors]
    after = [c for c in commits if c["version"] > 1]
    if not after:
        raise ValueError("no survivor committed a step after the failure")
    first = min(after, key=lambda c: c["time"])
    w0 = [c for c in commits if c["worker"] == "w0"]
    failure = next((t for c in after for t in c.get("transitions", []) if t["reason"] == "failure"), {})
    w0_steps = [c["step"] for c in w0]
    return {
        "resume_s": first["time"] - hit,
        "to_size": first["size"],
        "last_committed_before": max(c["step"] for c in w0 if c["version"] == 1),
        "retried_step": failure.get("step"),
        "transition_total_s": failure.get("total_s"),
        "committed_steps_redone": len(w0_steps) - len(set(w0_steps)),
        "step_ms": median(step_intervals([c for c in w0 if c["version"] == 1])) * 1e3,
    }


def torchrun_change_figures(records: list[dict], change: dict, settle: int) -> dict:
    """One restart of torchrun at a new size (``change``: its launch ``tag``, to_size and the
    wall-clock times of the request, of the old job stopped and of the new agent started)."""
    tag, old_tag = change["tag"], str(int(change["tag"]) - 1)
    old = select(records, "commit", tag=old_tag, rank=0)
    new = select(records, "commit", tag=tag, rank=0)
    boots = select(records, "boot", tag=tag)
    broadcasts = select(records, "broadcast", tag=tag)
    first = new[0]["time"]
    agent_boot = min(b["exec"] for b in boots) - change["agent_started"]
    request_to_first = first - change["requested"]
    return {
        "to_size": change["to_size"],
        "stall_s": first - old[-1]["time"] - normal_step(new, settle),
        "request_to_first_step_s": request_to_first,
        # what its pieces cost (seconds)
        "stop_s": change["stopped"] - change["requested"],
        "agent_boot_s": agent_boot,
        **boot_stages(boots),
        "first_step_s": first - max(b["ready"] for b in boots),
        # a resident elastic agent would not boot itself again
        "without_agent_boot_s": request_to_first - agent_boot,
        "resumed_at": boots[0]["resumed_at"],
        "last_committed_before": old[-1]["step"],
        "step_ms_before": median(step_intervals(old[-(settle + 1):])) * 1e3,
        "step_ms_after": normal_step(new, settle) * 1e3,
        "broadcast_s": median(broadcasts[0]["seconds"]) if broadcasts else None,
        "broadcast_bytes": broadcasts[0]["bytes"] if broadcasts else None,
    }


def torchrun_fault_figures(records: list[dict], hit: float) -> dict:
    """A torchrun job restarted after one worker was killed or stopped at wall-clock ``hit``:
    seconds to the restarted group's first committed step, and what its restart cost."""
    before = select(records, "commit", restart=0)
    after = select(records, "commit", restart=1)
    boots = select(records, "boot", restart=1)
    if not after or not boots:
        raise ValueError("the job did not restart and commit a step")
    last = max(c["step"] for c in before)
    return {
        "resume_s": after[0]["time"] - hit,
        "last_committed_before": last,
        "resumed_at": boots[0]["resumed_at"],
        "committed_steps_redone": last + 1 - boots[0]["resumed_at"],
        "workers_restarted": len(boots),
        "kill_to_worker_exec_s": min(b["exec"] for b in boots) - hit,
        **boot_stages(boots),
        "first_step_s": after[0]["time"] - max(b["ready"] for b in boots),
        "step_ms": median(step_intervals(select(records, "commit", restart=0, rank=0))) * 1e3,
    }


def model_figures(records: list[dict]) -> dict:
    """The model's size, from the first boot record that has it."""
    keys = ("params", "model_state_bytes", "train_state_bytes")
    boot = next((b for b in select(records, "boot") if all(k in b for k in keys)), None)
    return {} if boot is None else {k: boot[k] for k in keys}


def figure(run: dict | None, path: tuple) -> object:
    """``run[path[0]][path[1]]...``; None where a level is missing (a failed or skipped run)."""
    value = run
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def median_over(runs: list[dict], *path) -> float | None:
    """The median of one figure over repetitions; None if no repetition has it."""
    values = [v for v in (figure(run, path) for run in runs) if v is not None]
    return median(values) if values else None


def each_over(runs: list[dict], *path, digits: int = 4) -> list:
    """Each repetition's value of one figure (rounded): the spread behind a median."""
    return [rounded(figure(run, path), digits) for run in runs]


def rounded(value, digits: int = 4):
    return None if value is None else round(value, digits)
