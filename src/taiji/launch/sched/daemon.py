"""``taiji sched serve``: the live scheduler daemon (effects around :mod:`taiji.sched.scheduler`:
processes and sockets live in launch/). Its files are in its state directory
(:mod:`~taiji.launch.sched.statedir`).

Each job runs under its own ``taiji run -np N --min-np A --max-np B --job-id sched-<id>`` in a
session of its own — on this host, or on the host an agent runs (``--hosts``; the
:mod:`~taiji.launch.sched.hosts` part hides which) — so a daemon that is killed leaves its jobs
running at their sizes; a restarted daemon loads ``state.json`` and re-adopts the jobs whose
launchers still run. Every tick the daemon reads each launcher's status (as ``taiji status``
does), proposes resizes (as ``taiji resize`` does; placed on many hosts), sends again an ask a job
has not reached, and starts queued jobs; ``Scheduler`` decides. A cancelled job keeps its slots
until its launcher is gone. A daemon stopped on purpose (SIGTERM, SIGINT, ``taiji sched stop``)
stops its jobs first (agents keep polling meanwhile): nothing it started is left running.

Every job runs with ``--checkpoint-dir`` and ``--resume auto``: to suspend one, the daemon sends
its launcher SIGTERM (a final checkpoint at the next step boundary, exit 75) and counts its slots
free once the launcher is gone; to resume it, it starts a launcher again (same run directory, same
checkpoints) at the size and on the host the round gives. A job whose home host is lost, with a
checkpoint to resume from, is suspended instead of failed: it resumes on the hosts left.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ...cluster.auth import new_secret, write_secret_file
from ...errors import ConfigError, LaunchError, StoreError, TaijiError
from ...metrics.prometheus import sched_families
from ...metrics.runlog import METRICS_FILE, read_jsonl_ends
from ...sched.goodput import batch_stats
from ...sched.livejob import Observed
from ...sched.preemption import suspension_of
from ...sched.rounds import Change
from ...sched.scheduler import Scheduler
from ..checkpoint_cli import EXIT_RESUMABLE, EXIT_STOPPED_UNSAVED
from ..metrics_http import MetricsConfig, MetricsServer
from .channel import RequestServer
from .hosts import CHECKPOINT_GRACE_S, STOP_GRACE_S, AgentHosts, JobHosts, LocalHost
from .launcher import latest_checkpoint, launcher_args, outcome_of_adopted
from .statedir import job_dir, read_secret, running_daemon_pid, write_atomically

log = logging.getLogger(__name__)

TICK_S = 0.5
RESEND_S = 2.0  # an ask the job has not reached is sent again this often (a launcher may refuse one)


class Daemon:
    def __init__(
        self,
        directory: Path,
        scheduler: Scheduler,
        round_seconds: float,
        address: str,
        hosts: JobHosts | None = None,
        metrics: MetricsConfig | None = None,
        checkpoint_grace: float = CHECKPOINT_GRACE_S,
    ):
        if round_seconds <= 0:
            raise ConfigError(f"--round must be > 0 seconds, got {round_seconds}")
        self.dir = directory
        self.sched = scheduler
        self.round_seconds = round_seconds
        self.checkpoint_grace = checkpoint_grace  # each job's --checkpoint-grace
        self.address = address
        self.hosts: JobHosts = hosts if hosts is not None else LocalHost()
        if len(self.hosts.addresses) != scheduler.hosts:
            raise ConfigError(
                f"{len(self.hosts.addresses)} host(s) to run jobs on, but the scheduler has {scheduler.hosts}"
            )
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stopping: dict[str, tuple[float, str, bool]] = {}  # job -> (SIGTERM sent at, reason, SIGKILLed)
        self.sent: dict[str, tuple[float, tuple[int, ...]]] = {}  # job -> (when, what) it was last asked
        self.joining: dict[str, int] = {}  # job -> its joiners still booting
        self._dirty = True
        self.metrics = metrics  # --metrics-port: rounds run, the last one's decision time, changes by kind
        self.rounds_run, self.round_took = 0, None
        self.decisions: dict[str, int] = {}

    # -- the loop -------------------------------------------------------------------------------

    def serve(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = open(self.dir / "lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one daemon per state directory
        except OSError:
            lock.close()
            raise ConfigError(
                f"a scheduler daemon (pid {running_daemon_pid(self.dir)}) already serves {self.dir}; "
                f"stop it with `taiji sched stop` or give this one another --state-dir"
            ) from None
        secret_path = self.dir / "secret"
        if not secret_path.exists():
            write_secret_file(secret_path, new_secret())
        self._load()
        try:
            server = RequestServer(self.address, read_secret(self.dir), self._handle)
        except (OSError, ValueError) as exc:
            lock.close()
            raise ConfigError(f"cannot listen on --address {self.address}: {exc}") from None
        try:
            exporter = MetricsServer(self.metrics, self.metric_families) if self.metrics is not None else None
        except LaunchError as exc:
            server.close()
            lock.close()
            raise ConfigError(str(exc)) from None
        write_atomically(
            self.dir / "daemon.json", json.dumps({"address": server.address, "pid": os.getpid()})
        )
        log.info(
            "taiji sched: serving on %s with %d host(s) of %d slot(s), policy %s, a round every %gs "
            "(state in %s)",
            server.address,
            self.sched.hosts,
            self.sched.slots_per_host,
            self.sched.policy.name,
            self.round_seconds,
            self.dir,
        )
        next_round = time.monotonic()
        try:
            while not self.stop.is_set():
                with self.lock:
                    try:
                        now = time.time()
                        self._observe(now)
                        changes = self.sched.tick(now)
                        if time.monotonic() >= next_round:
                            next_round = time.monotonic() + self.round_seconds
                            started = time.perf_counter()
                            self._read_run_logs()
                            changes += self.sched.round(now)
                            self.rounds_run, self.round_took = (
                                self.rounds_run + 1,
                                time.perf_counter() - started,
                            )
                        self._apply(now, changes)
                        self._ask_again()
                        self._save()
                    except Exception:  # one bad tick (a policy's error, a full disk) must not stop every job
                        log.exception("taiji sched: this tick failed; the daemon goes on")
                self.stop.wait(TICK_S)
        finally:
            try:
                self._stop_all()  # (agents still poll: they take the stop orders)
            finally:
                server.close()
                if exporter is not None:
                    exporter.close()
                (self.dir / "daemon.json").unlink(missing_ok=True)
                lock.close()
        return 0

    def status(self, now: float) -> dict[str, Any]:
        """What `taiji sched status` shows (call with the lock held)."""
        return {
            "ok": True,
            **self.sched.to_json(),
            "policy": self.sched.policy.name,
            "now": now,
            "host_names": list(self.hosts.addresses),
            "up": list(self.sched.up),
        }

    def metric_families(self) -> list:
        """The scheduler's Prometheus families (metrics/prometheus.py), read under the lock."""
        with self.lock:
            return sched_families(
                self.status(time.time()), self.rounds_run, self.round_took, dict(self.decisions)
            )

    def _observe(self, now: float) -> None:
        for host, up in self.hosts.poll_hosts(time.monotonic()):
            self.sched.host_state(host, up)
            self._dirty = True
        for job in [j for j in self.sched.jobs.values() if j.state == "running"]:
            code = self.hosts.outcome(job.id)
            if code is not None and job.id not in self.stopping and self._resumable(job.id, code, now):
                continue
            if code is not None:
                why = self.hosts.note(job.id) or f"see {self._job_dir(job.id)}/launcher.log on its host"
                self._ended_with(
                    now,
                    job.id,
                    "finished" if code == 0 else "failed",
                    "" if code == 0 else f"its launcher exited with {code} ({why})",
                )
                continue
            if job.id in self.stopping:
                self._escalate(job.id)
            status = self.hosts.status(job.id)
            if status is None:
                if not self.hosts.running(job.id) and not (
                    job.suspending is not None and self._resumable(job.id, EXIT_RESUMABLE, now)
                ):
                    self._ended_with(now, job.id, *outcome_of_adopted(self._job_dir(job.id)))
                continue  # starting up, or busy: read again next tick
            progress = status.get("progress") or {}
            self.joining[job.id] = len(status.get("joiners", []))
            self.sched.observe(
                now,
                job.id,
                Observed(
                    size=len(status.get("workers", [])),
                    version=int(status.get("version", 0)),
                    step=int(progress.get("step", 0)),
                    batch_size=int(progress.get("batch_size", 0)),
                    position=int(progress.get("position", 0)),
                    end=int(progress.get("end", 0)),
                    samples_per_s=float(progress.get("samples_per_s", 0.0)),
                    placement=self._placement(status),
                ),
            )
            self._dirty = True

    def _read_run_logs(self) -> None:
        """Each running job's batch and gradient noise scale from its run log (its first rows and
        its latest 64 KiB), for the round's goodput model; the scheduler decides what they mean."""
        for job in [j for j in self.sched.jobs.values() if j.state == "running"]:
            first, latest = read_jsonl_ends(self._job_dir(job.id) / "run" / METRICS_FILE)
            self.sched.read_run_log(job.id, batch_stats(first, latest))

    def _resumable(self, job_id: str, code: int, now: float | None = None) -> bool:
        """A launcher that exited after a suspension, or on a lost home host, with a checkpoint
        to resume from (or asked to suspend before it had one): the job is suspended (True), not
        ended (:func:`~taiji.sched.preemption.suspension_of`). ``now``: the tick's time (what the
        round after it sees), else the clock's."""
        job = self.sched.jobs[job_id]
        outcome = suspension_of(
            code == EXIT_RESUMABLE,
            code == EXIT_STOPPED_UNSAVED,
            job.suspending is not None,
            code != 0 and self.hosts.home_lost(job_id),
            latest_checkpoint(job.checkpoint_dir),
            self.hosts.addresses[max(job.home, 0)],
        )
        if outcome is None:
            return False
        step, reason = outcome
        self.sched.suspended(time.time() if now is None else now, job_id, step, reason)
        self.hosts.forget(job_id)
        self.sent.pop(job_id, None)
        self.joining.pop(job_id, None)
        log.info(
            "job %s (%s): suspended at step %d%s; it resumes from its checkpoint when a round gives it slots",
            job_id,
            job.name,
            step,
            f" ({reason})" if reason else "",
        )
        self._dirty = True
        return True

    def _placement(self, status: dict[str, Any]) -> tuple[int, ...]:
        """Workers per host (in the daemon's host order) from a launcher's status; () on one host."""
        if len(self.hosts.addresses) == 1:
            return ()
        used = {str(address): int(n) for address, _, n in status.get("hosts", [])}
        return tuple(used.get(address, 0) for address in self.hosts.addresses)

    def _apply(self, now: float, changes: list[Change]) -> None:
        for change in changes:
            self.decisions[change.kind] = self.decisions.get(change.kind, 0) + 1
            workers = sum(change.after)
            job = self.sched.jobs[change.job]
            if job.state in ("queued", "suspended"):  # (a running job may show 0 workers while it starts)
                self._launch(now, job.id, change.after)
                self._save()  # a daemon killed now must not launch it again after a restart
            elif change.kind == "suspend":
                self.sched.suspending_job(now, job.id)
                self._save()  # a daemon killed now knows the job is on its way out
                self.hosts.signal(job.id, signal.SIGTERM)
                log.info(
                    "job %s (%s): suspending (a final checkpoint at its next step, then its %d slot(s) "
                    "are free)",
                    job.id,
                    job.name,
                    job.size,
                )
            else:
                try:
                    self.hosts.resize(job.id, workers, change.after)
                    self.sent[job.id] = (time.monotonic(), change.after)
                    log.info(
                        "job %s (%s): asked for %d worker(s) %s(%s; it runs %d)",
                        job.id,
                        job.name,
                        workers,
                        self._where(change.after),
                        change.kind,
                        job.size,
                    )
                except StoreError as exc:
                    self.sched.request_failed(job.id)
                    log.warning(
                        "job %s: could not ask for %d workers (%s); the next round asks again",
                        job.id,
                        workers,
                        exc,
                    )
            self._dirty = True

    def _ask_again(self) -> None:
        """Send again what a job was asked and has not reached (a launcher refuses a placed resize
        while joiners boot, and a round does not repeat an ask): once its joiners are in."""
        for job_id, ask in list(self.sched.rounds.asked.items()):
            job = self.sched.jobs.get(job_id)
            when, what = self.sent.get(job_id, (float("-inf"), ()))
            if (
                job is None
                or job.state != "running"
                or not job.size
                or job_id in self.stopping
                or self.joining.get(job_id)
                or job.suspending is not None
                or not any(ask.target)
                or (what == ask.target and time.monotonic() - when < RESEND_S)
            ):
                continue
            try:
                self.hosts.resize(job_id, sum(ask.target), ask.target)
                self.sent[job_id] = (time.monotonic(), ask.target)
            except StoreError as exc:
                log.debug("job %s: asking again failed (%s)", job_id, exc)

    def _where(self, placement: tuple[int, ...]) -> str:
        if len(placement) == 1:
            return ""
        return (
            "placed "
            + ",".join(f"{a}={n}" for a, n in zip(self.hosts.addresses, placement, strict=False) if n)
            + " "
        )

    def _launch(self, now: float, job_id: str, placement: tuple[int, ...]) -> None:
        job = self.sched.jobs[job_id]
        home = next(h for h, n in enumerate(placement) if n)
        where = self._job_dir(job_id)
        where.mkdir(parents=True, exist_ok=True)
        run_args = launcher_args(job, placement[home], where, self.checkpoint_grace)
        resuming = job.state == "suspended"
        try:
            self.hosts.launch(job_id, home, run_args, job.cwd, where / "launcher.log")
        except OSError as exc:  # e.g. the directory it was submitted from is gone
            self.sched.launched(now, job_id, home)
            self._ended_with(now, job_id, "failed", f"could not start its launcher: {exc}")
            return
        self.sched.launched(now, job_id, home)
        self.sent[job_id] = (time.monotonic(), placement)
        log.info(
            "job %s (%s): %s on %d worker(s) %s",
            job_id,
            job.name,
            f"resuming from step {job.stopped_at}" if resuming else "started",
            placement[home],
            self._where(placement),
        )

    def _ended_with(self, now: float, job_id: str, state: str, reason: str = "") -> None:
        """The job's launcher is gone: it ended as ``state`` — or as cancelled, if it was being stopped."""
        if job_id in self.stopping:
            state, reason = "cancelled", self.stopping.pop(job_id)[1]
        self.sched.ended(now, job_id, state, reason)
        self.hosts.forget(job_id)
        self.sent.pop(job_id, None)
        self.joining.pop(job_id, None)
        job = self.sched.jobs[job_id]
        log.info(
            "job %s (%s): %s%s after %.1fs",
            job_id,
            job.name,
            state,
            f" ({reason})" if reason else "",
            now - job.submitted,
        )
        self._dirty = True

    # -- requests -------------------------------------------------------------------------------

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "cancel":
            return self._cancel_request(str(request.get("job", "")))
        with self.lock:
            now = time.time()
            try:
                if op == "agent":
                    if not isinstance(self.hosts, AgentHosts):
                        return {
                            "ok": False,
                            "refused": True,
                            "error": "this daemon serves one host (it was started "
                            "with --slots, not --hosts FILE): agents have nothing to do for it",
                        }
                    return self.hosts.on_poll(time.monotonic(), request)
                if op == "submit":
                    job = self.sched.submit(
                        now,
                        [str(c) for c in request.get("command", [])],
                        int(request.get("min_np", 1)),
                        None if request.get("max_np") is None else int(request["max_np"]),
                        None if request.get("np") is None else int(request["np"]),
                        float(request.get("weight", 1.0)),
                        str(request.get("name", "")),
                        cwd=str(request.get("cwd", "")),
                        work=int(request.get("work", 0)),
                        priority=int(request.get("priority", 0)),
                        preemptible=not request.get("no_preempt", False),
                        checkpoint_dir=str(request.get("checkpoint_dir") or ""),
                        checkpoint_every=str(request.get("checkpoint_every") or ""),
                        max_batch=int(request.get("max_batch") or 0),
                    )
                    job.checkpoint_dir = job.checkpoint_dir or str(self._job_dir(job.id) / "checkpoints")
                    self._dirty = True
                    return {"ok": True, "job": job.id}
                if op == "status":
                    return self.status(now)
                if op == "stop":
                    self.stop.set()
                    return {"ok": True}
            except (ConfigError, ValueError, TypeError) as exc:
                return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown request {op!r}"}

    def _cancel_request(self, job_id: str) -> dict[str, Any]:
        """Stop the job and answer once it ended (its slots are free only then)."""
        with self.lock:
            if job_id not in self.sched.jobs:
                return {"ok": False, "error": f"no job {job_id!r}; `taiji sched status` lists them"}
            self._cancel(time.time(), job_id, "cancelled by `taiji sched cancel`")
        deadline = time.monotonic() + STOP_GRACE_S + 10.0
        while time.monotonic() < deadline and self.sched.jobs[job_id].active and not self.stop.is_set():
            time.sleep(0.1)
        return {"ok": True, "job": job_id, "state": self.sched.jobs[job_id].state}

    def _cancel(self, now: float, job_id: str, reason: str) -> None:
        """A queued job ends at once; a running one is sent SIGTERM and ends (as cancelled) when
        its launcher is gone — its slots stay held until then."""
        job = self.sched.jobs[job_id]
        if job.state in ("queued", "suspended"):
            self._ended_with(now, job_id, "cancelled", reason)
        elif job.state == "running" and job_id not in self.stopping:
            self.stopping[job_id] = (time.monotonic(), reason, False)
            self.hosts.signal(job_id, signal.SIGTERM)

    def _escalate(self, job_id: str) -> None:
        sent, reason, killed = self.stopping[job_id]
        if not killed and time.monotonic() - sent > STOP_GRACE_S:
            log.warning("job %s: still running %gs after SIGTERM: SIGKILL", job_id, STOP_GRACE_S)
            self.hosts.signal(job_id, signal.SIGKILL)
            self.stopping[job_id] = (sent, reason, True)

    def _stop_all(self) -> None:
        """Stop every job at once, wait for them together (agents keep polling meanwhile), then
        count what is left as cancelled."""
        with self.lock:
            for job in [j for j in self.sched.jobs.values() if j.active]:
                self._cancel(time.time(), job.id, "the scheduler daemon stopped")
        deadline = time.monotonic() + STOP_GRACE_S + 10.0
        while time.monotonic() < deadline:
            with self.lock:
                self._observe(time.time())
                if not self.stopping:
                    break
            time.sleep(0.1)
        with self.lock:
            for job_id in list(self.stopping):
                log.warning("job %s: its launcher did not report its exit; counted as cancelled", job_id)
                self._ended_with(time.time(), job_id, "cancelled")
            self._save()

    # -- state ----------------------------------------------------------------------------------

    def _job_dir(self, job_id: str) -> Path:
        return job_dir(self.dir, job_id)

    def _load(self) -> None:
        path = self.dir / "state.json"
        if not path.exists():
            return
        try:
            self.sched.load_json(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"cannot read the saved scheduler state {path} ({exc}); move it away to start afresh"
            ) from exc
        now = time.time()
        for job in [j for j in self.sched.jobs.values() if j.state == "running"]:
            self.hosts.adopt(job.id, max(job.home, 0))
            if self.hosts.running(job.id):
                log.info(
                    "re-adopted job %s (%s): its launcher still runs%s",
                    job.id,
                    job.name,
                    " (suspending)" if job.suspending is not None else "",
                )
            elif job.suspending is None or not self._resumable(job.id, EXIT_RESUMABLE):
                self._ended_with(now, job.id, *outcome_of_adopted(self._job_dir(job.id)))

    def _save(self) -> None:
        if not self._dirty:
            return
        write_atomically(self.dir / "state.json", json.dumps(self.sched.to_json()))
        self._dirty = False


def run_daemon(
    directory: Path,
    scheduler: Scheduler,
    round_seconds: float,
    address: str,
    hosts: JobHosts | None = None,
    metrics: MetricsConfig | None = None,
    checkpoint_grace: float = CHECKPOINT_GRACE_S,
) -> int:
    daemon = Daemon(directory, scheduler, round_seconds, address, hosts, metrics, checkpoint_grace)
    stop_on = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, lambda *_: daemon.stop.set()) for s in stop_on}
    try:
        return daemon.serve()
    except TaijiError as exc:
        log.error("taiji sched serve: %s", exc)
        return 2
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
