"""The live scheduler's state and decisions (pure): submissions, observations and time in,
changes out — like ``cluster/controller.py`` for one job. ``launch/sched/daemon.py`` does the effects
(launching jobs, reading their launchers, proposing resizes, the request socket).

``hosts`` identical hosts of ``slots`` slots each (one host: its cores); a placement is workers
per host (index = host). Each round the jobs' measured step times refit their models
(:mod:`taiji.sched.live`), the simulator's policy allocates on the hosts that are up, targets are
clamped to each job's ``[min_np, max_np]`` and :class:`~taiji.sched.rounds.Rounds` turns them into
shrinks first, grows after. A job the policy gives no slot stays queued.

**Suspend and resume.** A running job the policy gives fewer than its ``min_np`` is *suspended*
(target 0: its launcher checkpoints at the next step boundary and exits 75) when
:func:`~taiji.sched.preemption.may_suspend` allows it (preemptible, the hysteresis and the bound on
suspensions per hour), else kept at its minimum. A suspended job waits like a queued one and
resumes from its checkpoint (``--resume auto``) at whatever size and on whatever host a later round
gives it. Its slots are free only once its launcher is gone. A waiting job of a higher ``priority``
class suspends lower ones when that lets its ``min_np`` start
(:func:`~taiji.sched.preemption.priority_victims`). Each job's suspend/resume cost is measured
(checkpoint stall + boot + load until its first step); until one is, it is a typical job's, else the
job's own measured boot (launch to first step), else a typical boot. A job *starts on one host* (its
launcher's, the ``home`` the policy gave the most workers) and grows onto others by placed resizes in
later rounds, so its ``min_np`` must fit one host. A host that is down offers no slots: the policy
does not see it.

The state is plain data (``to_json``/``from_json``): a restarted daemon loads it and re-adopts
the jobs whose launchers still run.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ..errors import ConfigError
from .cluster import Cluster
from .goodput import BatchStats, batch_range
from .live import live_view, policy_application, seconds_per_sample, typical
from .livejob import ENDED, LiveJob, Observed, last_start, seconds_left, size_key
from .policy import Policy
from .preemption import Running, SuspendRules, may_suspend, priority_victims
from .rounds import Ask, Change, Rounds

log = logging.getLogger(__name__)

KEEP_MEASUREMENTS = 8  # recent step times kept per size
KEEP_ROUNDS = 1800  # the times of the latest rounds that ran the policy (a replay's rounds)
GUESS_BATCH = 128  # a queued job's batch and work are unknown until it reports them
# (the work from `submit --work` if given; else a typical job's)
GUESS_SAMPLES = 60000
GUESS_SECONDS_PER_SAMPLE = 1e-3
DEFAULT_RULES = SuspendRules()  # when to suspend a job, unless the daemon is told otherwise


class Scheduler:
    def __init__(
        self,
        slots: int,
        policy: Policy,
        shrink_timeout: float = 30.0,
        hosts: int = 1,
        rules: SuspendRules = DEFAULT_RULES,
    ):
        if slots < 1 or hosts < 1:
            raise ConfigError(f"the scheduler needs at least one host with one slot, got {hosts} x {slots}")
        self.slots_per_host = slots
        self.hosts = hosts
        self.slots = slots * hosts
        self.policy = policy
        self.rules = rules
        self.up = [True] * hosts
        self.rounds = Rounds(slots=(slots,) * hosts, shrink_timeout=shrink_timeout)
        self.jobs: dict[str, LiveJob] = {}
        self.next_id = 1
        self.round_times: list[float] = []  # when the latest rounds ran the policy (KEEP_ROUNDS of them)

    # -- what happens to jobs -------------------------------------------------------------------

    def submit(
        self,
        now: float,
        command: list[str],
        min_np: int = 1,
        max_np: int | None = None,
        np: int | None = None,
        weight: float = 1.0,
        name: str = "",
        cwd: str = "",
        work: int = 0,
        priority: int = 0,
        preemptible: bool = True,
        checkpoint_dir: str = "",
        checkpoint_every: str = "",
        max_batch: int = 0,
    ) -> LiveJob:
        """Queue a job; ConfigError (with the reason) for one that can never run here."""
        max_np = self.slots if max_np is None else max_np
        if not command:
            raise ConfigError("submit needs a command to run (taiji sched submit -- python train.py ...)")
        if min_np < 1 or max_np < min_np:
            raise ConfigError(f"need 1 <= min_np <= max_np, got min_np={min_np}, max_np={max_np}")
        if min_np > self.slots_per_host:
            where = "" if self.hosts == 1 else " per host (a job starts on one host)"
            raise ConfigError(
                f"the job needs at least {min_np} workers but this scheduler has "
                f"{self.slots_per_host} slot(s){where}: it could never run (lower --min-np or add slots)"
            )
        if not (math.isfinite(weight) and weight > 0):
            raise ConfigError(f"weight must be a number > 0, got {weight}")
        if work < 0 or max_batch < 0:
            raise ConfigError(
                f"work and max_batch must be >= 0 samples (0: unknown), got {work}, {max_batch}"
            )
        requested = min(max_np, self.slots) if np is None else np
        if not min_np <= requested <= max_np or requested > self.slots:
            raise ConfigError(
                f"-np {requested} must lie in [min_np={min_np}, max_np={max_np}] and fit {self.slots} slot(s)"
            )
        job_id = f"s{self.next_id:04d}"
        self.next_id += 1
        job = LiveJob(
            job_id,
            name or job_id,
            list(command),
            min_np,
            max_np,
            requested,
            weight,
            now,
            cwd=cwd,
            work_hint=work,
            priority=int(priority),
            preemptible=bool(preemptible),
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            max_batch=int(max_batch),
        )
        self.jobs[job_id] = job
        return job

    def observe(self, now: float, job_id: str, seen: Observed) -> None:
        job = self.jobs[job_id]
        if not job.active:
            return
        if job.state == "queued":
            job.state, job.started = "running", now
        fresh = seen.step > job.step  # a status its rank 0 wrote since the last read
        steady = seen.version == job.version and seen.size == job.size
        if fresh and steady and seen.samples_per_s > 0 and seen.batch_size > 0 and seen.size > 0:
            times = job.measured.setdefault(f"{seen.size}@{seen.batch_size}", [])
            times.append(seen.batch_size / seen.samples_per_s)
            del times[:-KEEP_MEASUREMENTS]
        if seen.size != job.size:
            job.allocations.append((now, seen.size))
        placement = list(seen.placement) or [
            seen.size if h == max(job.home, 0) else 0 for h in range(self.hosts)
        ]
        if job.booting and not (fresh and seen.size) and len(job.placement) == len(placement):
            # no step yet since it (re)started: a worker a shrink took out of its cluster is still a
            # process booting, and leaves only at the first step boundary; its slot is not free yet
            placement = [max(a, b) for a, b in zip(placement, job.placement, strict=False)]
        job.placement = placement
        if (
            job.booting and fresh and seen.size and job.resumed is not None
        ):  # its first step since (re)starting
            job.boots = (job.boots + [now - job.resumed])[-KEEP_MEASUREMENTS:]
            job.booting = False
        if job.growing is not None and seen.size > job.size:  # a grow's joiners arrived
            job.joins, job.growing = (job.joins + [now - job.growing])[-KEEP_MEASUREMENTS:], None
        if (
            job.stall is not None and fresh and seen.size and job.resumed is not None
        ):  # its first step since resuming
            job.costs = (job.costs + [job.stall + now - job.resumed])[-KEEP_MEASUREMENTS:]
            job.stall = None
        job.size, job.version, job.step = seen.size, seen.version, seen.step
        job.batch_size = seen.batch_size or job.batch_size
        job.position, job.end, job.samples_per_s = seen.position, seen.end or job.end, seen.samples_per_s

    def read_run_log(self, job_id: str, stats: BatchStats | None) -> None:
        """What its run log says of its batch and gradient noise
        (:func:`~taiji.sched.goodput.batch_stats`)."""
        job = self.jobs[job_id]
        if stats is None or not job.active:
            return
        job.init_batch = job.init_batch or stats.init_batch  # a resumed run's log continues the same file
        job.largest_batch = max(job.largest_batch, stats.largest)
        job.noise_scale = stats.noise_scale if stats.noise_scale is not None else job.noise_scale

    def launched(self, now: float, job_id: str, home: int = 0) -> None:
        """Its launcher started (or a suspended job's started again) on host ``home`` (no workers
        reported yet)."""
        job = self.jobs[job_id]
        if job.state in ("queued", "suspended"):
            job.state, job.home, job.resumed, job.booting = "running", home, now, True
            job.launches.append(now)
            job.started = job.started if job.started is not None else now

    def suspending_job(self, now: float, job_id: str) -> None:
        """Its launcher was asked to checkpoint and stop."""
        self.jobs[job_id].suspending = now

    def suspended(self, now: float, job_id: str, step: int, reason: str = "") -> None:
        """Its launcher is gone, with a checkpoint at ``step`` to resume from: it waits for slots
        again (``reason``: why, when it was not asked to — e.g. its home host was lost)."""
        job = self.jobs[job_id]
        if not job.active:
            return
        if job.suspending is not None:
            job.suspensions.append(now)
            job.stall = now - job.suspending
            job.stalls = (job.stalls + [job.stall])[-KEEP_MEASUREMENTS:]
        else:
            job.stall = 0.0
        if job.size:
            job.allocations.append((now, 0))
        job.state, job.reason, job.suspending, job.stopped_at = "suspended", reason, None, step
        self.rounds.asked.pop(job_id, None)  # its launcher is gone: nothing it was asked can still arrive
        job.size, job.placement, job.home, job.version, job.step = 0, [], -1, 0, step
        job.growing = None

    def suspend_cost(self, job: LiveJob) -> float:
        """Its suspend + resume seconds: measured, else a typical job's, else its own measured boot
        (launch to first step: a resume pays at least that), else a typical job's boot, else the
        rules' guess."""
        if job.costs:
            return statistics.median(job.costs)
        typical = self._typical(lambda j: statistics.median(j.costs) if j.costs else 0.0, 0.0)
        if typical:
            return typical
        return self.boot_cost(job)

    def boot_cost(self, job: LiveJob) -> float:
        """Seconds from its launch to its first step: its own measured boots, else a typical
        job's, else the rules' guess."""
        if job.boots:
            return statistics.median(job.boots)
        return self._typical(
            lambda j: statistics.median(j.boots) if j.boots else 0.0, self.rules.guess_cost_s
        )

    def may_suspend(self, job: LiveJob, now: float) -> bool:
        return (
            job.state == "running"
            and job.size > 0
            and job.suspending is None
            and bool(job.checkpoint_dir)
            and may_suspend(
                job.preemptible,
                job.suspensions,
                last_start(job, now),
                now,
                self.suspend_cost(job),
                self.rules,
                trained=job.step > max(job.stopped_at, 0),
                left_s=seconds_left(job),
                resumed=job.stopped_at >= 0,
            )
        )

    def ended(self, now: float, job_id: str, state: str, reason: str = "") -> None:
        if state not in ENDED:
            raise ConfigError(f"a job ends as one of {ENDED}, not {state!r}")
        job = self.jobs[job_id]
        if not job.active:
            return
        job.state, job.reason, job.ended = state, reason, now
        if job.size:
            job.allocations.append((now, 0))
        job.size, job.placement = 0, []

    def host_state(self, host: int, up: bool) -> None:
        """A host's agent came (back) or went silent: its slots join or leave the pool (the jobs
        running there shrink through their own recovery)."""
        self.up[host] = up
        self.rounds.slots = tuple(self.slots_per_host if u else 0 for u in self.up)

    # -- rounds ---------------------------------------------------------------------------------

    def holds(self) -> dict[str, tuple[int, ...]]:
        zero = (0,) * self.hosts
        return {
            job.id: tuple(job.placement) if job.placement else zero
            for job in self.jobs.values()
            if job.active
        }

    def round(self, now: float) -> list[Change]:
        """Run the policy on every active job and start applying its targets."""
        active = [job for job in self.jobs.values() if job.active]
        if not active:
            return []
        live = [h for h in range(self.hosts) if self.up[h]]
        if not live:
            return []
        self.round_times = (self.round_times + [now])[-KEEP_ROUNDS:]
        views = [self.view_of(job, now, live) for job in active]
        cluster = Cluster(
            num_hosts=len(live), gpus_per_host=self.slots_per_host, cpus_per_host=self.slots_per_host
        )
        allocations = self.policy.allocate(now, cluster, views)
        targets: dict[str, tuple[int, ...]] = {}
        zero = (0,) * self.hosts
        for job in active:
            given = allocations.get(job.id)
            placement = [0] * self.hosts
            for index, count in enumerate(given.placement if given is not None else ()):
                placement[live[index]] = count
            if job.state == "running":
                if job.suspending is not None:
                    continue  # on its way out: it keeps its ask
                if sum(placement) < job.min_np and self.may_suspend(job, now):
                    targets[job.id] = zero
                else:
                    targets[job.id] = clamp(
                        placement, job.min_np, job.max_np, self.holds()[job.id], job.home, self.rounds.slots
                    )
            elif sum(placement) >= job.min_np:  # else it stays queued (or suspended)
                targets[job.id] = start_on_one_host(placement, job.max_np, self.slots_per_host)
        self._keep_for_lower_classes(active, targets)
        self._preempt_for_priority(now, active, targets)
        active_ids = {job.id: job for job in active}
        return self._note_grows(
            now,
            self.rounds.start(
                now, self.holds(), targets, {j: active_ids[j].min_np for j in targets}, self.versions()
            ),
        )

    def _note_grows(self, now: float, changes: list[Change]) -> list[Change]:
        """When each running job was asked to grow (what its joiners' arrival is timed from)."""
        for change in changes:
            job = self.jobs[change.job]
            if job.state == "running" and job.size:
                job.growing = (job.growing or now) if change.kind == "grow" else None
        return changes

    def _keep_for_lower_classes(self, active: list[LiveJob], targets: dict[str, tuple[int, ...]]) -> None:
        """A policy's 0 suspends a job only for a job of its class or a higher one: if every job
        the round starts or grows is of a lower class, the job keeps its minimum instead."""
        holds = self.holds()
        gaining = [j.priority for j in active if j.id in targets and sum(targets[j.id]) > sum(holds[j.id])]
        for job in active:
            if job.state == "running" and job.id in targets and not any(targets[job.id]) and job.size:
                if not any(p >= job.priority for p in gaining):
                    targets[job.id] = clamp(
                        [0] * self.hosts, job.min_np, job.max_np, holds[job.id], job.home, self.rounds.slots
                    )

    def _preempt_for_priority(
        self, now: float, active: list[LiveJob], targets: dict[str, tuple[int, ...]]
    ) -> None:
        """Waiting jobs left without their ``min_np``, highest class first: waiting jobs of lower
        classes do not start before it, and the fewest lower-class running jobs whose suspension
        lets it start on one host are suspended (gang-aware: nobody if it would not start)."""
        zero = (0,) * self.hosts
        holds = self.holds()
        for job in sorted(
            (j for j in active if j.state in ("queued", "suspended") and j.id not in targets),
            key=lambda j: (-j.priority, j.submitted),
        ):
            if not any(other.priority < job.priority for other in active):
                continue  # the policy's choice stands among equals
            for lower in active:  # they yield to it
                if lower.state in ("queued", "suspended") and lower.priority < job.priority:
                    targets.pop(lower.id, None)
            running = [
                Running(j.id, j.priority, True, targets.get(j.id, holds[j.id]), last_start(j, now))
                for j in active
                if j.state == "running"
                and j.priority < job.priority
                and targets.get(j.id) != zero
                and self.may_suspend(j, now)
            ]
            used = [
                sum(max(holds[j][h], targets.get(j, holds[j])[h]) for j in holds) for h in range(self.hosts)
            ]
            free = [max(0, cap - u) for cap, u in zip(self.rounds.slots, used, strict=False)]
            found = priority_victims(job.min_np, job.priority, free, running)
            if not found:
                continue
            host, victims = found
            for victim in victims:
                targets[victim] = zero
            room = free[host] + sum(holds[v][host] for v in victims)
            targets[job.id] = tuple(min(job.max_np, room) if h == host else 0 for h in range(self.hosts))

    def tick(self, now: float) -> list[Change]:
        return self._note_grows(now, self.rounds.tick(now, self.holds(), self.versions()))

    def versions(self) -> dict[str, int]:
        return {job.id: job.version for job in self.jobs.values() if job.active}

    def request_failed(self, job_id: str) -> None:
        """A change never reached the job's launcher: the next round asks again."""
        self.rounds.withdraw(job_id)
        self.jobs[job_id].growing = None

    def view_of(self, job: LiveJob, now: float | None = None, live: list[int] | None = None):  # noqa: ANN202
        """What the policy sees of ``job`` (a :class:`~taiji.sched.policy.JobView`): its fitted model,
        goodput (its batch range and noise scale, :mod:`~taiji.sched.goodput`), work, progress, suspend
        cost and its placement on the ``live`` hosts (default: all)."""
        measured = job.measurements()
        batch = job.batch_size or self._typical(lambda j: j.batch_size, GUESS_BATCH)
        init, largest = batch_range(job.stats(), batch, job.max_batch)
        # never measured: a typical job's speed (its own at another batch, if it measured one:
        # a goodput job that just changed it)
        per_sample = (
            0.0
            if measured
            else (
                self._seconds_per_sample(job)
                or self._typical(self._seconds_per_sample, GUESS_SECONDS_PER_SAMPLE)
            )
        )
        work = job.end or job.work_hint or self._typical(lambda j: j.end or j.work_hint, GUESS_SAMPLES)
        app = policy_application(
            job.id,
            measured,
            per_sample,
            batch,
            work,
            min(job.max_np, self.slots),
            init,
            largest,
            job.noise_scale,
        )
        live = list(range(self.hosts)) if live is None else live
        held = self.holds().get(job.id, (0,) * self.hosts)
        placement = tuple(held[h] for h in live) if any(held[h] for h in live) else None
        held = job.allocations + ([(now, 0)] if now is not None and job.allocations else [])
        attained = sum(
            (b[0] - a[0]) * a[1] for a, b in zip(held, held[1:], strict=False)
        )  # worker-seconds so far
        return live_view(
            app,
            job.submitted,
            job.requested,
            job.position / app.init_batch_size,
            placement,
            attained_worker_s=attained,
            peak_replicas=max((n for _, n in job.allocations), default=0),
            weight=job.weight,
            restarts=len(job.suspensions),
            batch_now=batch,
            suspend_cost_s=self.suspend_cost(job) if job.state == "running" else None,
        )

    def _typical(self, read, default: float):  # noqa: ANN001, ANN202
        return typical((read(j) for j in self.jobs.values()), default)

    @staticmethod
    def _seconds_per_sample(job: LiveJob) -> float:
        """Worker-seconds per sample, from its fastest measured size (0 when never measured)."""
        return seconds_per_sample(
            (*size_key(k, job.batch_size), statistics.median(t)) for k, t in job.measured.items() if t
        )

    # -- persistence ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "slots": self.slots_per_host,
            "hosts": self.hosts,
            "next_id": self.next_id,
            "rounds": self.round_times,
            "jobs": [asdict(j) for j in self.jobs.values()],
            "asked": {
                job: [list(a.target), list(a.reserve), a.shrink] for job, a in self.rounds.asked.items()
            },
        }

    def load_json(self, data: Mapping[str, Any]) -> None:
        """Jobs and outstanding asks of a previous daemon (its slots must be ours)."""
        shape = (int(data.get("hosts", 1)), int(data.get("slots", self.slots_per_host)))
        if shape != (self.hosts, self.slots_per_host):
            raise ConfigError(
                f"the saved state is for {shape[0]} host(s) of {shape[1]} slot(s), this daemon has "
                f"{self.hosts} of {self.slots_per_host}: start it with the same --slots/--hosts "
                f"or move the state away"
            )
        self.next_id = int(data.get("next_id", 1))
        self.round_times = [float(t) for t in data.get("rounds", [])]
        for raw in data.get("jobs", []):
            job = LiveJob(**{**raw, "allocations": [tuple(a) for a in raw.get("allocations", [])]})
            self.jobs[job.id] = job
        for job_id, (target, reserve, shrink) in data.get("asked", {}).items():
            self.rounds.asked[job_id] = Ask(tuple(target), tuple(reserve), bool(shrink))


def clamp(
    placement: list[int], min_np: int, max_np: int, holds: tuple[int, ...], home: int, slots: tuple[int, ...]
) -> tuple[int, ...]:
    """A running job's target within ``[min_np, max_np]``: extra workers come off the hosts with
    the most; missing ones go where it runs now (its home host first, then where it holds most),
    each host up to its slots — the rounds clip any grow to the slots free there."""
    out = list(placement)
    while sum(out) > max_np:
        out[max(range(len(out)), key=lambda h: out[h])] -= 1
    for host in sorted(range(len(out)), key=lambda h: (h != home, -holds[h], h)):
        out[host] += max(0, min(min_np - sum(out), slots[host] - out[host]))
    return tuple(out)


def start_on_one_host(placement: list[int], max_np: int, slots_per_host: int) -> tuple[int, ...]:
    """A queued job's start: all its workers on the host the policy gave it the most (its
    launcher's); the rest come by placed grows in later rounds."""
    home = max(range(len(placement)), key=lambda h: placement[h])
    return tuple(
        min(sum(placement), max_np, slots_per_host) if h == home else 0 for h in range(len(placement))
    )
