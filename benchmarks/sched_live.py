"""The live scheduler on real jobs: PCRR vs FIFO, or PCRR and Tiresias with suspend/resume vs
without, on one host or on emulated hosts, and the simulator's replay.

    .venv/bin/python benchmarks/sched_live.py --quick             # 5 jobs, 2 slots: ~3 min here
    .venv/bin/python benchmarks/sched_live.py                     # 8 jobs, 2 slots: ~8 min here
    .venv/bin/python benchmarks/sched_live.py --quick --hosts 3   # 3 namespace hosts x 1 slot (root): ~5 min
    .venv/bin/python benchmarks/sched_live.py --quick --compare suspend   # 4 live runs of 4 jobs

``--compare suspend``: a long job that must hold every slot (``--min-np`` = the slots; the whole
60000-sample set, two epochs) arrives first, three short elastic ones (3000-4000 samples) after, on
the seeded Poisson schedule (mean gap 8 s): they arrive while it holds the slots. Each of PCRR and
Tiresias (``--las-threshold auto``, the daemon's default: a job is demoted once it attained the
median predicted size, in worker-seconds, of the jobs seen so far) runs twice: **with**
suspend/resume (the daemon's default rules: a job is suspended only after it ran 3 x its
suspend/resume cost, at most 4 times an hour, and not when it has less than that cost left to
train) and **without** (``--max-suspensions-per-hour 0``: today's ``--min-np`` floor, a long job
keeps its slots until it ends). Rows ``live avg JCT: <policy> with suspend vs without`` (taiji =
with, anchor = without, ratio = without / with; target >= 1.3). The simulator replays every run as
its daemon decided (the same policy and LAS threshold, the same suspension rules or the floor),
charging each resume the suspend + resume cost the daemon measured (median over jobs), each job's
``--min-np`` (below it a job gets nothing; one the rules keep holds only its ``--min-np``, and starts
and grows are clipped to the free slots, as the daemon clamps and its rounds clip) and PCRR's first
LP slot of one ``--round``, as the daemon, at the times its rounds ran (saved in its state); a
grow's new workers join after the measured ask -> arrival (median over the run's grows; none measured:
its launch -> first step), and what a round starts waits for the stall (ask -> launcher gone) of the
jobs it suspends; a round's starts and grows wait for all its shrinks, as the daemon's rounds do
(a booting job's shrink frees its slot once its first step is seen; a job that trained to its end
takes none), and what landed within half the daemon's tick after a round landed in that round's tick.
Its policy sees each job as the daemon did: its workers from the daemon's first listing of them,
and until its first step the daemon's guess of its model (:mod:`taiji.sched.replay`), while the
simulated job trains at the speed fitted to its run log. ``sim_error_max`` is over all runs
(``sim_error_by_run`` per run).

With ``--hosts N`` the daemon runs in emulated host 0 with ``--hosts FILE`` and one ``taiji sched
agent`` per host (network namespaces, taiji_harness/netns.py; the last host's link shaped with ``--shape``);
every request goes from inside host 0, and the simulator replays on an N x slots cluster.

A workload of Fashion-MNIST jobs (the CNN of examples/fashion_mnist.py, two epochs on subsets of
different sizes, heavy-tailed: a long job first, then shorter ones; ``_sched_job.py``) arrives on
a seeded Poisson schedule. The same workload runs
twice, each time under a fresh ``taiji sched serve --slots S --round R``: once with ``--policy
pcrr``, once with ``--policy fifo`` (every job asks for all S slots: FIFO runs them one after
another, whole). Each job's JCT = when the daemon saw it end − when it was submitted.

The simulator then replays each live run (same arrival times, same cluster of 1 × S slots, same
round length, same policy) with what was measured in that run: each job's Application fitted to
its mean step time per size over the whole run, from its own run log
(:func:`~taiji.sched.live.logged_step_times`: on 2 shared cores a job trains several times slower
beside another job than alone, so the daemon's last few readings mislead), each job's measured
costs, one per launch (``job_costs``: its first launch and each resume to its first step, from its
run log; how much later the daemon saw that step, which is how late the replay's policy sees the
job's progress; when the daemon listed its workers; each suspension's stall; its own exit after its
last step);
taiji's in-place resizes cost what the simulator's ``taiji`` system says. ``sim_error_max`` is the
largest per-job |simulated − live| / live JCT.

``oversubscribed`` counts the instants at which the jobs' workers exceeded the slots, rebuilt two
ways: from the daemon's observations of each job (``observed``) and from the jobs' own event logs
(start / resize / end with sizes, written by each job's rank 0: ``logged``). Both must be 0.

``samples_exactly_once`` (per run and job in ``samples_audit_by_run``): every worker process of
every job logs the sample indices of each step it draws and commits (``_sched_job.py``), across
all its launchers (a suspended job's and its resumed one's); no sample may be committed twice in an
epoch, drawn for a step never committed, or left out of an epoch. The benchmark exits non-zero
(after writing its JSON) when one is.

Rows (docs/design.md#performance-targets contract): ``live avg JCT: PCRR vs fifo`` (taiji = PCRR's average
JCT, anchor = FIFO's, ratio = FIFO / PCRR; target >= 1.2) and ``simulated avg JCT: PCRR vs fifo`` (the same
from the replay); the JSON line also carries ``sim_error_max`` (target <= 0.25) and ``oversubscribed``, and
``sim_error_avg_jct_by_run`` (each run's average JCT, replayed vs live: one job's error can be a whole wait
when an arrival and a job's end fall within the replay's error of each other).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from taiji.launch.sched.channel import ask
from taiji.launch.sched.daemon import TICK_S
from taiji.launch.sched.statedir import read_secret
from taiji.metrics.runlog import METRICS_FILE, read_jsonl
from taiji.sched.cluster import Cluster
from taiji.sched.costs import SYSTEMS, ResizeCost
from taiji.sched.live import Measured, fit_step_model, live_application, logged_step_times, placement_timeline
from taiji.sched.livejob import size_key
from taiji.sched.policies import Pcrr, make_policy
from taiji.sched.preemption import SuspendRules
from taiji.sched.replay import DaemonGuess
from taiji.sched.rounds import oversubscribed_instants
from taiji.sched.sim import SimConfig, simulate
from taiji.sched.workload import LIVE, JobSpec
from taiji_harness.bench import contract_row, print_result, reap_on_sigterm
from taiji_harness.elastic_analysis import exactly_once_audit

HERE = Path(__file__).resolve().parent
JOB = HERE / "_sched_job.py"
BATCH = 128
# heavy-tailed lengths (a long job first, then short ones), as in the clusters' traces; 2 epochs each
QUICK = {"samples": [24000, 4000, 8000, 3000, 12000], "mean_gap_s": 4.0}
FULL = {"samples": [30000, 5000, 10000, 3000, 20000, 6000, 15000, 4000], "mean_gap_s": 6.0}
# --compare suspend: (samples, holds every slot) per job: long rigid jobs first, short elastic ones after
# (the long ones: the whole 60000-sample set, ~900 steps at 2 workers, minutes on this box, many times a
# job's boot, so they still hold the slots when the short ones arrive)
SUSPEND_QUICK = {"jobs": [(60000, True), (3000, False), (4000, False), (3000, False)], "mean_gap_s": 8.0}
SUSPEND_FULL = {
    "jobs": [(60000, True), (3000, False), (5000, False), (48000, True), (3000, False), (4000, False)],
    "mean_gap_s": 10.0,
}
LAS_THRESHOLD = "auto"  # Tiresias: the daemon's default, the median predicted job size of the workload
EPOCHS = 2
GOAL_SPEEDUP, GOAL_SUSPEND_SPEEDUP, GOAL_SIM_ERROR = 1.2, 1.3, 0.25


def workload(
    samples: list[int], mean_gap: float, seed: int, rigid: list[bool] | None = None
) -> list[tuple[float, int, bool]]:
    """(arrival offset s, training samples, holds every slot) per job: Poisson arrivals, the first at 0."""
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i, n in enumerate(samples):
        jobs.append((round(t, 2), n, bool(rigid[i]) if rigid else False))
        t += rng.expovariate(1.0 / mean_gap)
    return jobs


class OneHost:
    """The daemon on this host with ``slots`` slots (``taiji sched serve --slots``)."""

    def __init__(self, slots: int):
        self.addresses, self.slots = ["127.0.0.1"], slots

    def start(self, policy: str, round_s: float, out: Path, env: dict, extra: tuple[str, ...] = ()) -> None:
        self.out, self.state = out, out / "state"
        with open(out / "daemon.log", "w") as log:
            self.daemon = subprocess.Popen(
                taiji_sched(
                    "serve",
                    self.state,
                    "--slots",
                    str(self.slots),
                    "--policy",
                    policy,
                    "--round",
                    str(round_s),
                    *extra,
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.address = wait_for_daemon(self.state, self.daemon)
        self.secret = read_secret(self.state)

    def submit(self, request: dict[str, Any]) -> None:
        ask(self.address, self.secret, {"op": "submit", **request})

    def stop(self) -> None:
        ask(self.address, self.secret, {"op": "stop"})
        self.daemon.wait(60)

    def close(self) -> None:
        stop_everything(self.daemon, self.out)


class NamespaceHosts:
    """``n`` emulated hosts of ``slots`` slots each (network namespaces, taiji_harness/netns.py; root
    only): the daemon on host 0 with ``--hosts``, ``taiji sched agent`` on every host, the last
    host's link shaped. Every request goes from inside host 0 (never from this namespace)."""

    PORT = 29480

    def __init__(self, n: int, slots: int, shape: str):
        from taiji_harness.netns import EmulatedHosts, unavailable

        why = unavailable()
        if why:
            raise SystemExit(f"sched_live.py --hosts {n}: no emulated hosts here ({why})")
        self.hosts = EmulatedHosts(n)
        self.addresses, self.slots, self.shape = [self.hosts.address(i) for i in range(n)], slots, shape

    def start(self, policy: str, round_s: float, out: Path, env: dict, extra: tuple[str, ...] = ()) -> None:
        self.out, self.state, self.env = out, out / "state", env
        if self.shape and shutil.which("tc"):
            self.hosts.shape(len(self.addresses) - 1, self.shape)
            self.shape = ""  # (once: the namespaces outlive the runs)
        (out / "hosts.txt").write_text("".join(f"{a} {self.slots}\n" for a in self.addresses))
        with open(out / "daemon.log", "w") as log:
            self.daemon = self.hosts.popen(
                0,
                taiji_sched(
                    "serve",
                    self.state,
                    "--hosts",
                    str(out / "hosts.txt"),
                    "--address",
                    f"{self.addresses[0]}:{self.PORT}",
                    "--policy",
                    policy,
                    "--round",
                    str(round_s),
                    *extra,
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for_daemon(self.state, self.daemon, inside=True)
        self.agents = []
        for i, address in enumerate(self.addresses):
            with open(out / f"agent{i}.log", "w") as log:
                self.agents.append(
                    self.hosts.popen(
                        i,
                        taiji_sched("agent", self.state, "--host", address, "--slots", str(self.slots)),
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

    def submit(self, request: dict[str, Any]) -> None:
        done = self.hosts.run(
            0,
            taiji_sched(
                "submit",
                self.state,
                "--min-np",
                str(request["min_np"]),
                "--max-np",
                str(request["max_np"]),
                "-np",
                str(request["np"]),
                "--name",
                request["name"],
                "--work",
                str(request["work"]),
                "--",
                *request["command"],
            ),
            env=self.env,
            cwd=request["cwd"],
        )
        if done.returncode != 0:
            raise RuntimeError(f"submit failed: {done.stdout}{done.stderr}")

    def stop(self) -> None:
        self.hosts.run(0, taiji_sched("stop", self.state), env=self.env)
        self.daemon.wait(60)
        for agent in self.agents:
            agent.send_signal(signal.SIGTERM)
        for agent in self.agents:
            agent.wait(30)

    def close(self) -> None:
        """Whatever is left on the hosts (a failed run's daemon, agents, jobs) before the next run."""
        for i in range(len(self.addresses)):
            for pid in self.hosts.pids(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def release(self) -> None:
        self.hosts.close()


def taiji_sched(command: str, state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "taiji.launch.cli", "sched", command, "--state-dir", str(state), *args]


def run_live(
    policy: str,
    jobs: list[tuple[float, int, bool]],
    where: OneHost | NamespaceHosts,
    round_s: float,
    out: Path,
    timeout: float,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One live run: a fresh daemon, the workload submitted on schedule, until every job ended."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = {**os.environ, "TAIJI_HOME": str(out / "home")}
    slots = where.slots * len(where.addresses)
    load = {"start": [round(x, 2) for x in os.getloadavg()]}  # this box's load over the run, with its figures
    try:
        where.start(policy, round_s, out, env, extra)
        t0 = time.time()
        for offset, samples, rigid in jobs:
            time.sleep(max(0.0, t0 + offset - time.time()))
            where.submit(
                {
                    "command": [sys.executable, str(JOB), "--samples", str(samples), "--epochs", str(EPOCHS)],
                    "min_np": slots if rigid else 1,
                    "max_np": slots,
                    "np": slots,
                    "name": f"{samples // 1000}k",
                    "work": samples * EPOCHS,
                    "cwd": str(HERE.parent),
                }
            )
        deadline = time.monotonic() + timeout
        while True:
            saved = json.loads((where.state / "state.json").read_text())
            if len(saved["jobs"]) == len(jobs) and all(
                j["state"] not in ("queued", "running", "suspended") for j in saved["jobs"]
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{policy}: jobs still running after {timeout:.0f}s: "
                    f"{[(j['id'], j['state']) for j in saved['jobs']]}"
                )
            time.sleep(0.5)
        where.stop()
        load["end"] = [round(x, 2) for x in os.getloadavg()]
        (out / "load.json").write_text(json.dumps(load))
        return {
            "t0": t0,
            "jobs": saved["jobs"],
            "rounds": saved.get("rounds", []),
            "state": where.state,
            "load": load,
        }
    finally:
        where.close()


def saved_run(out: Path, jobs: list[tuple[float, int, bool]]) -> dict[str, Any]:
    """A finished live run as :func:`run_live` returned it, read back from its daemon's state
    (``--reuse``); its start is the first job's submission less that job's offset."""
    saved = json.loads((out / "state" / "state.json").read_text())
    if len(saved["jobs"]) != len(jobs) or any(
        j["state"] in ("queued", "running", "suspended") for j in saved["jobs"]
    ):
        raise RuntimeError(f"{out}: not a finished run of this workload ({len(saved['jobs'])} jobs saved)")
    first = min(saved["jobs"], key=lambda j: j["submitted"])
    load = json.loads((out / "load.json").read_text()) if (out / "load.json").exists() else None
    return {
        "t0": first["submitted"] - jobs[0][0],
        "jobs": saved["jobs"],
        "rounds": saved.get("rounds", []),
        "state": out / "state",
        "load": load,
    }


def wait_for_daemon(state: Path, daemon: subprocess.Popen, inside: bool = False) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads((state / "daemon.json").read_text())
            if inside or info["pid"] == daemon.pid:  # (a daemon inside a namespace has another pid there)
                return str(info["address"])
        except (OSError, ValueError, KeyError):
            pass
        if daemon.poll() is not None:
            raise RuntimeError(f"the scheduler daemon exited with {daemon.returncode}")
        time.sleep(0.1)
    raise RuntimeError("the scheduler daemon did not start within 60 s")


def stop_everything(daemon: subprocess.Popen, out: Path) -> None:
    """The daemon and every job launcher it started (each in a session of its own)."""
    if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
    for entry in (out / "home" / "jobs").glob("sched-*.json"):
        try:
            os.killpg(json.loads(entry.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError, ValueError, KeyError):
            pass


def job_events(state: Path, job_id: str) -> list[dict]:
    path = state / "jobs" / job_id / "run" / "events.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def oversubscribed(timelines: dict[str, list[tuple[float, int]]], slots: int) -> int:
    """Instants (change points) at which the jobs' workers together exceed ``slots`` (all hosts)."""
    holding, count = {}, 0
    for _t, job, n in sorted((t, job, n) for job, steps in timelines.items() for t, n in steps):
        holding[job] = n
        count += sum(holding.values()) > slots
    return count


def logged_oversubscribed(run: dict[str, Any], addresses: list[str], slots_per_host: int) -> int:
    """Instants at which some host held more workers than its slots, from the jobs' own event logs
    (start / resize / recovery with the workers on each host, written by each job's rank 0; 0 at the end)."""
    timelines = {
        job["id"]: placement_timeline(job_events(run["state"], job["id"]), addresses) for job in run["jobs"]
    }
    return len(oversubscribed_instants((slots_per_host,) * len(addresses), timelines))


def samples_audit(run: dict[str, Any]) -> dict[str, Any]:
    """Exactly-once across suspensions, per job, from the sample indices every worker process of
    every launcher it had logged (``_sched_job.py``;
    :func:`~taiji_harness.elastic_analysis.exactly_once_audit`): no sample committed twice in an epoch, none
    drawn for a step never committed, none left out."""
    jobs = {}
    for job in run["jobs"]:
        records = [
            json.loads(line)
            for path in sorted((run["state"] / "jobs" / job["id"] / "run").glob("samples-*.jsonl"))
            for line in path.read_text().splitlines()
            if line.strip()
        ]
        jobs[job["id"]] = {
            **exactly_once_audit(records, job["end"] // EPOCHS, EPOCHS),
            "suspensions": len(job.get("suspensions", [])),
        }
    return {"exactly_once": all(j["exactly_once"] for j in jobs.values()), "jobs": jobs}


def fixed_overhead(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per job, outside training: launch -> first step (interpreter, torch, data, join) and last
    step -> the daemon seeing the launcher exit; medians over every job of every run."""
    before, after = [], []
    for run in runs:
        for job in run["jobs"]:
            events = job_events(run["state"], job["id"])
            starts = [e["time"] for e in events if e["kind"] == "start"]
            ends = [e["time"] for e in events if e["kind"] == "end"]
            if starts and job.get("started"):
                before.append(starts[0] - job["started"])
            if ends and job.get("ended"):
                after.append(job["ended"] - ends[-1])
    return {
        "launch_to_first_step_s": round(statistics.median(before), 2) if before else 0.0,
        "last_step_to_exit_s": round(statistics.median(after), 2) if after else 0.0,
    }


def step_times(run: dict[str, Any]) -> dict[str, list[Measured]]:
    """Each job's mean step times per size over the whole run, from its own run log
    (:func:`~taiji.sched.live.logged_step_times`; else the daemon's recent readings)."""
    times = {}
    for job in run["jobs"]:
        path = run["state"] / "jobs" / job["id"] / "run" / METRICS_FILE
        measured = logged_step_times(read_jsonl(path), BATCH) if path.exists() else []
        times[job["id"]] = measured or [
            Measured(size_key(n, BATCH)[0], 1, statistics.median(t))
            for n, t in job["measured"].items()
            if t and size_key(n, BATCH)[1] == BATCH
        ]
    return times


def fitted_apps(run: dict[str, Any], slots: int) -> dict[str, Any]:
    """Each job's Application fitted to its :func:`step_times`."""
    return {
        job["id"]: live_application(
            job["id"], fit_step_model(BATCH, step_times(run)[job["id"]]), BATCH, max(job["end"], 1), 1, slots
        )
        for job in run["jobs"]
    }


def stalls(job: dict[str, Any]) -> list[float]:
    """Its suspensions' stalls (the ask -> its launcher gone) as the daemon measured them; from an
    older state, each resume's cost less that resume's boot (the daemon's cost is their sum)."""
    return job.get("stalls") or [
        cost - boot for cost, boot in zip(job.get("costs", []), job.get("boots", [])[1:])
    ]


def launches(job: dict[str, Any]) -> list[tuple[float, float | None]]:
    """(launch time, the daemon's first listing of its workers) of each of the job's launchers: its
    first, then one per resume. A daemon state without ``launches`` (older runs) gives the first and
    the last (``started``, ``resumed``); another resume's launch is its listing less the first's lag."""
    listings, listed = [], True
    for t, n in job.get("allocations", []):  # its sizes as observed; 0 once a launcher is gone
        if n and listed:
            listings.append(t)
        listed = not n
    times = list(job.get("launches") or [])
    if not times and job.get("started") is not None:
        lag = listings[0] - job["started"] if listings else 0.0
        times = [job["started"]] + [t - lag for t in listings[1:]]
        if job.get("resumed") is not None and len(times) > 1:
            times[-1] = job["resumed"]
    return [(t, listings[k] if k < len(listings) else None) for k, t in enumerate(times)]


def job_costs(cost: ResizeCost, job: dict[str, Any], run: dict[str, Any]) -> list[ResizeCost]:
    """A job's measured costs, one per launch (its first, then each resume: the simulator charges
    the k-th to its k-th launch). Its launch -> first step (its run log's ``start``); how much later
    the daemon saw that step (``seen``, from its ``boots``: launch -> its first reading of a step;
    the replay trains the job from the step, and its policy sees it boot until the daemon did); its
    workers from the daemon's first listing of them (``listed``); the stall of the suspension that
    ended the launch (ask -> launcher gone); its exit after its last step; the suspend + resume cost
    the daemon's rules counted (``suspend``: the median of its measured ones)."""
    events = job_events(run["state"], job["id"])
    steps = [e["time"] for e in events if e["kind"] == "start"]  # each launcher's first step
    ends = [e["time"] for e in events if e["kind"] == "end"]
    boots, stall, each = job.get("boots") or [], stalls(job), launches(job)
    if len(boots) != len(each):  # (the daemon keeps its latest few: they no longer match launches)
        boots = [statistics.median(boots)] * len(each) if boots else []
    out = []
    for k, ((launch, listing), step) in enumerate(zip(each, steps)):
        pause = step - launch
        seen = min(max(launch + boots[k] - step, 0.0), boots[k]) if k < len(boots) else 0.0
        out.append(
            dataclasses.replace(
                cost,
                start=out[0].start if out else pause,
                resume=pause if k else cost.resume,
                seen=seen,
                listed=None if listing is None else listing - launch,
                boot=boots[0] if boots else None,
                stall=stall[k] if k < len(stall) else statistics.median(stall) if stall else 0.0,
                suspend=statistics.median(job["costs"]) if job.get("costs") else cost.resume,
                exit=job["ended"] - ends[-1] if ends and job.get("ended") else None,
            )
        )
    return out or [cost]


def replay(
    policy: str,
    run: dict[str, Any],
    apps: dict,
    cluster: Cluster,
    round_s: float,
    startup: float,
    resume: float | None = None,
    las_threshold: float | str | None = None,
    rules: SuspendRules | None = None,
) -> dict[str, float]:
    """The simulator's JCT per job for the live run's workload, deciding as its daemon did
    (``resume``: the seconds a suspended job's resume costs, default the simulator's ``taiji``
    system's; ``las_threshold``: Tiresias's ``--las-threshold``; ``rules``: the daemon's suspension
    rules, whose ``max_per_hour`` 0 is the ``--min-np`` floor)."""
    specs = [
        JobSpec(job["id"], job["submitted"] - run["t0"], LIVE, job["requested"], BATCH) for job in run["jobs"]
    ]
    taiji, overhead = SYSTEMS["taiji"], fixed_overhead([run])
    joins = [s for job in run["jobs"] for s in job.get("joins", [])]  # a grow's ask -> its joiners seen
    cost = ResizeCost(
        start=startup,
        grow=taiji.grow,
        shrink=taiji.shrink,
        move=taiji.move,
        resume=taiji.resume_s if resume is None else resume,
        join=statistics.median(joins) if joins else overhead["launch_to_first_step_s"],
    )
    exit_s = overhead["last_step_to_exit_s"]
    own = tuple((job["id"], each) for job in run["jobs"] for each in job_costs(cost, job, run))
    config = SimConfig(
        cluster=cluster,
        interval_s=round_s,
        resize=cost,
        live=tuple(apps.items()),
        preemption=rules is None or rules.max_per_hour > 0,
        suspend_rules=rules,
        job_costs=own,
        exit_s=exit_s,
        same_tick_s=TICK_S / 2,
        min_replicas=tuple((job["id"], job["min_np"]) for job in run["jobs"]),
        round_times=tuple(t - run["t0"] for t in run.get("rounds", []) if t >= run["t0"]),
        daemon_view=DaemonGuess(
            step_times(run),
            {job["id"]: job["work_hint"] or job["end"] for job in run["jobs"]},
            BATCH,
            cluster.total_gpus,
        ),
    )
    decide = make_policy(
        policy, SYSTEMS["taiji"], las_threshold=las_threshold, round_s=round_s
    )  # as the daemon's
    if isinstance(
        decide, Pcrr
    ):  # its rounds round as the daemon's did (their seeds come from the daemon's clock)
        decide = dataclasses.replace(decide, seed_clock=run["t0"])
    result = simulate(specs, decide, config)
    return {record.name: record.jct for record in result.records}


def publish(rows: list[dict], audits: dict[str, dict], **fields: Any) -> None:
    """The result line (benchmarks/results/sched_live.json), then a non-zero exit if any job lost,
    repeated or never trained a sample (or logged none): the JSON shows which."""
    print_result(
        "sched_live",
        rows,
        samples_exactly_once=all(a["exactly_once"] for a in audits.values()),
        samples_audit_by_run=audits,
        **fields,
    )
    broken = {
        p: {j: a for j, a in audit["jobs"].items() if not a["exactly_once"]}
        for p, audit in audits.items()
        if not audit["exactly_once"]
    }
    if broken:
        raise SystemExit(
            f"sched_live.py: samples lost, repeated or never trained (or no sample log): {broken}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 jobs (default 8)")
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="worker slots per host (default: 2 on one host, this box's cores; 1 with --hosts)",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="emulated hosts (network namespaces, root only) with a daemon and an agent per host "
        "(default 1: this host, no namespaces)",
    )
    parser.add_argument(
        "--shape", default="400mbit", help="the last emulated host's link rate (tc tbf; '' for none)"
    )
    parser.add_argument("--round", type=float, default=2.0, help="seconds between the daemon's rounds")
    parser.add_argument("--seed", type=int, default=0, help="seeds the arrival times")
    parser.add_argument(
        "--timeout", type=float, default=None, help="per live run, seconds (default 300; full 900)"
    )
    parser.add_argument(
        "--out", default="runs/sched_live", help="daemon state and job logs (git-ignored runs/)"
    )
    parser.add_argument(
        "--compare",
        default="fifo",
        choices=("fifo", "suspend"),
        help="fifo: PCRR vs FIFO (default); suspend: PCRR and Tiresias with suspend/resume vs without",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="analyse the live runs saved under --out (one host) instead of running them again",
    )
    parser.add_argument(
        "--policies",
        default="pcrr,tiresias",
        help="with --compare suspend: the policies compared, each with and without suspend",
    )
    args = parser.parse_args(argv)
    reap_on_sigterm()
    chosen = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.compare == "suspend" and (not chosen or set(chosen) - {"pcrr", "tiresias"}):
        parser.error(f"--policies: a comma-separated subset of pcrr,tiresias, not {args.policies!r}")
    if args.compare == "suspend":
        shape = SUSPEND_QUICK if args.quick else SUSPEND_FULL
        jobs = workload(
            [n for n, _ in shape["jobs"]], shape["mean_gap_s"], args.seed, [r for _, r in shape["jobs"]]
        )
        never = ("--max-suspensions-per-hour", "0")
        las = ("--las-threshold", str(LAS_THRESHOLD))
        options = {"pcrr": (), "tiresias": las}
        plan = {
            name: (policy, extra)
            for policy in chosen
            for name, extra in ((policy + "+suspend", options[policy]), (policy, options[policy] + never))
        }
        rules = {
            name: SuspendRules(max_per_hour=0 if never[0] in extra else SuspendRules.max_per_hour)
            for name, (_, extra) in plan.items()
        }  # the daemons' (their defaults, or the floor)
    else:
        shape = QUICK if args.quick else FULL
        jobs = workload(shape["samples"], shape["mean_gap_s"], args.seed)
        plan = {"pcrr": ("pcrr", ()), "fifo": ("fifo", ())}
        rules = {}
    timeout = args.timeout or (300.0 if args.quick else 900.0)
    out = Path(args.out)
    per_host = args.slots or (2 if args.hosts == 1 else 1)
    where = OneHost(per_host) if args.hosts == 1 else NamespaceHosts(args.hosts, per_host, args.shape)
    slots = per_host * args.hosts
    runs = {}
    if args.reuse and args.hosts != 1:
        parser.error("--reuse reads runs of one host (--hosts 1)")
    try:
        for name, (policy, extra) in plan.items():
            if args.reuse:
                runs[name] = saved_run(out / name.replace("+", "_"), jobs)
                continue
            started = time.monotonic()
            runs[name] = run_live(
                policy, jobs, where, args.round, out / name.replace("+", "_"), timeout, extra
            )
            failed = [(j["id"], j["reason"]) for j in runs[name]["jobs"] if j["state"] != "finished"]
            if failed:
                raise RuntimeError(f"{name}: jobs did not finish: {failed} (logs under {out / name})")
            print(
                f"# {name}: {len(jobs)} jobs in {time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if isinstance(where, NamespaceHosts):
            where.release()

    live_jct = {p: {j["id"]: j["ended"] - j["submitted"] for j in run["jobs"]} for p, run in runs.items()}
    apps = {name: fitted_apps(run, slots) for name, run in runs.items()}
    overhead = {name: fixed_overhead([run]) for name, run in runs.items()}
    costs = [c for run in runs.values() for j in run["jobs"] for c in j.get("costs", [])]
    resume = statistics.median(costs) if costs else None  # measured: checkpoint stall + boot + load
    cluster = Cluster(args.hosts, per_host, per_host)
    las = {"tiresias": LAS_THRESHOLD} if args.compare == "suspend" else {}  # as the live runs' daemons
    sim_jct = {}
    for (
        name,
        run,
    ) in runs.items():  # each run replayed with what was measured in it (its load, its neighbours)
        own = [c for j in run["jobs"] for c in j.get("costs", [])]
        sim_jct[name] = replay(
            plan[name][0],
            run,
            apps[name],
            cluster,
            args.round,
            overhead[name]["launch_to_first_step_s"],
            statistics.median(own) if own else resume,
            las.get(plan[name][0]),
            rules.get(name),
        )
    replayed = list(runs)
    errors = {
        p: {j: abs(sim_jct[p][j] - live_jct[p][j]) / live_jct[p][j] for j in live_jct[p]} for p in replayed
    }
    sim_error_max = max(e for per in errors.values() for e in per.values())
    over = {
        p: {
            "observed": oversubscribed(
                {j["id"]: [tuple(a) for a in j["allocations"]] for j in run["jobs"]}, slots
            ),
            "logged": logged_oversubscribed(run, where.addresses, per_host),
        }
        for p, run in runs.items()
    }
    total_over = sum(v for per in over.values() for v in per.values())
    audits = {p: samples_audit(run) for p, run in runs.items()}

    def avg(values: dict[str, float]) -> float:
        return round(statistics.mean(values.values()), 2)

    if args.compare == "suspend":
        rows = []
        for policy in chosen:
            with_, without = avg(live_jct[policy + "+suspend"]), avg(live_jct[policy])
            rows.append(
                contract_row(
                    f"live avg JCT: {policy} with suspend vs without",
                    with_,
                    without,
                    higher_is_better=False,
                    unit="s",
                    target=GOAL_SUSPEND_SPEEDUP,
                    target_met=without / with_ >= GOAL_SUSPEND_SPEEDUP,
                    suspensions=sum(len(j.get("suspensions", [])) for j in runs[policy + "+suspend"]["jobs"]),
                )
            )
    else:
        rows = [
            contract_row(
                "live avg JCT: PCRR vs fifo",
                avg(live_jct["pcrr"]),
                avg(live_jct["fifo"]),
                higher_is_better=False,
                unit="s",
                target=GOAL_SPEEDUP,
                target_met=avg(live_jct["fifo"]) / avg(live_jct["pcrr"]) >= GOAL_SPEEDUP,
            ),
            contract_row(
                "simulated avg JCT: PCRR vs fifo",
                avg(sim_jct["pcrr"]),
                avg(sim_jct["fifo"]),
                higher_is_better=False,
                unit="s",
                source="the simulator replaying the live workload",
            ),
        ]
    first = next(iter(runs.values()))
    per_job = [
        {
            "job": j["id"],
            "samples": j["end"],
            "submitted_s": round(j["submitted"] - first["t0"], 2),
            **{f"{p}_live_jct_s": round(live_jct[p][j["id"]], 2) for p in runs},
            **{f"{p}_sim_jct_s": round(sim_jct[p][j["id"]], 2) for p in sim_jct},
            "measured_sizes": sorted(size_key(n, BATCH)[0] for n in j["measured"]),
        }
        for j in first["jobs"]
    ]
    publish(
        rows,
        audits,
        sim_error_max=round(sim_error_max, 3),
        sim_error_target=GOAL_SIM_ERROR,
        sim_error_by_run={p: round(max(per.values()), 3) for p, per in errors.items()},
        sim_error_avg_jct_by_run={
            p: round(abs(avg(sim_jct[p]) - avg(live_jct[p])) / avg(live_jct[p]), 3) for p in replayed
        },  # the policies' objective: less chaotic than a job's
        load_by_run={p: run.get("load") for p, run in runs.items()},
        oversubscribed=total_over,
        oversubscribed_by_run=over,
        fixed_overhead=overhead,
        resume_cost_s=None if resume is None else round(resume, 2),
        compare=args.compare,
        slots=slots,
        hosts=args.hosts,
        slots_per_host=per_host,
        shaped=args.shape if args.hosts > 1 else "",
        round_s=args.round,
        quick=args.quick,
        jobs=per_job,
        arrivals=[{"offset_s": t, "samples": n, "holds_every_slot": r} for t, n, r in jobs],
    )


if __name__ == "__main__":
    main()
