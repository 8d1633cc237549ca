"""Prometheus metric families of a job and of the live scheduler, as plain data.

Pure functions: a launcher's status snapshot (what `taiji status` shows, rank 0's last status
record inside it) and a tally of the controller's actions become ``Family`` values; the
scheduler's ``state.json``-shaped record becomes the scheduler's. Nothing here imports
``prometheus_client`` or touches a socket: launch/metrics_http.py turns families into the
client's metric objects and serves them.

Names follow Prometheus's conventions: a ``taiji_`` prefix, base units in the name (``_seconds``),
``_total`` for counters, one ``job_id`` label on every job series (not ``job``: Prometheus gives that label to
the scrape target) (and ``host`` / ``state`` / ``kind`` / ``reason`` where a family is split).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GAUGE, COUNTER = "gauge", "counter"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Family:
    """One metric family: ``samples`` are (labels, value) pairs; a counter's name has no ``_total``
    here (the client adds it on exposition)."""

    name: str
    kind: str
    help: str
    samples: tuple[tuple[Labels, float], ...] = ()

    @property
    def exposed_name(self) -> str:
        return f"{self.name}_total" if self.kind == COUNTER else self.name


# -- what the controller did, counted -----------------------------------------------------

# Membership changes, by what the controller's ``Publish`` reason says (cluster/controller.py).
RESIZE_REASONS = ("grow", "shrink", "leave")
RECOVERY_REASONS = ("failure", "rebuild")
# Workers stopped by the controller, by its ``Kill`` reason.
HANG_REASONS = ("hang", "frozen", "busy_timeout")


def change_kind(reason: str) -> tuple[str, str] | None:
    """("resize" | "recovery", reason label) of a published config's reason; None for the start."""
    if reason.startswith("grow"):
        # a grow that also drops failed members (below --min-np, --replace) is a recovery
        return ("recovery", "failure") if "drop failed" in reason else ("resize", "grow")
    if reason.startswith("shrink"):
        return "resize", "shrink"
    if "exited 0 and leaves" in reason:
        return "resize", "leave"
    if reason.startswith("drop failed"):
        return "recovery", "failure"
    if "rebuild the groups" in reason:
        return "recovery", "rebuild"
    if reason == "start":
        return None
    return "resize", "other"


def kill_kind(reason: str) -> str | None:
    """Why the controller stopped a worker, as a label; None for stops that are not faults."""
    if reason.startswith("suspected hang"):
        return "hang"
    if reason.startswith("no heartbeat"):
        return "frozen"
    if reason.startswith("busy outside training"):
        return "busy_timeout"
    return None


@dataclass(frozen=True)
class Tally:
    """Counts of the controller's membership changes and fault stops, and the workers it stopped
    as hung (``hung_ids``: a worker counts as hung while it is still in the config)."""

    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)
    hung_ids: frozenset[str] = frozenset()

    def published(self, reason: str) -> Tally:
        kind = change_kind(reason)
        return self if kind is None else self._add(kind)

    def killed(self, worker_id: str, reason: str) -> Tally:
        kind = kill_kind(reason)
        if kind is None:
            return self
        tally = self._add(("kill", kind))
        return Tally(tally.counts, tally.hung_ids | {worker_id})

    def _add(self, key: tuple[str, str]) -> Tally:
        counts = dict(self.counts)
        counts[key] = counts.get(key, 0) + 1
        return Tally(counts, self.hung_ids)

    def count(self, kind: str, reason: str) -> int:
        return self.counts.get((kind, reason), 0)


# -- a job --------------------------------------------------------------------------------

# rank 0's status record: (field, metric name, help, scale)
_PROGRESS = (
    ("step", "taiji_job_step", "Committed steps (rank 0's last status record)", 1.0),
    ("epoch", "taiji_job_epoch", "Epoch of the last committed step", 1.0),
    (
        "samples_per_s",
        "taiji_job_samples_per_second",
        "Samples trained per second (over the last status window)",
        1.0,
    ),
    ("step_s", "taiji_job_step_seconds", "Wall time of the last committed step", 1.0),
    (
        "allreduce_wait_s",
        "taiji_job_allreduce_wait_seconds",
        "What the last step waited after backward for its averaged gradients",
        1.0,
    ),
    ("gns", "taiji_job_gradient_noise_scale", "Gradient noise scale B_noise (samples)", 1.0),
    ("batch_size", "taiji_job_batch_size", "Global batch size decided for the next step (samples)", 1.0),
    ("lr", "taiji_job_learning_rate", "Learning rate of the first parameter group", 1.0),
    ("loss", "taiji_job_loss", "Global mean loss of the last committed step", 1.0),
    ("straggler", "taiji_job_straggler_ratio", "Slowest worker's compute time over the median's", 1.0),
    ("position", "taiji_job_samples_trained", "Samples trained since the start (epoch x N + cursor)", 1.0),
    ("time", "taiji_job_status_timestamp_seconds", "Unix time of rank 0's last status record", 1.0),
    (
        "checkpoint_step",
        "taiji_job_checkpoint_step",
        "Step of the last checkpoint taken (its write may be in flight)",
        1.0,
    ),
    (
        "checkpoint_stall_s",
        "taiji_job_checkpoint_stall_seconds",
        (
            "What taking the last checkpoint held rank 0's training loop "
            "(staging; the write is in the background)"
        ),
        1.0,
    ),
    (
        "checkpoint_time",
        "taiji_job_checkpoint_timestamp_seconds",
        "Unix time the last checkpoint was taken: its age is time() minus this",
        1.0,
    ),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def job_families(snapshot: Mapping[str, Any], tally: Tally = Tally()) -> list[Family]:
    """The job's families from a launcher's status snapshot (driver.Driver.snapshot) and the
    tally of its controller's actions. A value rank 0 has not reported yet is left out."""
    job = str(snapshot.get("job", ""))
    one: Labels = (("job_id", job),)

    def gauge(name: str, help_: str, value: Any) -> Family:
        number = _number(value)
        return Family(name, GAUGE, help_, () if number is None else ((one, number),))

    workers = list(snapshot.get("workers") or [])
    families = [
        gauge("taiji_job_cluster_size", "Workers in the latest published cluster config", len(workers)),
        gauge(
            "taiji_job_cluster_version",
            "Version of the latest published cluster config",
            snapshot.get("version"),
        ),
        gauge(
            "taiji_job_joining_workers",
            "Workers booting to join the next config",
            len(snapshot.get("joiners") or []),
        ),
        gauge("taiji_job_desired_workers", "Workers the job is asked to run", snapshot.get("desired")),
        gauge("taiji_job_min_workers", "--min-np", snapshot.get("min_np")),
        gauge("taiji_job_max_workers", "--max-np", snapshot.get("max_np")),
        gauge(
            "taiji_job_busy_workers",
            "Members busy outside a collective while their peers wait",
            len(snapshot.get("busy") or []),
        ),
        gauge(
            "taiji_job_hung_workers",
            "Members stopped as hung or frozen and not yet out of the config",
            len(tally.hung_ids & set(workers)),
        ),
        Family(
            "taiji_job_failures",
            COUNTER,
            "Failures counted against --max-failures",
            ((one, float(snapshot.get("failures") or 0)),),
        ),
        Family(
            "taiji_job_resizes",
            COUNTER,
            "Membership changes that are not recoveries, by reason",
            tuple(
                ((("job_id", job), ("reason", r)), float(tally.count("resize", r)))
                for r in RESIZE_REASONS + ("other",)
            ),
        ),
        Family(
            "taiji_job_recoveries",
            COUNTER,
            "New configs published to recover from a failure, by reason",
            tuple(
                ((("job_id", job), ("reason", r)), float(tally.count("recovery", r)))
                for r in RECOVERY_REASONS
            ),
        ),
        Family(
            "taiji_job_worker_kills",
            COUNTER,
            "Workers the launcher stopped as faulty, by reason",
            tuple(((("job_id", job), ("reason", r)), float(tally.count("kill", r))) for r in HANG_REASONS),
        ),
    ]
    hosts = snapshot.get("hosts") or []
    families.append(
        Family(
            "taiji_job_host_slots",
            GAUGE,
            "Worker slots each host of the job offers",
            tuple(((("job_id", job), ("host", str(h[0]))), float(h[1])) for h in hosts),
        )
    )
    families.append(
        Family(
            "taiji_job_host_workers",
            GAUGE,
            "Workers of the job on each host",
            tuple(((("job_id", job), ("host", str(h[0]))), float(h[2])) for h in hosts),
        )
    )
    progress = snapshot.get("progress") or {}
    for key, name, help_, scale in _PROGRESS:
        value = _number(progress.get(key))
        families.append(gauge(name, help_, None if value is None else value * scale))
    return families


# -- the scheduler ------------------------------------------------------------------------

JOB_STATES = ("queued", "running", "suspended", "finished", "failed", "cancelled")
DECISIONS = ("start", "grow", "shrink", "move")


def sched_families(
    reply: Mapping[str, Any], rounds: int, round_seconds: float | None, decisions: Mapping[str, int]
) -> list[Family]:
    """The scheduler's families from its status reply (``Scheduler.to_json()`` with ``host_names``
    and ``up``, what `taiji sched status` prints), the rounds run, the last round's decision time
    and the decisions applied so far by kind."""
    jobs = list(reply.get("jobs") or [])
    names = [str(n) for n in (reply.get("host_names") or ["127.0.0.1"])]
    up = list(reply.get("up") or [True] * len(names))
    slots = int(reply.get("slots", 0))
    asked = reply.get("asked") or {}
    by_state = {s: 0 for s in JOB_STATES}
    used = [0] * len(names)
    running = []
    for job in jobs:
        by_state[str(job["state"])] = by_state.get(str(job["state"]), 0) + 1
        if job["state"] != "running":
            continue
        placement = list(job.get("placement") or [])
        if not any(placement):  # one host, or not placed yet: all on its home host
            placement = [0] * len(names)
            placement[max(int(job.get("home", 0)), 0) % len(names)] = int(job.get("size", 0))
        used = [u + int(n) for u, n in zip(used, placement)]
        end, position, speed = job.get("end") or 0, job.get("position") or 0, job.get("samples_per_s") or 0.0
        target = sum(asked[job["id"]][0]) if job["id"] in asked else int(job.get("size", 0))
        running.append(
            (
                (("job_id", str(job["id"])), ("name", str(job.get("name", "")))),
                int(job.get("size", 0)),
                target,
                (end - position) / speed if end and speed > 0 else None,
            )
        )
    return [
        Family(
            "taiji_sched_jobs",
            GAUGE,
            "Jobs the scheduler knows, by state",
            tuple(((("state", s),), float(n)) for s, n in sorted(by_state.items())),
        ),
        Family(
            "taiji_sched_host_slots",
            GAUGE,
            "Worker slots of each host",
            tuple(((("host", h),), float(slots)) for h in names),
        ),
        Family(
            "taiji_sched_host_slots_used",
            GAUGE,
            "Slots running jobs' workers take on each host",
            tuple(((("host", h),), float(n)) for h, n in zip(names, used)),
        ),
        Family(
            "taiji_sched_host_slots_free",
            GAUGE,
            "Slots free on each host (0 while the host is down)",
            tuple(
                ((("host", h),), float(max(slots - n, 0) if ok else 0)) for h, n, ok in zip(names, used, up)
            ),
        ),
        Family(
            "taiji_sched_host_up",
            GAUGE,
            "1 while the host takes jobs (its agent polls)",
            tuple(((("host", h),), 1.0 if ok else 0.0) for h, ok in zip(names, up)),
        ),
        Family("taiji_sched_rounds", COUNTER, "Scheduling rounds run", (((), float(rounds)),)),
        Family(
            "taiji_sched_round_seconds",
            GAUGE,
            "Time the last round's policy took to decide",
            () if round_seconds is None else (((), float(round_seconds)),),
        ),
        Family(
            "taiji_sched_decisions",
            COUNTER,
            "Allocation changes applied, by kind",
            tuple(((("kind", k),), float(decisions.get(k, 0))) for k in DECISIONS),
        ),
        Family(
            "taiji_sched_job_workers",
            GAUGE,
            "Workers each running job has",
            tuple((labels, float(size)) for labels, size, _, _ in running),
        ),
        Family(
            "taiji_sched_job_target_workers",
            GAUGE,
            "Workers each running job is asked to reach",
            tuple((labels, float(target)) for labels, _, target, _ in running),
        ),
        Family(
            "taiji_sched_job_estimated_finish_seconds",
            GAUGE,
            "Seconds until each running job ends at its current samples/s (jobs that report their end)",
            tuple((labels, float(eta)) for labels, _, _, eta in running if eta is not None),
        ),
    ]
