"""Event-driven, deterministic cluster simulator for elastic training jobs.

Events are job arrivals, job completions and scheduling rounds (every ``interval_s``, 60 s by
default as in Pollux). Between events every job's progress is integrated exactly: a job's rate
is constant within an epoch for a fixed allocation (:mod:`taiji.sched.model`), so its completion
time is known when its allocation is set and a completion is an exact event, not a round-off.

**Plugging in a policy.** A policy is any object with a ``name`` and

    allocate(now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Mapping[str, Allocation]

called at every round (and, with ``SimConfig.reschedule_on_events``, also right after arrivals
and completions). ``jobs`` are the active jobs (arrived, not finished, not rejected) in submission
order, each a frozen :class:`JobView`: the spec (requested replicas and batch), the
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
meanwhile), and what a round starts or grows waits for the ``stall`` of the jobs it suspends (their
slots are free once their launchers checkpointed and exited).

**Replaying a live run** (``benchmarks/sched_live.py``): rounds fall at ``round_times``, the
daemon's. With ``daemon_view`` the policy sees each job as the daemon did: its progress
``ResizeCost.seen`` late (the daemon's readings lag the steps, :mod:`taiji.sched.trail`), no
workers while its launcher boots (until its first step is seen), the daemon's guess of its model
until then (:mod:`taiji.sched.replay`), the suspend cost its rules count; the job itself trains
from its first step at its true speed. A booting launcher holds its slots and takes no resize or
suspension (a later round asks again); a start queued behind a suspension launches at the size the
latest round gave it; a job's end launches the starts the last round could not fit (the daemon's
tick). ``exit_s``: a launcher exits that long after its last step, holding its slots; JCT ends then.

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

import dataclasses
import logging
import bisect
import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from taiji.errors import ConfigError
from taiji.sched.cluster import Allocation, Cluster, PolicyError, at_least
from taiji.sched.costs import SYSTEMS, ResizeCost, resize_cost  # noqa: F401  (the cost model, re-exported)
from taiji.sched.model import AnyApplication, Application, advance, time_to_finish
from taiji.sched.preemption import SuspendRules, may_suspend
from taiji.sched.ps import PsSettings
from taiji.sched.trail import Trail
from taiji.sched.simresult import JobRecord, SimResult  # noqa: F401  (re-exported)
from taiji.sched.workload import JobSpec, application_of, estimated

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobView:
    """What a policy sees of one active job."""

    spec: JobSpec
    app: AnyApplication             # the policy's model of the job: ground truth unless estimation error is on
    progress: float                 # statistical progress made (PS jobs: mini-batches)
    attained_gpu_s: float           # GPU-seconds held so far (Tiresias' attained service)
    allocation: Allocation | None   # current allocation, None when waiting
    restarts: int                   # allocation changes that cost a pause
    peak_replicas: int = 0          # most GPUs held at once so far (what has been "profiled")
    weight: float = 1.0             # its weight in a weighted objective (PCRR's); live jobs' `submit --weight`
    suspend_cost_s: float | None = None   # its measured suspend + resume seconds (live); None: the system's

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def remaining_progress(self) -> float:
        return self.app.target_progress - self.progress


class DaemonView(Protocol):
    """What a live daemon's policy saw of a job before its first step (a replay's: :mod:`taiji.sched.replay`)."""

    def guess(self, name: str, measured: Sequence[str]) -> AnyApplication:
        """``name``'s model given the jobs (``measured``) that had made a step."""


class Policy(Protocol):
    name: str

    def allocate(self, now: float, cluster: Cluster,
                 jobs: Sequence[JobView]) -> Mapping[str, Allocation]: ...


@dataclass(frozen=True)
class SimConfig:
    cluster: Cluster = Cluster()
    interval_s: float = 60.0
    resize: ResizeCost = SYSTEMS["restart"]
    reschedule_on_events: bool = False   # Pollux schedules only at rounds
    interference: float = 0.0   # slowdown of a distributed job sharing a host with another (Pollux: 0.25/0.5)
    max_time_s: float = 30 * 24 * 3600.0
    ps: PsSettings = PsSettings()   # speed model and bandwidths of parameter-server jobs
    estimation_error: float = 0.0   # e: policies see every job's speeds × a factor drawn in [1−e, 1+e]
    error_seed: int = 0
    live: tuple[tuple[str, Application], ...] = ()   # (job name, its Application) for LIVE jobs (sched/live.py)
    preemption: bool = True   # False: a started job keeps its GPUs until it ends (no suspend/resume)
    suspend_rules: SuspendRules | None = None   # the live scheduler's rules for a suspension (None: any)
    job_costs: tuple[tuple[str, ResizeCost], ...] = ()   # (job name, its own costs, e.g. its measured boot)
    min_replicas: tuple[tuple[str, int], ...] = ()   # (job name, its live --min-np): fewer is no allocation
    round_times: tuple[float, ...] = ()   # when rounds fall (a replay: the daemon's, sorted); after them every interval_s
    daemon_view: DaemonView | None = None   # a replay: policies see jobs as the daemon did (see the module's doc)
    exit_s: float = 0.0   # a replay: a job's launcher exits this long after its last step (see the module's doc)

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_time_s <= 0:
            raise ConfigError(f"interval_s and max_time_s must be > 0, got {self.interval_s}, {self.max_time_s}")
        if not 0.0 <= self.interference < 1.0:
            raise ConfigError(f"interference must lie in [0, 1), got {self.interference}")
        if self.exit_s < 0:
            raise ConfigError(f"exit_s must be >= 0, got {self.exit_s}")
        if not 0.0 <= self.estimation_error < 1.0:
            raise ConfigError(f"estimation_error must lie in [0, 1), got {self.estimation_error}")


@dataclass
class _Job:
    """Mutable simulation state of one job (never handed to a policy)."""

    spec: JobSpec
    app: AnyApplication             # ground truth: progress and completion times use it
    estimate: AnyApplication        # what the policy is shown (``app`` unless estimation error is on)
    progress: float = 0.0
    allocation: Allocation | None = None
    pause_left: float = 0.0
    finish_at: float = math.inf     # exact completion time under the current allocation
    speed: float = 1.0              # 1 − interference slowdown, constant between events
    attained: float = 0.0
    restarts: int = 0
    peak_replicas: int = 0
    start: float | None = None
    end: float | None = None
    resumed: float = 0.0            # when it last (re)started
    resumed_at: float = 0.0         # its progress then
    suspensions: list[float] = field(default_factory=list)   # when it was suspended
    joining: Allocation | None = None   # what it trains on until a grow's joiners arrive (None: no grow pending)
    join_at: float = 0.0
    launch_at: float = 0.0          # a start waiting on a suspension's exit launches then (a round before re-sizes it)
    exiting: bool = False           # trained to the end; its launcher exits at ``finish_at`` (``exit_s``)
    booting: bool = False           # (re)started and not seen training since: its launcher boots
    seen_at: float = 0.0            # when the daemon sees its (re)start's first step (``ResizeCost.seen``)
    stepped: bool = False           # the daemon has seen it train (a first step, seen at ``seen_at``)
    trail: Trail | None = None      # a replay: its progress as the daemon saw it (``ResizeCost.seen`` late)

    def view(self, daemon: DaemonView | None = None, measured: Sequence[str] = (),
             suspend_cost_s: float | None = None, now: float = 0.0) -> JobView:
        """What a policy sees; as a live daemon saw it with ``daemon``: no workers while it boots, the
        daemon's guess of its model until its first step (``measured``: the jobs that made one), and
        while it runs the suspend cost the daemon's rules count (``suspend_cost_s``)."""
        if daemon is None:
            return JobView(self.spec, self.estimate, self.progress, self.attained, self.allocation,
                           self.restarts, self.peak_replicas)
        return JobView(self.spec, self.estimate if self.stepped else daemon.guess(self.spec.name, measured),
                       self.trail.at(now) if self.trail else self.progress, self.attained,
                       None if self.booting else self.allocation, self.restarts,
                       self.peak_replicas, suspend_cost_s=None if self.allocation is None else suspend_cost_s)

    def run_for(self, start: float, seconds: float) -> None:
        """Progress from ``start`` for ``seconds``: its pause first, then on what it trains on (a
        grow's old allocation until its joiners arrive at ``join_at``, then the new one)."""
        if self.allocation is None or seconds <= 0:
            return
        paused = min(self.pause_left, seconds)
        self.pause_left -= paused
        self.attained += paused * (self.joining or self.allocation).replicas   # (its joiners are not there yet)
        if seconds > paused:   # it trains; the daemon sees it (and measures it) at ``seen_at``
            self.booting = self.booting and start + seconds < self.seen_at - 1e-9
            self.stepped = self.stepped or not self.booting
        for allocation, span in self._spans(start + paused, seconds - paused):
            self.attained += span * allocation.replicas   # (as the daemon counts: the workers it has)
            self.progress = advance(self.app, self.progress, span * self.speed, allocation.placement,
                                    allocation.batch_size, allocation.ps_placement)
        if self.joining is not None and start + seconds >= self.join_at:
            self.joining = None

    def _spans(self, start: float, seconds: float) -> list[tuple[Allocation, float]]:
        """(allocation trained on, seconds) from ``start``: the old one until the joiners arrive."""
        if self.joining is None or start >= self.join_at:
            return [(self.allocation, seconds)]
        before = min(seconds, self.join_at - start)
        return [(self.joining, before), (self.allocation, seconds - before)]

    def retime(self, now: float) -> None:
        """Exact completion time from ``now`` under the current allocation(s) and speed."""
        if self.exiting:
            return
        if self.allocation is None:
            self.finish_at = math.inf
            return
        at, progress = now + self.pause_left, self.progress
        for allocation, span in self._spans(at, math.inf):
            left = time_to_finish(self.app, progress, allocation.placement, allocation.batch_size,
                                  allocation.ps_placement) / self.speed
            if left <= span:
                self.finish_at = at + left
                return
            progress = advance(self.app, progress, span * self.speed, allocation.placement,
                               allocation.batch_size, allocation.ps_placement)
            at += span


@dataclass
class _Engine:
    specs: Sequence[JobSpec]
    policy: Policy
    config: SimConfig
    now: float = 0.0
    active: list[_Job] = field(default_factory=list)
    records: dict[str, JobRecord] = field(default_factory=dict)
    utilization: list[tuple[float, int]] = field(default_factory=list)
    resumed_any: bool = False   # a suspended job ran again
    asked: dict[str, Allocation] = field(default_factory=dict)   # the last round's answer (a replay's ticks)

    def run(self) -> SimResult:
        pending = sorted(self.specs, key=lambda spec: spec.submit_time)
        names = [spec.name for spec in pending]
        if len(set(names)) != len(names):
            raise ConfigError("job names in a workload must be unique")
        cursor, next_round = 0, self._round_after(-math.inf)
        while cursor < len(pending) or self.active:
            next_arrival = pending[cursor].submit_time if cursor < len(pending) else math.inf
            next_finish = min((job.finish_at for job in self.active), default=math.inf)
            now = min(next_arrival, next_finish, next_round)
            if now > self.config.max_time_s:
                logger.warning("%s: stopped at the time limit %.0f s", self.policy.name, self.config.max_time_s)
                break
            for job in self.active:
                job.run_for(self.now, now - self.now)
                if job.trail:   # (a suspended job's too: it made no progress meanwhile)
                    job.trail.add(now, job.progress)
            self.now = now
            finished = self._complete()
            arrived = cursor
            while cursor < len(pending) and pending[cursor].submit_time <= now:
                self._arrive(pending[cursor])
                cursor += 1
            is_round = now >= next_round
            if is_round:
                next_round = self._round_after(now)
            if is_round or (self.config.reschedule_on_events and (finished or cursor > arrived)):
                self._schedule()
                if is_round and cursor == len(pending) and self.active and \
                        all(job.allocation is None for job in self.active):
                    logger.warning("%s: %d jobs can never run (nothing running, no arrivals left)",
                                   self.policy.name, len(self.active))
                    break
            elif finished and self.config.daemon_view is not None:
                self._tick()
        for job in self.active:
            self.records[job.spec.name] = self._record(job, "unfinished", "did not finish in the simulation")
        for spec in pending[cursor:]:
            self.records[spec.name] = JobRecord(spec.name, spec.application, spec.submit_time,
                                                "unfinished", reason="submitted after the time limit")
        return SimResult(self.policy.name, tuple(self.records[name] for name in names),
                         tuple(self.utilization))

    def _round_after(self, now: float) -> float:
        """The first round after ``now``: the next of ``round_times``, else every ``interval_s`` (after the last of them)."""
        times, interval = self.config.round_times, self.config.interval_s
        if bisect.bisect_right(times, now) < len(times):
            return times[bisect.bisect_right(times, now)]
        last = times[-1] if times else 0.0
        after = last + (math.floor(max(now - last, -interval) / interval) + 1) * interval
        return after if after > now else after + interval   # (a rounding error must not repeat a round)

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
            self.records[spec.name] = JobRecord(spec.name, spec.application, spec.submit_time,
                                                "rejected", reason=reason)
            return
        estimate = estimated(app, spec.name, self.config.estimation_error, self.config.error_seed)
        self.active.append(_Job(spec, app, estimate))
        self.active[-1].trail = Trail(self._cost(self.active[-1]).seen) if self.config.daemon_view else None

    def _complete(self) -> bool:
        done = []
        for job in (job for job in self.active if job.finish_at <= self.now):
            job.progress = job.app.target_progress
            if self.config.exit_s > 0 and not job.exiting:   # its launcher exits after its last step
                job.exiting, job.finish_at = True, self.now + self.config.exit_s
                continue
            job.end = job.finish_at
            self.records[job.spec.name] = self._record(job, "done")
            done.append(job)
        self.active = [job for job in self.active if job.finish_at > self.now]
        if done:
            self._note_utilization()
            if self.config.interference:   # fewer neighbours: the others may speed up
                self._retime_all()
        return bool(done)

    def _schedule(self) -> None:
        cluster = self.config.cluster
        measured = [job.spec.name for job in self.active if job.stepped] + \
            [r.name for r in self.records.values() if r.status == "done"]
        daemon = self.config.daemon_view
        answer = dict(self.policy.allocate(self.now, cluster, tuple(
            job.view(daemon, measured, self._rule_cost(job) if daemon else None, self.now) for job in self.active)))
        cluster.check(answer, (job.spec.name for job in self.active))
        floor = dict(self.config.min_replicas)   # fewer than its --min-np: as the daemon, none
        answer = {name: a for name, a in answer.items() if a.replicas >= floor.get(name, 0)}
        self.asked = dict(answer)
        held = {job.spec.name: job.allocation for job in self.active if job.exiting   # keep their slots and size
                or job.booting and job.allocation is not None and daemon is not None}   # (live: not while booting)
        self._apply(self._without_preemption({**answer, **held}, {**self._kept(answer), **held}))

    def _tick(self) -> None:
        """A replay, between rounds: a job ended, and the starts the last round asked for that did
        not fit then launch in its slots if they fit now (the daemon's tick; the policy is not asked)."""
        held = {job.spec.name: job.allocation for job in self.active if job.allocation is not None}
        starts = {job.spec.name: self.asked[job.spec.name] for job in self.active
                  if job.allocation is None and job.spec.name in self.asked}
        if starts:
            self._apply(self._without_preemption(starts, held))

    def _apply(self, answer: dict[str, Allocation]) -> None:
        for job in self.active:   # a PS job runs only with its servers (the model's W ≤ γS)
            new = answer.get(job.spec.name)
            if new is not None and new.servers != job.app.servers_for(new.replicas):
                raise PolicyError(f"{job.spec.name}: {new.replicas} workers need "
                                  f"{job.app.servers_for(new.replicas)} servers, got {new.ps_placement}")
        stall = max((self._cost(job).stall for job in self.active   # a round's grows wait for its suspensions
                     if job.allocation is not None and job.spec.name not in answer), default=0.0)
        for job in self.active:
            new = answer.get(job.spec.name)
            if new is not None and job.allocation is not None and self.now < job.launch_at:
                job.allocation = new   # its launcher has not started yet: it starts at the new size
                job.peak_replicas = max(job.peak_replicas, new.replicas)
                continue
            pause = resize_cost(self._cost(job), job.allocation, new, resumed=job.start is not None)
            if pause is not None:   # a (re)start pays its whole cost; a change while it boots waits for the boot
                job.restarts += 1
                job.pause_left = pause + stall if job.allocation is None else max(job.pause_left, pause)
                job.launch_at = self.now + stall if job.allocation is None else job.launch_at
                job.seen_at = self.now + job.pause_left + self._cost(job).seen if job.allocation is None else job.seen_at
            if new is not None and job.start is None:
                job.start = self.now
            self._join(job, new, stall)
            if new is None and job.allocation is not None:
                job.suspensions.append(self.now)
            elif new is not None and job.allocation is None:
                job.resumed, job.resumed_at, job.booting = self.now, job.progress, True
                self.resumed_any = self.resumed_any or bool(job.suspensions)
            job.allocation = new
            job.peak_replicas = max(job.peak_replicas, new.replicas if new else 0)
        self._retime_all()
        self._note_utilization()

    def _join(self, job: _Job, new: Allocation | None, stall: float = 0.0) -> None:
        """A grow's new workers train only ``join`` seconds after its pause and the round's ``stall``
        (live: a process boots and joins; a launcher still booting takes no resize); meanwhile it
        trains on what it had."""
        old, join = job.allocation, self._cost(job).join
        if join + stall > 0 and old is not None and new is not None and new.replicas > old.replicas:
            job.joining = job.joining or old
            job.join_at = max(job.join_at, self.now + job.pause_left + stall + join)
        elif new is None or job.joining is not None and new.replicas <= job.joining.replicas:
            job.joining = None

    def _kept(self, answer: Mapping[str, Allocation]) -> dict[str, Allocation]:
        """The running jobs ``answer`` leaves out that are not suspended (all without preemption;
        with suspend rules, those the rules keep), with what they hold — or, for a job with a live
        ``--min-np``, only that many of its workers (as the daemon clamps a policy's answer)."""
        rules = self.config.suspend_rules
        floor = dict(self.config.min_replicas)
        return {job.spec.name: at_least(job.allocation, floor.get(job.spec.name)) for job in self.active
                if job.allocation is not None and answer.get(job.spec.name) is None
                and (not self.config.preemption or rules is not None and not may_suspend(
                    True, job.suspensions, job.resumed, self.now, self._rule_cost(job), rules,
                    trained=job.progress > job.resumed_at, left_s=job.pause_left + time_to_finish(
                        job.app, job.progress, job.allocation.placement, job.allocation.batch_size,
                        job.allocation.ps_placement) / job.speed, resumed=bool(job.suspensions)))}

    def _cost(self, job: _Job) -> ResizeCost:
        return dict(self.config.job_costs).get(job.spec.name, self.config.resize)

    def _rule_cost(self, job: _Job) -> float:
        """A job's suspend/resume cost as the live rules see it: its resume once any resumed, else its boot."""
        return self._cost(job).resume_s if self.resumed_any else self._cost(job).boot_s

    def _without_preemption(self, answer: dict[str, Allocation], kept: dict[str, Allocation]) -> dict[str, Allocation]:
        """``answer`` with the running jobs in ``kept`` kept as they are; the other changes undone,
        newest job first, until the whole fits (all undone is the previous, feasible state). A job
        with a live ``--min-np`` has its start or grow clipped to the slots the others leave it
        instead, as the daemon's rounds do (a start below its ``--min-np`` waits)."""
        if not kept:
            return answer
        answer.update(kept)
        floor = dict(self.config.min_replicas)
        names = [job.spec.name for job in self.active]
        for job in reversed(self.active):
            try:
                self.config.cluster.check(answer, names)
                break
            except PolicyError:
                if job.spec.name in kept:
                    continue
                clipped = self._clipped(job, answer) if job.spec.name in floor else None
                if clipped is not None:
                    answer[job.spec.name] = clipped   # the daemon's rounds: what fits now, the rest later
                elif job.allocation is None:
                    answer.pop(job.spec.name, None)   # its start waits
                else:
                    answer[job.spec.name] = job.allocation   # its resize waits
        return answer

    def _clipped(self, job: _Job, answer: Mapping[str, Allocation]) -> Allocation | None:
        """``job``'s answer clipped per host to what the other answers leave free (the live
        ``Rounds``' grow); None if that adds nothing to what it holds, or starts it below its ``--min-np``."""
        wanted = answer.get(job.spec.name)
        if wanted is None:
            return None
        cap = self.config.cluster.gpus_per_host
        used = [sum(a.placement[h] for name, a in answer.items() if name != job.spec.name)
                for h in range(len(wanted.placement))]
        after = tuple(min(n, max(0, cap - u)) for n, u in zip(wanted.placement, used))
        held = job.allocation.placement if job.allocation is not None else (0,) * len(after)
        if (job.allocation is None and sum(after) < dict(self.config.min_replicas).get(job.spec.name, 1)) \
                or not any(a > h for a, h in zip(after, held)):
            return None
        return dataclasses.replace(wanted, placement=tuple(max(a, min(h, n)) for a, h, n in
                                                           zip(after, held, wanted.placement)))

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
                count > 0 and sharing[host] > 1 for host, count in enumerate(job.allocation.placement))
            job.speed = 1.0 - self.config.interference if shared else 1.0
            job.retime(self.now)

    def _note_utilization(self) -> None:
        used = sum(job.allocation.replicas for job in self.active if job.allocation)
        if not self.utilization or self.utilization[-1][1] != used:
            self.utilization.append((self.now, used))

    def _record(self, job: _Job, status: str, reason: str = "") -> JobRecord:
        return JobRecord(job.spec.name, job.spec.application, job.spec.submit_time, status,
                         start_time=job.start, end_time=job.end,
                         jct=None if job.end is None else job.end - job.spec.submit_time,
                         restarts=job.restarts, gpu_seconds=job.attained, reason=reason)


def simulate(specs: Sequence[JobSpec], policy: Policy, config: SimConfig = SimConfig()) -> SimResult:
    """Run ``specs`` under ``policy`` on ``config.cluster``; deterministic for deterministic policies."""
    return _Engine(specs, policy, config).run()
