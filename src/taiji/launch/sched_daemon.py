"""``taiji sched serve``: the live scheduler daemon (effects around :mod:`taiji.sched.daemon`: processes and sockets live in launch/).

Files under the state directory (default ``$TAIJI_HOME/sched``, i.e. ``~/.taiji/sched``):
``secret`` (0600; what clients sign requests with), ``daemon.json`` (the address and pid of the
running daemon), ``state.json`` (every job and outstanding ask, rewritten after each change) and
``jobs/<id>/`` (each job's launcher log and run directory).

Each job runs under its own ``taiji run -np N --min-np A --max-np B --job-id sched-<id>`` in a
session of its own, so a daemon that is killed leaves its jobs running at their sizes; a restarted
daemon loads ``state.json`` and re-adopts the jobs whose launchers still run. The daemon reads each
launcher's status through its control socket (as ``taiji status`` does) every tick, proposes
resizes through it (as ``taiji resize`` does) and starts queued jobs; ``Scheduler`` decides. A
daemon stopped on purpose (SIGTERM, SIGINT, ``taiji sched stop``) stops its jobs first: nothing it
started is left running.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import env
from ..cluster.auth import new_secret, write_secret_file
from ..errors import ConfigError, StoreError, TaijiError
from . import control, registry
from ..metrics.runlog import EVENTS_FILE
from ..sched.daemon import Observed, Scheduler
from .sched_channel import RequestServer
from ..sched.rounds import Change

log = logging.getLogger(__name__)

TICK_S = 0.5
STOP_GRACE_S = 10.0


def state_dir(path: str | None = None) -> Path:
    return Path(path) if path else Path(env.HOME.get() or Path.home() / ".taiji") / "sched"


def read_secret(directory: Path) -> bytes:
    path = directory / "secret"
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        raise StoreError(f"cannot read the scheduler's secret {path}: is a daemon set up here "
                         f"(`taiji sched serve`), and is --state-dir right?") from None


def daemon_address(directory: Path) -> str:
    try:
        return str(json.loads((directory / "daemon.json").read_text())["address"])
    except (OSError, ValueError, KeyError):
        raise StoreError(f"no scheduler daemon is running for {directory} (no daemon.json); start one "
                         f"with `taiji sched serve --slots N`") from None


def running_daemon_pid(directory: Path) -> int | None:
    """The pid in ``daemon.json`` if that process still runs (a SIGKILLed daemon leaves the file)."""
    try:
        pid = int(json.loads((directory / "daemon.json").read_text())["pid"])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, KeyError, TypeError):
        return None


def launcher_id(job_id: str) -> str:
    return f"sched-{job_id}"


class Daemon:
    def __init__(self, directory: Path, scheduler: Scheduler, round_seconds: float, address: str):
        if round_seconds <= 0:
            raise ConfigError(f"--round must be > 0 seconds, got {round_seconds}")
        self.dir = directory
        self.sched = scheduler
        self.round_seconds = round_seconds
        self.address = address
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.children: dict[str, subprocess.Popen] = {}
        self._dirty = True

    # -- the loop -------------------------------------------------------------------------------

    def serve(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = open(self.dir / "lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # one daemon per state directory
        except OSError:
            lock.close()
            raise ConfigError(f"a scheduler daemon (pid {running_daemon_pid(self.dir)}) already serves {self.dir}; "
                              f"stop it with `taiji sched stop` or give this one another --state-dir") from None
        secret_path = self.dir / "secret"
        if not secret_path.exists():
            write_secret_file(secret_path, new_secret())
        self._load()
        try:
            server = RequestServer(self.address, read_secret(self.dir), self._handle)
        except (OSError, ValueError) as exc:
            lock.close()
            raise ConfigError(f"cannot listen on --address {self.address}: {exc}") from None
        _write_atomically(self.dir / "daemon.json", json.dumps({"address": server.address, "pid": os.getpid()}))
        log.info("taiji sched: serving on %s with %d slot(s), policy %s, a round every %gs (state in %s)",
                 server.address, self.sched.slots, self.sched.policy.name, self.round_seconds, self.dir)
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
                            changes += self.sched.round(now)
                        self._apply(now, changes)
                        self._save()
                    except Exception:   # one bad tick (a policy's error, a full disk) must not stop every job
                        log.exception("taiji sched: this tick failed; the daemon goes on")
                self.stop.wait(TICK_S)
        finally:
            server.close()
            with self.lock:
                self._stop_all()
                self._save()
            (self.dir / "daemon.json").unlink(missing_ok=True)
            lock.close()
        return 0

    def _observe(self, now: float) -> None:
        for job in [j for j in self.sched.jobs.values() if j.state == "running"]:
            child = self.children.get(job.id)
            code = child.poll() if child is not None else None
            if code is not None:
                self._end(now, job.id, "finished" if code == 0 else "failed",
                          "" if code == 0 else f"its launcher exited with {code} (see {self._job_dir(job.id)}/launcher.log)")
                continue
            try:
                status = control.request(registry.control_socket(launcher_id(job.id)), {"op": "status"}, timeout=2.0)
            except StoreError:
                if child is None and not self._launcher_running(job.id):
                    self._end(now, job.id, *self._outcome_of_adopted(job.id))
                continue   # starting up, or busy: read again next tick
            progress = status.get("progress") or {}
            self.sched.observe(now, job.id, Observed(
                size=len(status.get("workers", [])), version=int(status.get("version", 0)),
                step=int(progress.get("step", 0)), batch_size=int(progress.get("batch_size", 0)),
                position=int(progress.get("position", 0)), end=int(progress.get("end", 0)),
                samples_per_s=float(progress.get("samples_per_s", 0.0))))
            self._dirty = True

    def _apply(self, now: float, changes: list[Change]) -> None:
        for change in changes:
            workers = sum(change.after)
            job = self.sched.jobs[change.job]
            if job.state == "queued":   # (a running job may show 0 workers while it starts: not a start)
                self._launch(now, job.id, workers)
                self._save()   # a daemon killed now must not launch it again after a restart
            else:
                try:
                    control.request(registry.control_socket(launcher_id(job.id)),
                                    {"op": "resize", "size": workers, "source": "taiji sched"})
                    log.info("job %s (%s): asked for %d worker(s) (%s; it runs %d)", job.id, job.name, workers,
                             change.kind, job.size)
                except StoreError as exc:
                    self.sched.request_failed(job.id)
                    log.warning("job %s: could not ask for %d workers (%s); the next round asks again",
                                job.id, workers, exc)
            self._dirty = True

    def _launch(self, now: float, job_id: str, workers: int) -> None:
        job = self.sched.jobs[job_id]
        where = self._job_dir(job_id)
        where.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "taiji.launch.cli", "run", "-np", str(workers), "--min-np", str(job.min_np),
                   "--max-np", str(job.max_np), "--job-id", launcher_id(job_id), "--run-dir", str(where / "run"),
                   "--", *job.command]
        try:
            with open(where / "launcher.log", "ab") as out:
                self.children[job_id] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                         stdin=subprocess.DEVNULL, cwd=job.cwd or None,
                                                         start_new_session=True)
        except OSError as exc:   # e.g. the directory it was submitted from is gone
            self.sched.launched(now, job_id)
            self._end(now, job_id, "failed", f"could not start its launcher: {exc}")
            return
        self.sched.launched(now, job_id)
        log.info("job %s (%s): started on %d worker(s)", job_id, job.name, workers)

    def _end(self, now: float, job_id: str, state: str, reason: str = "") -> None:
        self.sched.ended(now, job_id, state, reason)
        self.children.pop(job_id, None)
        job = self.sched.jobs[job_id]
        log.info("job %s (%s): %s%s after %.1fs", job_id, job.name, state, f" ({reason})" if reason else "",
                 now - job.submitted)
        self._dirty = True

    # -- requests -------------------------------------------------------------------------------

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        with self.lock:
            now = time.time()
            try:
                if op == "submit":
                    job = self.sched.submit(now, [str(c) for c in request.get("command", [])],
                                            int(request.get("min_np", 1)),
                                            None if request.get("max_np") is None else int(request["max_np"]),
                                            None if request.get("np") is None else int(request["np"]),
                                            float(request.get("weight", 1.0)), str(request.get("name", "")),
                                            cwd=str(request.get("cwd", "")), work=int(request.get("work", 0)))
                    self._dirty = True
                    return {"ok": True, "job": job.id}
                if op == "status":
                    return {"ok": True, **self.sched.to_json(), "policy": self.sched.policy.name, "now": now}
                if op == "cancel":
                    job_id = str(request.get("job", ""))
                    if job_id not in self.sched.jobs:
                        return {"ok": False, "error": f"no job {job_id!r}; `taiji sched status` lists them"}
                    self._cancel(now, job_id, "cancelled by `taiji sched cancel`")
                    return {"ok": True, "job": job_id, "state": self.sched.jobs[job_id].state}
                if op == "stop":
                    self.stop.set()
                    return {"ok": True}
            except (ConfigError, ValueError, TypeError) as exc:
                return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown request {op!r}"}

    def _cancel(self, now: float, job_id: str, reason: str) -> None:
        job = self.sched.jobs[job_id]
        if job.state == "running":
            self._terminate(job_id)
        if job.active:
            self._end(now, job_id, "cancelled", reason)

    # -- processes ------------------------------------------------------------------------------

    def _terminate(self, job_id: str) -> None:
        """SIGTERM the job's launcher session (its workers stop with it), SIGKILL after a grace."""
        if not self._signal(job_id, signal.SIGTERM):
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and self._alive(job_id):
            time.sleep(0.1)
        if self._alive(job_id):
            self._signal(job_id, signal.SIGKILL)
        child = self.children.get(job_id)
        if child is not None:
            try:
                child.wait(5.0)
            except subprocess.TimeoutExpired:
                log.warning("job %s: its launcher (pid %d) did not exit after SIGKILL", job_id, child.pid)

    def _signal(self, job_id: str, sig: int) -> bool:
        child = self.children.get(job_id)
        pid = child.pid if child is not None else self._adopted_pid(job_id)
        if pid is None:
            return False
        try:
            os.killpg(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _alive(self, job_id: str) -> bool:
        child = self.children.get(job_id)
        return child.poll() is None if child is not None else self._launcher_running(job_id)

    def _stop_all(self) -> None:
        """SIGTERM every job at once, then wait for them together (not one grace period each)."""
        active = [j.id for j in self.sched.jobs.values() if j.active]
        for job_id in active:
            self._signal(job_id, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(self._alive(j) for j in active):
            time.sleep(0.1)
        now = time.time()
        for job_id in active:
            self._cancel(now, job_id, "the scheduler daemon stopped")

    def _adopted_pid(self, job_id: str) -> int | None:
        running = [e.pid for e in registry.all_jobs() if e.job == launcher_id(job_id) and e.running]
        return running[0] if running else None

    def _launcher_running(self, job_id: str) -> bool:
        return self._adopted_pid(job_id) is not None

    def _outcome_of_adopted(self, job_id: str) -> tuple[str, str]:
        """A re-adopted job's launcher is gone: it finished if its run log says it ended."""
        events = self._job_dir(job_id) / "run" / EVENTS_FILE
        try:
            ended = any(json.loads(line).get("kind") == "end" for line in events.read_text().splitlines() if line)
        except (OSError, ValueError):
            ended = False
        return ("finished", "") if ended else ("failed", "its launcher is gone and its run log has no end")

    # -- state ----------------------------------------------------------------------------------

    def _job_dir(self, job_id: str) -> Path:
        return self.dir / "jobs" / job_id

    def _load(self) -> None:
        path = self.dir / "state.json"
        if not path.exists():
            return
        try:
            self.sched.load_json(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"cannot read the saved scheduler state {path} ({exc}); move it away to start afresh")
        now = time.time()
        for job in [j for j in self.sched.jobs.values() if j.state == "running"]:
            if self._launcher_running(job.id):
                log.info("re-adopted job %s (%s): its launcher still runs", job.id, job.name)
            else:
                self._end(now, job.id, *self._outcome_of_adopted(job.id))

    def _save(self) -> None:
        if not self._dirty:
            return
        _write_atomically(self.dir / "state.json", json.dumps(self.sched.to_json()))
        self._dirty = False


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)   # readers never see half a file


def run_daemon(directory: Path, scheduler: Scheduler, round_seconds: float, address: str) -> int:
    daemon = Daemon(directory, scheduler, round_seconds, address)
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
