"""The launcher's driver: feeds events to the pure controller and carries out its actions.

Events come from worker exits (pidfds), signals, and a few store keys polled every tick
(resize proposals, joiners ready, failure reports, job done); the store is hosted in this
process, so a poll is a local round trip.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from typing import Callable

from ..cluster import controller as ctl
from ..cluster import spec
from ..cluster.store import JobStore, host_store
from ..errors import StoreError
from . import registry
from .control import ControlServer
from .supervisor import Supervisor, WorkerProcess, describe_exit

log = logging.getLogger(__name__)

TICK_SECONDS = 0.02
SNAPSHOT_SECONDS = 0.25  # how often rank 0's progress is read for `taiji status`
BEAT_POLL_TICKS = 5  # heartbeats are read every 0.1 s: well within the 1 s that tells busy from stuck


@dataclass(frozen=True)
class DriverConfig:
    job_id: str
    nproc: int
    command: tuple[str, ...]
    bounds: ctl.Bounds
    host: str = "127.0.0.1"
    port: int = 0
    timeout: float = 60.0
    grace: float = 5.0


class Driver:
    def __init__(self, cfg: DriverConfig, make_env: Callable[[spec.WorkerSpec, int, int, int, str], dict],
                 output=None):
        self.cfg = cfg
        self.make_env = make_env
        self.sup = Supervisor(output=output)
        self.store = host_store(cfg.host, cfg.port, timeout=cfg.timeout)
        self.job = JobStore(self.store, cfg.job_id)
        self.secret = secrets.token_hex(16)
        self.state = ctl.initial_state(cfg.nproc, cfg.bounds, cfg.host)
        self._proposal_seq = 0
        self._beat_counts: dict[str, int] = {}
        self._ticks = 0
        self._done_seen = False
        self._fatal_seen = False
        self._snapshot: dict = {}
        self._snapshot_at = float("-inf")
        self._progress: dict | None = None
        self.control: ControlServer | None = None

    def say(self, text: str) -> None:
        self.sup.write(f"taiji: {text}\n")

    # -- actions ----------------------------------------------------------------------

    def _spawn(self, ids: tuple[str, ...]) -> None:
        joiner_ids = [j.id for j in self.state.joiners]
        size = self.state.config.size + len(joiner_ids)
        for wid in ids:  # a joiner's rank is provisional: where it will be appended
            rank = self.state.config.rank_of(wid)
            if rank is None:
                rank = self.state.config.size + joiner_ids.index(wid)
            worker = spec.WorkerSpec(wid, self.cfg.host)
            self.sup.spawn(wid, rank, self.cfg.command,
                           self.make_env(worker, rank, size, self.store.port, self.secret))

    def _publish(self, config: spec.ClusterConfig, reason: str) -> None:
        if not self.job.publish(config):
            raise StoreError(f"job {self.cfg.job_id}: could not publish cluster v{config.version} "
                             "(another writer published it); the job store is corrupt")
        for wid, worker in self.sup.workers.items():
            rank = config.rank_of(wid)
            if rank is not None:
                worker.rank = rank
        self.say(f"cluster v{config.version}: {config.size} worker(s) {list(config.ids)} ({reason})")

    def _report_root_cause(self, worker: WorkerProcess) -> None:
        lines = "\n".join(f"    {line}" for line in list(worker.tail)[-20:]) or "    (no output)"
        assert worker.exit_code is not None
        self.say(f"worker {worker.worker_id} (rank {worker.rank}, pid {worker.pid}) failed first: "
                 f"{describe_exit(worker.exit_code)}. Last lines of its output:\n{lines}")

    def _apply(self, actions: list[ctl.Action]) -> int | None:
        for action in actions:
            if isinstance(action, ctl.Spawn):
                self._spawn(action.ids)
            elif isinstance(action, ctl.Kill):
                if action.id in self.sup.workers and self.sup.workers[action.id].running:
                    self.say(f"stopping worker {action.id}: {action.reason}")
                self.sup.kill(action.id)
            elif isinstance(action, ctl.Publish):
                self._publish(action.config, action.reason)
            elif isinstance(action, ctl.Log):
                self.say(action.message)
            elif isinstance(action, ctl.Finish):
                if action.code != 0:
                    failed = self.sup.workers.get(action.failed_worker or "")
                    if failed is not None and failed.exit_code is not None:
                        self._report_root_cause(failed)
                    self.say(f"job {self.cfg.job_id} stopped: {action.reason}")
                return action.code
        return None

    def _feed(self, event: ctl.Event) -> int | None:
        self.state, actions = ctl.decide(self.state, event, time.monotonic())
        return self._apply(actions)

    # -- events from the store ----------------------------------------------------------

    def _store_events(self) -> list[ctl.Event]:
        events: list[ctl.Event] = []
        self._proposal_seq, proposals = self.job.proposals_after(self._proposal_seq)
        events += [ctl.Proposal(int(p["size"]), str(p.get("source", "user"))) for p in proposals]
        events += [ctl.WorkerReady(j.id) for j in self.state.joiners
                   if not j.ready and self.job.is_ready(j.id)]
        version = self.state.config.version
        reported = self.job.failure_reports(version, self.state.config.ids)
        events += [ctl.FailureReported(i, version) for i in reported if i not in self.state.reports]
        if not self._fatal_seen:
            fatal = self.job.fatal_report()
            if fatal is not None:
                self._fatal_seen = True
                events.append(ctl.FatalReported(str(fatal["worker"]), str(fatal["message"])))
        return events

    def _beat_events(self, now: float) -> list[ctl.Event]:
        """A ``Beat`` for every running worker whose heartbeat counter moved since the last look."""
        self._ticks += 1
        if self._ticks % BEAT_POLL_TICKS:
            return []
        running = [w.worker_id for w in self.sup.running()]
        counts = self.job.beats(running)
        moved = [ctl.Beat(w, now) for w, n in counts.items() if n and n != self._beat_counts.get(w)]
        self._beat_counts = counts
        return moved

    def _control_events(self) -> list[ctl.Event]:
        """Resizes asked through the control socket (`taiji resize`)."""
        if self.control is None:
            return []
        return [ctl.Proposal(size, source) for size, source in self.control.take_proposals()]

    def _refresh_snapshot(self, now: float) -> None:
        """What `taiji status` shows, rebuilt every tick on this thread (the control thread only
        hands it out); rank 0's progress is read from the store a few times a second."""
        if now - self._snapshot_at >= SNAPSHOT_SECONDS:
            self._snapshot_at = now
            try:
                self._progress = self.job.read_status()
            except StoreError:
                self._progress = None
        state = self.state
        self._snapshot = {"job": self.cfg.job_id, "pid": os.getpid(), "version": state.config.version,
                          "workers": list(state.config.ids), "joiners": [j.id for j in state.joiners],
                          "desired": state.desired, "min_np": state.bounds.min_np, "max_np": state.bounds.max_np,
                          "failures": state.failures, "progress": self._progress}

    def _done_event(self) -> list[ctl.Event]:
        """Fed before this tick's exits: members exiting 0 at the end are finishing, not leaving."""
        if not self._done_seen and self.job.is_done():
            self._done_seen = True
            return [ctl.JobDone()]
        return []

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        self.say(f"job {cfg.job_id}: {cfg.nproc} worker(s) (min {cfg.bounds.min_np}, max "
                 f"{cfg.bounds.max_np}), store {cfg.host}:{self.store.port}, command: {' '.join(cfg.command)}")
        self.say(f"resize with `taiji resize --job {cfg.job_id} N`, watch with `taiji status --job {cfg.job_id}`")
        self._publish(self.state.config, "start")
        registry.register(registry.JobEntry.of_this_process(cfg.job_id, cfg.host, self.store.port,
                                                            cfg.command, time.time()))
        self._refresh_snapshot(time.monotonic())
        self.control = ControlServer(registry.control_socket(cfg.job_id), lambda: self._snapshot)
        started = time.monotonic()
        self.sup.install_signal_handlers()
        try:
            self._spawn(self.state.config.ids)
            while True:
                exited, received = self.sup.wait(timeout=TICK_SECONDS)
                if received:
                    name = signal.Signals(received[0]).name
                    self.say(f"received {name}; stopping {len(self.sup.running())} worker(s)")
                    self.sup.stop_all(cfg.grace)
                    return 128 + received[0]
                events = self._done_event()
                for worker in exited:
                    assert worker.exit_code is not None
                    if worker.exit_code != 0 and worker.worker_id not in self.state.killed:
                        self.say(f"worker {worker.worker_id} (rank {worker.rank}) {describe_exit(worker.exit_code)}")
                    training = self.job.is_training(worker.worker_id)
                    events.append(ctl.WorkerExited(worker.worker_id, worker.exit_code, training))
                events += self._store_events() + self._control_events()
                now = time.monotonic()
                events += self._beat_events(now)
                events.append(ctl.Tick())
                for event in events:
                    code = self._feed(event)
                    if code is not None:
                        self.sup.stop_all(cfg.grace)
                        if code == 0:
                            self.say(f"job {cfg.job_id} finished: every worker exited 0 in "
                                     f"{time.monotonic() - started:.1f}s")
                        return code
                self._refresh_snapshot(now)
        except BaseException:
            self.sup.stop_all(cfg.grace)
            raise
        finally:
            self.sup.close()
            if self.control is not None:
                self.control.close()
            registry.unregister(cfg.job_id)
