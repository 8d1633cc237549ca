"""The analysis of ``benchmarks/elastic.py``: pure functions from step-log records to figures.

Records are the dicts that ``_elastic_train.py`` writes, one JSON line each: ``boot`` (wall-clock
times of a process's start-up), ``commit`` (one committed step: its wall-clock ``time``, step,
size, rank; taiji's also carry version, worker and, on the first step after a change, the Job's
``transitions``), ``broadcast`` (torchrun: a state-sized broadcast timed), ``draw`` (a step took its
batch) and ``done``; with sample logging, ``draw`` and ``commit`` carry the batch's ``samples`` and
``epoch``. A stall is (first commit at the new size - last commit at the old size) - one normal
step at the new size. Nothing here starts a process or reads a file.
"""

from __future__ import annotations

import re

from taiji_harness.bench import median

BOOT_STAGES = (
    "worker_import_s",
    "rendezvous_s",
    "build_model_optimizer_s",
    "checkpoint_load_s",
    "ddp_init_s",
)


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
    return median(step_intervals(after[: settle + 1])[1:])


def boot_stages(boots: list[dict]) -> dict[str, float]:
    """Where the restarted workers' start-up went, stage by stage (the slowest worker each)."""
    latest = {key: max(b[key] for b in boots) for key in ("imported", "joined", "built", "loaded", "ready")}
    return {
        "worker_import_s": max(b["imported"] - b["exec"] for b in boots),
        "rendezvous_s": latest["joined"] - latest["imported"],
        "build_model_optimizer_s": latest["built"] - latest["joined"],
        "checkpoint_load_s": latest["loaded"] - latest["built"],
        "ddp_init_s": latest["ready"] - latest["loaded"],
    }


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
        body = [c["time"] - c["began"] for c in after[1 : settle + 1]]
        first_parts.append(
            {
                "to_loop_s": after[0]["began"] - before[-1]["time"],
                "first_step_body_s": after[0]["time"] - after[0]["began"],
                "normal_step_body_s": median(body),
            }
        )
        stalls.append(stall)
        firsts.append(after[0]["time"])
        transitions.append((after[0].get("transitions") or [{}])[-1])
        per_worker[worker] = round(stall, 4)
    if not stalls:
        raise ValueError(f"no worker committed both before and after version {to_version}")
    boots = [b for b in select(records, "boot") if b["worker"] in joiners]
    w0 = [c for c in commits if c["worker"] == "w0"]
    old = [c for c in w0 if c["version"] < to_version][-(settle + 1) :]
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
        "step_ms_before": median(step_intervals(old[-(settle + 1) :])) * 1e3,
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


def kill_figures(records: list[dict], hit: float, survivors: set[str]) -> dict:
    """Any side, one worker (or replica group) killed at wall-clock ``hit``: seconds to the
    survivors' next committed step, the committed steps they redid, and the attempts they began
    and threw away on the way (a step begun but not committed with the same batch: taiji retries
    it on the survivors with the whole global batch, torchft skips it)."""
    commits = [c for c in select(records, "commit") if c["worker"] in survivors]
    after = [c for c in commits if c["time"] > hit]
    if not after:
        raise ValueError("no survivor committed a step after the kill")
    resumed = after[0]["time"]
    steps = [c["step"] for c in commits]
    drawn = [
        d for d in select(records, "draw") if d["worker"] in survivors and hit - 1.0 < d["time"] < resumed
    ]
    committed = {(c["worker"], c["step"], tuple(c.get("samples", ()))) for c in commits}
    return {
        "resume_s": resumed - hit,
        "last_committed_before": max((c["step"] for c in commits if c["time"] <= hit), default=None),
        "first_committed_after": after[0]["step"],
        "size_after": after[0]["size"],
        "committed_steps_redone": len(steps) - len(set(steps)),
        "attempts_discarded": sum(
            1 for d in drawn if (d["worker"], d["step"], tuple(d.get("samples", ()))) not in committed
        ),
    }


def join_figures(records: list[dict], requested: float, survivors: set[str], size: int, settle: int) -> dict:
    """Any side, a worker (or replica group) asked for at wall-clock ``requested`` joins survivors
    at ``size``: the survivors' stall (the gap before their first commit at ``size`` - one normal
    step there), the joiner's time from the request to its first committed step, and how long the
    survivors went on training before it."""
    commits = select(records, "commit")
    joiners = {c["worker"] for c in commits if c["worker"] not in survivors and c["time"] > requested}
    if not joiners:
        raise ValueError("no joiner committed a step")
    joiner_first = min(c["time"] for c in commits if c["worker"] in joiners)
    stalls, firsts, steps_before = [], [], []
    for worker in sorted(survivors):
        mine = [c for c in commits if c["worker"] == worker]
        at = [i for i, c in enumerate(mine) if c["time"] > requested and c["size"] == size]
        if not at or at[0] == 0:
            continue
        new, previous = mine[at[0] :], mine[at[0] - 1]
        stalls.append(new[0]["time"] - previous["time"] - normal_step(new, settle))
        firsts.append(new[0]["time"])
        steps_before.append(sum(1 for c in mine[: at[0]] if c["time"] > requested))
    if not stalls:
        raise ValueError(f"no survivor committed a step at size {size} after the request")
    boots = [b for b in select(records, "boot") if b.get("worker") in joiners]
    return {
        "stall_s": max(stalls),
        "joiner_first_step_s": joiner_first - requested,
        "joiner_boot_to_first_step_s": joiner_first - min(b["exec"] for b in boots) if boots else None,
        "request_to_new_size_s": min(firsts) - requested,
        "steps_while_joiner_booted": min(steps_before),
    }


def exactly_once_figures(records: list[dict], killed: set[str]) -> dict:
    """Samples lost or repeated, from the ``draw`` and ``commit`` records' sample indices.

    Repeated: a sample's committed contributions in one epoch beyond its first. Lost: a sample
    drawn for a step that no worker committed with it, in that epoch, by the end of the run. A
    worker's last draw counts only if it was killed (its step can never finish) or it logged
    something after it (the step was done with); the draws in flight when the run stops do not.

    A draw that carries its cluster ``version`` is committed when the drawing worker committed
    that step, or when a peer committed the same step in the same version: every collective of a
    step in a version has every member's share in it, so a worker killed after the step's last
    collective and before its own commit record (fault phase ``commit``) had its share trained by
    the peers' commit. A retry of the step runs in a newer version, so a failed attempt's draw is
    not covered by it."""
    commits = select(records, "commit")
    committed: dict[tuple[int, int], int] = {}
    for c in commits:
        for sample in c["samples"]:
            committed[(c["epoch"], sample)] = committed.get((c["epoch"], sample), 0) + 1
    own = {(c["worker"], c["step"]) for c in commits}  # a worker that adopted its peers' commit logs it too
    by_peers = {(c["step"], c["version"]) for c in commits if "version" in c}
    last_record: dict[str, float] = {}
    for r in records:
        if "worker" in r and "time" in r:
            last_record[r["worker"]] = max(last_record.get(r["worker"], 0.0), r["time"])
    draws = select(records, "draw")
    for d in draws:
        if "version" in d and (d["step"], d["version"]) in by_peers and (d["worker"], d["step"]) not in own:
            for sample in d["samples"]:  # trained in its peers' commit of this step
                committed[(d["epoch"], sample)] = committed.get((d["epoch"], sample), 0) + 1
    lost = set()
    for d in draws:
        if d["worker"] in killed or d["time"] < last_record[d["worker"]]:
            lost.update((d["epoch"], s) for s in d["samples"] if (d["epoch"], s) not in committed)
    once = sum(1 for n in committed.values() if n == 1)
    return {
        "samples_committed": sum(committed.values()),
        "samples_distinct": len(committed),
        "samples_repeated": sum(n - 1 for n in committed.values()),
        "samples_lost": len(lost),
        # of every sample drawn, the share trained on exactly once
        "exactly_once_share": once / (len(committed) + len(lost)) if committed or lost else None,
    }


def exactly_once_audit(records: list[dict], samples_per_epoch: int, epochs: int) -> dict:
    """A finished job's exactly-once audit from its ``draw`` and ``commit`` records (every process
    of every launcher it had): :func:`exactly_once_figures` (none killed: every process ended on
    its own), plus ``missing``: samples of each of its ``epochs`` that no commit trained.
    ``exactly_once``: some process logged, nothing repeated, lost or missing."""
    figures = exactly_once_figures(records, killed=set())
    seen: list[set[int]] = [set() for _ in range(epochs)]
    for commit in select(records, "commit"):
        if commit["epoch"] < epochs:
            seen[commit["epoch"]].update(commit["samples"])
    missing = sum(samples_per_epoch - len(epoch & set(range(samples_per_epoch))) for epoch in seen)
    processes = len({r["worker"] for r in records if "worker" in r})
    return {
        "exactly_once": bool(processes)
        and not (figures["samples_repeated"] or figures["samples_lost"] or missing),
        "processes": processes,
        "repeated": figures["samples_repeated"],
        "lost": figures["samples_lost"],
        "missing": missing,
    }


def worker_error(text: str) -> str:
    """What stopped a worker, from its output: the last exception of its traceback and where it
    was raised, with the exception it was raised while handling (a launcher's own
    ``ChildFailedError`` is left out)."""
    lines = text.splitlines()
    found = [
        i
        for i, ln in enumerate(lines)
        if re.match(r"(\w+\.)*\w*(Error|Exception)\b", ln) and "ChildFailedError" not in ln
    ]
    if not found:
        return lines[-1].strip()[:300] if lines else "no output"
    last = found[-1]
    where = next((ln.strip() for ln in reversed(lines[:last]) if ln.strip().startswith("File ")), "")
    where = re.sub(r'File ".*?([^/]+/[^/]+)", line (\d+), in (\w+)', r"\1:\2 in \3", where)
    message = lines[last].strip()[:300] + (f" at {where}" if where else "")
    if len(found) > 1:
        message += f" (after {lines[found[-2]].strip()[:200]})"
    return message


def samples_per_s(commits: list[dict], batch: int, skip: int = 2) -> float | None:
    """Steady-state throughput of one worker's run of commits (``batch`` samples each step):
    global batch / median interval, leaving out the first ``skip`` intervals."""
    intervals = step_intervals(commits)[skip:]
    return batch / median(intervals) if intervals else None


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
