"""Event-driven, deterministic cluster simulator for elastic training jobs.

Events are job arrivals, job completions and scheduling rounds (every ``interval_s``, 60 s by
default as in Pollux). Between events every job's progress is integrated exactly: a job's rate
is constant within an epoch for a fixed allocation (:mod:`taiji.sched.model`), so its completion
time is known when its allocation is set and a completion is an exact event, not a round-off.

**Plugging in a policy.** A policy (:class:`~taiji.sched.policy.Policy`) is any object with a
``name`` and

    allocate(now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]

called at every round (and, with ``SimConfig.reschedule_on_events``, also right after arrivals
and completions). ``jobs`` are the active jobs (arrived, not finished, not rejected) in submission
order, each a frozen :class:`~taiji.sched.policy.JobView`: the spec (requested replicas and batch), the
job's :class:`~taiji.sched.model.Application` or :class:`~taiji.sched.ps.PsApplication` (ground
truth for oracle policies; with ``SimConfig.estimation_error`` a copy whose speeds are off by a
seeded per-job factor, while progress is still integrated with the true speeds), the progress made and
needed, GPU-seconds attained, the current allocation and the number of restarts. The answer maps
job names to :class:`~taiji.sched.cluster.Allocation` (GPUs per host and total batch size, plus
servers per host for a parameter-server job, :mod:`taiji.sched.ps`); a job
left out gets no GPUs (it waits, or is preempted). The simulator checks the answer with
:meth:`Cluster.check` and raises :class:`~taiji.sched.cluster.PolicyError` if a host would be
oversubscribed (GPUs, or server CPUs) or a PS job lacks its servers, so capacity is never exceeded.

**Resize cost.** Any change of a job's placement pauses it for the system's cost
(:data:`SYSTEMS`: ``restart`` = Pollux's 30 s checkpoint-restart for every start, grow, shrink or
move; ``taiji`` = its measured ~0.03 s grow / 0.01 s shrink). The job holds its GPUs while paused.
A change of batch size alone is free; preemption (no GPUs) costs nothing until the job restarts,
when it pays ``resume`` (a suspend/resume: the checkpoint stall, a process boot and the load) rather
than ``start``: the same cost model the live scheduler fits per job (:mod:`taiji.sched.costs`).
As live, a grow's new workers train only ``join`` seconds after it (the job trains on what it had
meanwhile).

**Rounds as the daemon applies them** (:mod:`taiji.sched.rounds`): a round's shrinks and
suspensions land first, its starts and grows once they have all landed (at most
``SHRINK_TIMEOUT_S`` later), each then fitted to the slots the others hold (a start that does not
fit waits for a later round, which replaces the pending one). A shrink lands at once, except that a
suspended job's slots are free only ``ResizeCost.stall`` after the ask (its launcher checkpoints and
exits), and, in a replay, a booting job's shrink frees its slots once the daemon sees its first step
and a job that trained to its end takes none (its launcher exits first). A round with nothing to wait
for applies everything at once, as before.

**Replaying a live run** (``benchmarks/sched_live.py``): rounds fall at ``round_times``, the
daemon's; what lands within ``same_tick_s`` (half the daemon's tick) after a round landed in the
tick before it, and a round's readings lag the steps by ``ResizeCost.seen`` less that much (a first
step's ``seen`` includes the wait for the next tick, half a tick on average; a round reads at its tick).
With ``daemon_view`` the policy sees each job as the daemon did: its progress ``ResizeCost.seen``
late (the daemon's readings lag the steps, :mod:`taiji.sched.trail`), its workers (and their
service) only from the daemon's first listing of them (``ResizeCost.listed``), the daemon's guess
of its model until its first step is seen (:mod:`taiji.sched.replay`), the suspend cost its rules
count; the job itself trains from its first step at its true speed. A booting launcher takes no
grow and is not suspended. ``exit_s``: a launcher exits that long after its last step, holding its
slots; JCT ends then.

**Preemption** (``SimConfig.preemption``, on by default): a policy may leave a started job
without GPUs (it is suspended and pays ``resume`` when it runs again). Off, the simulator keeps
such a job where it was — the live scheduler's ``--min-np`` floor without suspend/resume — and
the changes that then no longer fit wait (the newest jobs' first), so the answer stays feasible.
With ``SimConfig.suspend_rules`` a suspension must pass the live scheduler's own
:func:`~taiji.sched.preemption.may_suspend` (hysteresis, the hourly bound, not a job about to
finish; the cost is the job's boot until some job resumed, then its ``resume``), else the job is
kept the same way. ``SimConfig.job_costs`` gives jobs costs of their own (a live job's measured
boot and resume). ``SimConfig.min_replicas`` gives jobs the live ``--min-np``: an answer below it
is none (a waiting job waits; a running one is suspended, or kept at its ``--min-np`` as the rules
say), and a start or grow is clipped to the slots the others leave (a start below it waits).

**Interference** (optional, ``SimConfig.interference``, Pollux's 0.25/0.5): a distributed job
that shares a host with another distributed job trains that much slower; speeds are re-evaluated
at every allocation change and completion, so progress stays exact.

**Rejection.** A job asking for more GPUs than the cluster has is rejected on arrival (status
``rejected``). If nothing can ever change or ``max_time_s`` passes, the rest are ``unfinished``.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation, Cluster, PolicyError, at_least
from taiji.sched.costs import SYSTEMS, ResizeCost, resize_cost
from taiji.sched.model import Application, time_to_finish
from taiji.sched.policy import Policy
from taiji.sched.preemption import SuspendRules, may_suspend
from taiji.sched.ps import PsSettings
from taiji.sched.simjob import DaemonView, SimJob
from taiji.sched.simresult import JobRecord, SimResult
from taiji.sched.trail import Trail
from taiji.sched.workload import JobSpec, application_of, estimated

logger = logging.getLogger(__name__)
SHRINK_TIMEOUT_S = 30.0  # as the live Rounds': a round's grows go ahead without a shrink that never landed


@dataclass(frozen=True)
class SimConfig:
    cluster: Cluster = Cluster()
    interval_s: float = 60.0
    resize: ResizeCost = SYSTEMS["restart"]
    reschedule_on_events: bool = False  # Pollux schedules only at rounds
    interference: float = 0.0  # slowdown of a distributed job sharing a host with another (Pollux: 0.25/0.5)
    max_time_s: float = 30 * 24 * 3600.0
    ps: PsSettings = PsSettings()  # speed model and bandwidths of parameter-server jobs
    estimation_error: float = 0.0  # e: policies see every job's speeds × a factor drawn in [1−e, 1+e]
    error_seed: int = 0
    live: tuple[
        tuple[str, Application], ...
    ] = ()  # (job name, its Application) for LIVE jobs (sched/live.py)
    preemption: bool = True  # False: a started job keeps its GPUs until it ends (no suspend/resume)
    suspend_rules: SuspendRules | None = None  # the live scheduler's rules for a suspension (None: any)
    job_costs: tuple[
        tuple[str, ResizeCost], ...
    ] = ()  # (job name, its own costs): a replay's, one per launch
    min_replicas: tuple[tuple[str, int], ...] = ()  # (job name, its live --min-np): fewer is no allocation
    round_times: tuple[
        float, ...
    ] = ()  # when rounds fall (a replay: the daemon's, sorted); after them every interval_s
    daemon_view: DaemonView | None = (
        None  # a replay: policies see jobs as the daemon did (see the module's doc)
    )
    exit_s: float = (
        0.0  # a replay: a job's launcher exits this long after its last step (see the module's doc)
    )
    same_tick_s: float = 0.0  # a replay: half the daemon's tick (see the module's doc)

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_time_s <= 0:
            raise ConfigError(
                f"interval_s and max_time_s must be > 0, got {self.interval_s}, {self.max_time_s}"
            )
        if not 0.0 <= self.interference < 1.0:
            raise ConfigError(f"interference must lie in [0, 1), got {self.interference}")
        if self.exit_s < 0 or self.same_tick_s < 0:
            raise ConfigError(f"exit_s and same_tick_s must be >= 0, got {self.exit_s}, {self.same_tick_s}")
        if not 0.0 <= self.estimation_error < 1.0:
            raise ConfigError(f"estimation_error must lie in [0, 1), got {self.estimation_error}")


@dataclass
class _Engine:
    specs: Sequence[JobSpec]
    policy: Policy
    config: SimConfig
    now: float = 0.0
    active: list[SimJob] = field(default_factory=list)
    records: dict[str, JobRecord] = field(default_factory=dict)
    utilization: list[tuple[float, int]] = field(default_factory=list)
    resumed_any: bool = False  # a suspended job ran again
    grows: dict[str, Allocation] = field(
        default_factory=dict
    )  # a round's starts and grows, waiting for its shrinks
    grows_at: float = math.inf  # when its shrinks have all landed (or timed out): the grows go then
    holding: dict[str, tuple[float, Allocation]] = field(default_factory=dict)  # slots a job frees only then

    def run(self) -> SimResult:
        pending = sorted(self.specs, key=lambda spec: spec.submit_time)
        names = [spec.name for spec in pending]
        if len(set(names)) != len(names):
            raise ConfigError("job names in a workload must be unique")
        cursor, next_round = 0, self._round_after(-math.inf)
        while cursor < len(pending) or self.active:
            next_arrival = pending[cursor].submit_time if cursor < len(pending) else math.inf
            next_finish = min((job.finish_at for job in self.active), default=math.inf)
            now = min(next_arrival, next_finish, next_round, self.grows_at if self.grows else math.inf)
            if now > self.config.max_time_s:
                logger.warning(
                    "%s: stopped at the time limit %.0f s", self.policy.name, self.config.max_time_s
                )
                break
            for job in self.active:
                job.run_for(self.now, now - self.now)
                if job.trail:  # (a suspended job's too: it made no progress meanwhile)
                    job.trail.add(now, job.progress)
            self.now = now
            is_round = now >= next_round  # (the daemon's tick takes what landed, then runs its round)
            horizon = now + self.config.same_tick_s if is_round else now
            finished = self._complete(horizon)
            arrived = cursor
            while cursor < len(pending) and pending[cursor].submit_time <= now:
                self._arrive(pending[cursor])
                cursor += 1
            if self.grows and self.grows_at <= horizon:
                self._grow(horizon)
            if is_round:
                next_round = self._round_after(now)
            if is_round or (self.config.reschedule_on_events and (finished or cursor > arrived)):
                self._schedule(horizon)
                if (
                    is_round
                    and cursor == len(pending)
                    and self.active
                    and not (self.grows or self.holding)
                    and all(job.allocation is None for job in self.active)
                ):
                    logger.warning(
                        "%s: %d jobs can never run (nothing running, no arrivals left)",
                        self.policy.name,
                        len(self.active),
                    )
                    break
        for job in self.active:
            self.records[job.spec.name] = self._record(job, "unfinished", "did not finish in the simulation")
        for spec in pending[cursor:]:
            self.records[spec.name] = JobRecord(
                spec.name,
                spec.application,
                spec.submit_time,
                "unfinished",
                reason="submitted after the time limit",
            )
        return SimResult(
            self.policy.name, tuple(self.records[name] for name in names), tuple(self.utilization)
        )

    def _round_after(self, now: float) -> float:
        """The first round after ``now``: the next of ``round_times``, else every ``interval_s``
        (after the last of them)."""
        times, interval = self.config.round_times, self.config.interval_s
        if bisect.bisect_right(times, now) < len(times):
            return times[bisect.bisect_right(times, now)]
        last = times[-1] if times else 0.0
        after = last + (math.floor(max(now - last, -interval) / interval) + 1) * interval
        return after if after > now else after + interval  # (a rounding error must not repeat a round)

    def _arrive(self, spec: JobSpec) -> None:
        cluster = self.config.cluster
        app = application_of(spec, self.config.ps, dict(self.config.live))
        reason = ""
        if spec.num_replicas > cluster.total_gpus:
            reason = f"asks for {spec.num_replicas} GPUs, the cluster has {cluster.total_gpus}"
        elif app.servers_for(1) and app.server_cpus > cluster.cpus_per_host:
            reason = f"a parameter server takes {app.server_cpus} CPUs, a host has {cluster.cpus_per_host}"
        if reason:
            logger.warning("rejected %s: %s", spec.name, reason)
            self.records[spec.name] = JobRecord(
                spec.name, spec.application, spec.submit_time, "rejected", reason=reason
            )
            return
        estimate = estimated(app, spec.name, self.config.estimation_error, self.config.error_seed)
        self.active.append(SimJob(spec, app, estimate))
        lag = max(
            0.0, self._cost(self.active[-1]).seen - self.config.same_tick_s
        )  # (a round reads at its tick)
        self.active[-1].trail = Trail(lag) if self.config.daemon_view else None

    def _complete(self, horizon: float) -> bool:
        """Jobs that trained to their end (their launchers exit ``exit_s`` later) and those whose
        launchers exited (by ``horizon``: a round's tick saw them gone)."""
        done = []
        for job in [job for job in self.active if job.finish_at <= (horizon if job.exiting else self.now)]:
            job.progress = job.app.target_progress
            own_exit = self._cost(job).exit
            exit_s = self.config.exit_s if own_exit is None else own_exit
            if exit_s > 0 and not job.exiting:  # its launcher exits after its last step
                job.exiting, job.finish_at = True, self.now + exit_s
                continue
            job.end = job.finish_at
            self.records[job.spec.name] = self._record(job, "done")
            done.append(job)
        self.active = [job for job in self.active if job not in done]
        if done:
            self._note_utilization()
            if self.config.interference:  # fewer neighbours: the others may speed up
                self._retime_all()
        return bool(done)

    def _schedule(self, horizon: float) -> None:
        cluster = self.config.cluster
        measured = [job.spec.name for job in self.active if job.stepped] + [
            r.name for r in self.records.values() if r.status == "done"
        ]
        daemon = self.config.daemon_view
        self.holding = {name: held for name, held in self.holding.items() if held[0] > horizon}
        leaving = {
            job.spec.name: self.holding[job.spec.name][1]
            for job in self.active  # suspended, launcher
            if job.allocation is None and job.spec.name in self.holding
        }  # still exiting
        views = (
            job.view(daemon, measured, self._rule_cost(job) if daemon else None, self.now, horizon)
            for job in self.active
        )
        answer = dict(
            self.policy.allocate(
                self.now,
                cluster,
                tuple(
                    dataclasses.replace(v, allocation=leaving[v.name]) if v.name in leaving else v
                    for v in views
                ),
            )
        )
        cluster.check(answer, (job.spec.name for job in self.active))
        floor = dict(self.config.min_replicas)  # fewer than its --min-np: as the daemon, none
        answer = {
            name: a for name, a in answer.items() if a.replicas >= floor.get(name, 0) and name not in leaving
        }
        held = {
            job.spec.name: job.allocation
            for job in self.active
            if job.exiting  # keep their slots and size
            or job.booting
            and job.allocation is not None
            and daemon is not None
        }  # (live: no grow while booting)
        kept = self._kept(answer)
        first, grows, lands = {}, {}, [self.now]  # as the live Rounds: shrinks first, grows once they landed
        wanted = {**answer, **kept}
        for job in self.active:
            name, old, new = job.spec.name, job.allocation, wanted.get(job.spec.name)
            if old is None:
                grows.update({name: new} if new is not None else {})
            elif job.exiting:  # a shrink it can no longer take: the round waits for its launcher's exit
                first[name] = old
                lands += [job.finish_at] if new is None or fewer(new, old) else []
            elif new is None and name in held:  # booting: not suspended (live: clamped to its --min-np)
                first[name] = at_least(old, floor.get(name))
                self._hold(job, first[name], until=job.seen_at, lands=lands)
            elif new is None:  # suspended: its slots are free once its launcher is gone
                self._hold(job, None, until=self.now + self._cost(job).stall, lands=lands)
            elif not fewer(old, new):  # a shrink (or a new batch) lands now; a booting job's frees its slots
                first[name] = new  # once the daemon saw its first step (the worker leaves then)
                if name in held:
                    self._hold(job, new, until=job.seen_at, lands=lands)
            else:
                first[name], grows[name] = old, new
        if max(lands) <= horizon:  # nothing to wait for: the whole round at once
            self.grows = {}
            self._apply(
                self._without_preemption({**answer, **held}, {**kept, **held, **self._reserved(horizon)})
            )
            return
        self._apply(first)
        self.grows = {name: a for name, a in grows.items() if name not in held}
        self.grows_at = min(max(lands), self.now + SHRINK_TIMEOUT_S)

    def _hold(self, job: SimJob, new: Allocation | None, until: float, lands: list[float]) -> None:
        """``job`` goes from its allocation to ``new`` and frees the slots it gives up only at ``until``."""
        gone = tuple(
            a - min(a, b)
            for a, b in zip(
                job.allocation.placement,
                new.placement if new else (0,) * len(job.allocation.placement),
                strict=False,
            )
        )
        if until > self.now and any(gone):
            self.holding[job.spec.name] = (until, dataclasses.replace(job.allocation, placement=gone))
            lands.append(until)

    def _reserved(self, horizon: float) -> dict[str, Allocation]:
        """The slots jobs still hold beyond their allocations after ``horizon``, to fit the others around."""
        return {
            f"{name} (freed at {until:g} s)": held
            for name, (until, held) in self.holding.items()
            if until > horizon
        }

    def _grow(self, horizon: float) -> None:
        """A round's starts and grows once its shrinks landed (or ``SHRINK_TIMEOUT_S`` passed): as the
        live ``Rounds``, each fits in the slots the others hold now (a suspended job's until its
        launcher is gone, a shrunk booting job's until it stepped), else waits or is clipped."""
        active = {job.spec.name for job in self.active}
        grows, self.grows = {name: a for name, a in self.grows.items() if name in active}, {}
        current = {job.spec.name: job.allocation for job in self.active if job.allocation is not None}
        kept = {name: a for name, a in current.items() if name not in grows}
        self._apply(self._without_preemption({**current, **grows}, {**kept, **self._reserved(horizon)}))

    def _apply(self, answer: dict[str, Allocation]) -> None:
        for job in self.active:  # a PS job runs only with its servers (the model's W ≤ γS)
            new = answer.get(job.spec.name)
            if new is not None and new.servers != job.app.servers_for(new.replicas):
                raise PolicyError(
                    f"{job.spec.name}: {new.replicas} workers need "
                    f"{job.app.servers_for(new.replicas)} servers, got {new.ps_placement}"
                )
        for job in self.active:
            new = answer.get(job.spec.name)
            pause = resize_cost(self._cost(job), job.allocation, new, resumed=job.start is not None)
            if (
                pause is not None
            ):  # a (re)start pays its whole cost; a change while it boots waits for the boot
                job.restarts += 1
                job.pause_left = pause if job.allocation is None else max(job.pause_left, pause)
                if job.allocation is None and self.config.daemon_view is not None:  # a replay: when the
                    job.seen_at = self.now + job.pause_left + self._cost(job).seen
                    listed = self._cost(job).listed  # daemon sees it step, and lists its workers
                    job.listed_at = job.seen_at if listed is None else min(self.now + listed, job.seen_at)
            if new is not None and job.start is None:
                job.start = self.now
            self._join(job, new)
            if new is None and job.allocation is not None:
                job.suspensions.append(self.now)
            elif new is not None and job.allocation is None:
                job.resumed, job.resumed_at, job.booting = self.now, job.progress, True
                self.resumed_any = self.resumed_any or bool(job.suspensions)
            job.allocation = new
            job.peak_replicas = max(job.peak_replicas, new.replicas if new else 0)
        self._retime_all()
        self._note_utilization()

    def _join(self, job: SimJob, new: Allocation | None) -> None:
        """A grow's new workers train only ``join`` seconds after its pause (live: a process boots
        and joins); meanwhile it trains on what it had."""
        old, join = job.allocation, self._cost(job).join
        if join > 0 and old is not None and new is not None and new.replicas > old.replicas:
            job.joining = job.joining or old
            job.join_at = max(job.join_at, self.now + job.pause_left + join)
        elif new is None or job.joining is not None and new.replicas <= job.joining.replicas:
            job.joining = None

    def _kept(self, answer: Mapping[str, Allocation]) -> dict[str, Allocation]:
        """The running jobs ``answer`` leaves out that are not suspended (all without preemption;
        with suspend rules, those the rules keep), with what they hold — or, for a job with a live
        ``--min-np``, only that many of its workers (as the daemon clamps a policy's answer)."""
        rules = self.config.suspend_rules
        floor = dict(self.config.min_replicas)
        return {
            job.spec.name: at_least(job.allocation, floor.get(job.spec.name))
            for job in self.active
            if job.allocation is not None
            and answer.get(job.spec.name) is None
            and (
                not self.config.preemption
                or rules is not None
                and not may_suspend(
                    True,
                    job.suspensions,
                    job.resumed,
                    self.now,
                    self._rule_cost(job),
                    rules,
                    trained=job.progress > job.resumed_at,
                    left_s=job.pause_left
                    + time_to_finish(
                        job.app,
                        job.progress,
                        job.allocation.placement,
                        job.allocation.batch_size,
                        job.allocation.ps_placement,
                    )
                    / job.speed,
                    resumed=bool(job.suspensions),
                )
            )
        }

    def _cost(self, job: SimJob) -> ResizeCost:
        """Its own costs, else the system's; a job named k times in ``job_costs``: those of its
        launch in progress (the first, then one per resume; the last repeats)."""
        own = [cost for name, cost in self.config.job_costs if name == job.spec.name]
        return own[min(len(job.suspensions), len(own) - 1)] if own else self.config.resize

    def _rule_cost(self, job: SimJob) -> float:
        """A job's suspend/resume cost as the live rules see it: its resume once any resumed, else
        its boot."""
        cost = self._cost(job)
        return (cost.resume_s if cost.suspend is None else cost.suspend) if self.resumed_any else cost.boot_s

    def _without_preemption(
        self, answer: dict[str, Allocation], kept: dict[str, Allocation]
    ) -> dict[str, Allocation]:
        """``answer`` with the running jobs in ``kept`` kept as they are; the other changes undone,
        newest job first, until the whole fits (all undone is the previous, feasible state). A job
        with a live ``--min-np`` has its start or grow clipped to the slots the others leave it
        instead, as the daemon's rounds do (a start below its ``--min-np`` waits)."""
        if not kept:
            return answer
        answer.update(kept)
        floor = dict(self.config.min_replicas)
        names = list(answer)  # (with any slots still held, ``_reserved``)
        for job in reversed(self.active):
            try:
                self.config.cluster.check(answer, names)
                break
            except PolicyError:
                if job.spec.name in kept:
                    continue
                clipped = self._clipped(job, answer) if job.spec.name in floor else None
                if clipped is not None:
                    answer[job.spec.name] = clipped  # the daemon's rounds: what fits now, the rest later
                elif job.allocation is None:
                    answer.pop(job.spec.name, None)  # its start waits
                else:
                    answer[job.spec.name] = job.allocation  # its resize waits
        return answer

    def _clipped(self, job: SimJob, answer: Mapping[str, Allocation]) -> Allocation | None:
        """``job``'s answer clipped per host to what the other answers leave free (the live
        ``Rounds``' grow); None if that adds nothing to what it holds, or starts it below its ``--min-np``."""
        wanted = answer.get(job.spec.name)
        if wanted is None:
            return None
        cap = self.config.cluster.gpus_per_host
        used = [
            sum(a.placement[h] for name, a in answer.items() if name != job.spec.name)
            for h in range(len(wanted.placement))
        ]
        after = tuple(min(n, max(0, cap - u)) for n, u in zip(wanted.placement, used, strict=False))
        held = job.allocation.placement if job.allocation is not None else (0,) * len(after)
        if (
            job.allocation is None and sum(after) < dict(self.config.min_replicas).get(job.spec.name, 1)
        ) or not any(a > h for a, h in zip(after, held, strict=False)):
            return None
        return dataclasses.replace(
            wanted,
            placement=tuple(
                max(a, min(h, n)) for a, h, n in zip(after, held, wanted.placement, strict=False)
            ),
        )

    def _retime_all(self) -> None:
        """Set every job's speed (a distributed job sharing any of its hosts with another
        distributed job runs ``1 − interference`` as fast) and its exact completion time."""
        distributed = [job for job in self.active if job.allocation and job.allocation.hosts > 1]
        sharing = [0] * self.config.cluster.num_hosts
        for job in distributed:
            for host, count in enumerate(job.allocation.placement):
                sharing[host] += count > 0
        for job in self.active:
            shared = job in distributed and any(
                count > 0 and sharing[host] > 1 for host, count in enumerate(job.allocation.placement)
            )
            job.speed = 1.0 - self.config.interference if shared else 1.0
            job.retime(self.now)

    def _note_utilization(self) -> None:
        used = sum(job.allocation.replicas for job in self.active if job.allocation)
        if not self.utilization or self.utilization[-1][1] != used:
            self.utilization.append((self.now, used))

    def _record(self, job: SimJob, status: str, reason: str = "") -> JobRecord:
        return JobRecord(
            job.spec.name,
            job.spec.application,
            job.spec.submit_time,
            status,
            start_time=job.start,
            end_time=job.end,
            jct=None if job.end is None else job.end - job.spec.submit_time,
            restarts=job.restarts,
            gpu_seconds=job.attained,
            reason=reason,
        )


def fewer(a: Allocation, b: Allocation) -> bool:
    """``a`` has fewer workers than ``b`` on some host."""
    return any(x < y for x, y in zip(a.placement, b.placement, strict=False))


def simulate(specs: Sequence[JobSpec], policy: Policy, config: SimConfig = SimConfig()) -> SimResult:
    """Run ``specs`` under ``policy`` on ``config.cluster``; deterministic for deterministic policies."""
    return _Engine(specs, policy, config).run()
