"""`taiji join`: the agent of one more host. It starts, signals and reaps only its own workers,
on the launcher's signed orders, and reports their exits with their last lines.

The agent verifies the job's signed settings before it writes anything, so an agent holding the
wrong secret leaves the job untouched. Its workers die with it (parent-death signal), and it
stops them and exits when the job store (the launcher's host) can no longer be reached: no
worker outlives its job on any host.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Protocol

from ...cluster.controller import Bounds
from ...cluster.store import JobStore, connect_job
from ...errors import AuthError, LaunchError, StoreError
from .. import registry
from ..options import JoinConfig
from ..supervisor import Supervisor, WorkerProcess, describe_exit
from ..worker_env import WorkerSettings, worker_env
from . import agent_channel
from .tether import Tether, answers

TICK_SECONDS = 0.02
BEAT_SECONDS = 0.25
TETHER_RETRY_S = 2.0


class Controller(Protocol):
    """The job's controller this agent became by winning the election."""

    def resume(self, reason: str) -> int:
        """Serve the job from where its dead controller left it, until the job ends; the exit code."""
        ...


class TakeOver(Protocol):
    """How an agent takes a job over when its controller is gone (the store outlives the launcher's
    host): if this agent wins the election against the controller of term ``seen``, the controller
    it becomes. The job's room makes that controller (a driver); `taiji join`'s entry point hands
    its takeover to the agent, so that this room never imports the job's."""

    def __call__(
        self,
        cfg: JoinConfig,
        job: JobStore,
        settings: WorkerSettings,
        sup: Supervisor,
        secret: bytes,
        seen: bytes,
    ) -> Controller | None: ...


class Agent:
    def __init__(self, cfg: JoinConfig, take_over: TakeOver, output=None):
        self.cfg = cfg
        self._takeover = take_over
        self.sup = Supervisor(output=output, prefix=f"{cfg.host} ")
        self.job: JobStore | None = None
        self.channel: agent_channel.AgentChannel | None = None
        self.settings: WorkerSettings | None = None
        self.host_rank = 0
        self._last_contact = time.monotonic()
        self._done = threading.Event()
        self._controller_beat = -1
        self._controller_heard = time.monotonic()
        self._owner_seen = b""
        self._survivable: bool | None = None  # read once the controller has announced itself
        self._bounds = Bounds()
        self._tether: Tether | None = None
        self._tether_term = b""  # the election record when that tether was made
        self._tether_judged = ""  # a controller's tether address judged dead (an election was held)
        self._tether_retry_at = 0.0
        self._tether_failed = ""  # the address a connect last failed at (said once)
        self._store_trouble = False  # a failed store call was said (once per outage)
        self._draining: float | None = None  # after a notice: when the grace runs out
        self._notice_said = False

    def say(self, text: str) -> None:
        self.sup.write(f"taiji join: {text}\n")

    def _connect(self) -> None:
        cfg = self.cfg
        try:
            _, job = connect_job(cfg.store_url, cfg.job_id, cfg.secret, cfg.timeout)
        except AuthError:
            raise AuthError(
                f"job {cfg.job_id} at {cfg.store_url} refused this host: its etcd does not accept the "
                "credentials derived from the --secret-file (not this job's secret; copy the file "
                "`taiji run` printed, unchanged). Nothing was changed in the job."
            ) from None
        if not job.has(agent_channel.SPEC):
            raise LaunchError(
                f"no job {cfg.job_id} at {cfg.store_url} (the store there does not know it); "
                "check the JOB@STORE that `taiji run` printed"
            )
        try:
            self.settings = agent_channel.read_settings(job)
        except AuthError:
            raise AuthError(
                f"job {cfg.job_id} at {cfg.store_url} refused this host: the secret in the "
                "--secret-file is not this job's (copy the file `taiji run` printed, unchanged). "
                "Nothing was changed in the job."
            ) from None
        self.job = job
        self.session = uuid.uuid4().hex[:12]
        if job.has(agent_channel.BOUNDS):
            self._bounds = agent_channel.read_bounds(job)
        self.channel = agent_channel.AgentChannel(job, cfg.host, self.session, self._bounds.host_timeout)

    def _spawn(self, command: dict) -> None:
        assert self.settings is not None
        wid, rank, size = str(command["id"]), int(command["rank"]), int(command["size"])
        local_rank = self.sup.free_local_rank()
        try:
            self.sup.spawn(
                wid,
                rank,
                self.settings.command_here(),
                worker_env(
                    self.settings,
                    self.cfg.secret,
                    wid,
                    rank,
                    size,
                    host=self.cfg.host,
                    local_rank=local_rank,
                    local_size=self.cfg.slots,
                    host_rank=self.host_rank,
                ),
                local_rank=local_rank,
            )
        except LaunchError as exc:
            self.say(str(exc))
            self._report_exit(wid, 127, [str(exc)])

    def _report_exit(self, worker_id: str, code: int, tail: list[str]) -> None:
        assert self.channel is not None
        self.channel.report({"op": "exit", "id": worker_id, "code": code, "tail": tail[-20:]})

    def _reported(self, worker: WorkerProcess) -> None:
        assert worker.exit_code is not None
        if worker.exit_code != 0:
            self.say(f"worker {worker.worker_id} (rank {worker.rank}) {describe_exit(worker.exit_code)}")
        self._report_exit(worker.worker_id, worker.exit_code, list(worker.tail))

    def _stop_workers(self) -> None:
        self.sup.stop_all(self.cfg.grace)

    def _watch_contact(self) -> None:
        """A call to an unreachable store can block far longer than its timeout (the request is
        sent, the answer never comes): if the loop has not heard from the store for --timeout
        seconds, the host is cut off: stop the workers from here and exit."""
        while not self._done.wait(0.2):
            silent = time.monotonic() - self._last_contact
            if silent > self.cfg.timeout:
                self.say(
                    f"lost the job store at {self.cfg.store_url}: no answer for {silent:.0f}s "
                    f"(the network between us is down, or the launcher's host is gone): stopping "
                    f"{len(self.sup.running())} worker(s)"
                )
                self._stop_workers()
                os._exit(1)

    def _store_silent_within_timeout(self, exc: StoreError) -> bool:
        """A store call failed: keep trying while the store has been silent for less than
        ``--timeout`` (etcd's own retries give up sooner), saying so once."""
        silent = time.monotonic() - self._last_contact
        if silent > self.cfg.timeout or isinstance(
            exc, (agent_channel.LeaseExpired, agent_channel.StoreGone)
        ):
            return False
        if not self._store_trouble:
            self._store_trouble = True
            self.say(
                f"the job store does not answer ({str(exc).splitlines()[0]}); trying again for up to "
                f"{self.cfg.timeout:g}s (--timeout)"
            )
        return True

    def _controller_gone(self, now: float) -> bool:
        """Has the job's controller been silent for the host timeout, where another may take over
        (the store outlives its host)? Never with the launcher's own store."""
        assert self.job is not None
        if self._survivable is None:
            if not self.job.has(agent_channel.CONTROLLER):
                return False
            self._survivable = bool(agent_channel.read_controller(self.job).get("survivable"))
            self._bounds = agent_channel.read_bounds(self.job)
        if not self._survivable:
            return False
        beat = agent_channel.controller_beat(self.job)
        if beat != self._controller_beat:
            self._controller_beat, self._controller_heard = beat, now
            owner = agent_channel.owner(self.job)  # the term of the controller that beats
            if self._tether is not None and owner != self._tether_term:
                self._tether.close()  # to a controller taken over without its tether closing (its host
                self._tether = None  # went silent): tether to the new one at the next beat
            self._owner_seen = owner
            return False
        silent = now - self._controller_heard
        if silent > self._bounds.host_timeout:
            return True
        # workers already report failed collectives (the controller's host took its workers with
        # it): a shorter silence tells, as for any other host (controller.py)
        return silent > self._bounds.stale_after and self.job.failures_reported(self.job.latest_version())

    def _hold_tether(self) -> None:
        """Tether to the job's controller once it has announced one (and again after a takeover)."""
        assert self.job is not None
        now = time.monotonic()
        if (
            self._tether is not None
            or now < self._tether_retry_at
            or not self.job.has(agent_channel.CONTROLLER)
        ):
            return
        term = agent_channel.owner(self.job)  # before the record: a takeover in between shows as a newer term
        address = str(agent_channel.read_controller(self.job).get("tether") or "")
        if address and address != self._tether_judged:
            try:
                self._tether = Tether(address, self.cfg.secret, self.cfg.host, self.session, timeout=0.5)
                self._tether_term, self._tether_failed = term, ""
            except (LaunchError, AuthError) as exc:
                if address != self._tether_failed:
                    self.say(
                        f"no tether to the controller yet ({exc}); retrying every {TETHER_RETRY_S:g}s "
                        "(meanwhile its heartbeat tells if it dies)"
                    )
                self._tether_failed, self._tether_retry_at = address, now + TETHER_RETRY_S

    def _tether_closed(self) -> int | None:
        """The controller's tether closed. If the controller named in the store is still that one and
        its port refuses a connection, its process is gone: take over now (where the store
        outlives it) instead of waiting for its beat to go stale."""
        assert self.job is not None and self._tether is not None
        address = self._tether.address
        self._tether.close()
        self._tether = None
        try:
            record = agent_channel.read_controller(self.job)
        except StoreError as exc:  # the store died with the launcher
            raise agent_channel.StoreGone(str(exc).splitlines()[0]) from None
        if record.get("tether") != address or answers(address):
            return None  # another controller by now, or this one still listens: tether again
        self._tether_judged = address  # judged dead once: after a lost election, only its beat counts
        if not record.get("survivable"):
            raise agent_channel.StoreGone(
                f"the job's controller on {record.get('host')} is gone (its tether closed)"
            )
        return self._take_over(f"the controller on {record.get('host')} exited (its tether closed)")

    def _take_over(self, reason: str) -> int | None:
        """Become the job's controller if this agent wins the election; its exit code if it did."""
        assert self.job is not None and self.settings is not None
        if self.job.is_done():  # training is over: the controller went as the job ended, nothing to take
            self.say(
                f"the job's training has ended and its controller is gone ({reason}): stopping "
                f"{len(self.sup.running())} worker(s)"
            )
            self._stop_workers()
            return 0
        controller = self._takeover(
            self.cfg, self.job, self.settings, self.sup, self.cfg.secret, self._owner_seen
        )
        if controller is None:
            # another agent won: give it time to beat, and judge the term it runs under next
            self._controller_heard = time.monotonic()
            self._owner_seen = agent_channel.owner(self.job)
            return None
        self._done.set()  # the driver's loop talks to the store from here on
        if self._tether is not None:
            self._tether.close()
            self._tether = None
        return controller.resume(reason)

    def _drain(self, name: str) -> bool:
        """A preemption notice (SIGTERM): ask for a shrink placed off this host, so its workers leave
        at the next step boundary (no failed step); False if there is nothing to drain or no grace."""
        if self.cfg.grace <= 0 or not self.sup.running() or self.job is None:
            return False
        config = self.job.read_config()
        per_host = Counter(w.host for w in config.workers)
        per_host[self.cfg.host] = 0
        self.job.propose(
            sum(per_host.values()), f"host {self.cfg.host} leaving ({name})", tuple(per_host.items())
        )
        self.say(
            f"received {name}: asked the job to shrink off this host; its {len(self.sup.running())} "
            f"worker(s) leave at the next step boundary (within --grace {self.cfg.grace:g}s)"
        )
        self._draining = time.monotonic() + self.cfg.grace
        return True

    def _job_notice(self, received: list[int]) -> list[int]:
        """A SIGTERM that reached the launcher too (its Slurm allocation's): the launcher stops
        the job, after a final checkpoint where it takes them; this host's workers stay until then
        (they ignore Slurm's SIGTERM: launch/supervisor.py). Other signals are returned."""
        if signal.SIGTERM in received and not self._notice_said:
            self._notice_said = True
            self.say(
                "received SIGTERM, as did the whole Slurm job: its launcher stops the job (with a final "
                "checkpoint under --checkpoint-dir); this host's workers go on until it does"
            )
        return [s for s in received if s != signal.SIGTERM]

    def _drained(self) -> int:
        """After a notice: 0 if the workers left as a planned shrink; else the host is dropped as lost."""
        assert self.channel is not None
        left = not self.sup.running()
        self.say(
            "its workers left the job: leaving"
            if left
            else f"--grace {self.cfg.grace:g}s ran out before the workers left: the host is dropped as lost"
        )
        self.channel.report({"op": "leave", "reason": "drained" if left else "its grace ran out"})
        self._stop_workers()
        return 0 if left else 128 + signal.SIGTERM

    def run(self) -> int:
        cfg = self.cfg
        self._connect()
        assert self.job is not None and self.channel is not None and self.settings is not None
        controller = agent_channel.read_controller(self.job) if self.job.has(agent_channel.CONTROLLER) else {}
        if cfg.host == controller.get("host", self.settings.store_host):
            raise LaunchError(
                f"host {cfg.host} runs the job's controller: its workers are started there "
                "(-np/--nproc-per-node); give this agent its own host's address with --host"
            )
        self.host_rank = agent_channel.register(self.job, cfg.host, cfg.slots, os.getpid(), self.session)
        registry.register_agent(
            registry.JobEntry.of_this_process(cfg.job_id, cfg.host, 0, tuple(sys.argv), time.time())
        )  # for `taiji drain`
        self._owner_seen = agent_channel.owner(self.job)  # the term of the controller there now
        self.say(
            f"joined job {cfg.job_id} at {cfg.store_url} as host {cfg.host} with {cfg.slots} "
            f"slot(s); command: {' '.join(self.settings.command_here())}"
        )
        self.sup.install_signal_handlers()
        next_beat = 0.0
        self._last_contact = time.monotonic()
        threading.Thread(target=self._watch_contact, name="taiji-agent-watch", daemon=True).start()
        try:
            while True:
                try:
                    exited, received = self.sup.wait(timeout=TICK_SECONDS)
                    if received and cfg.job_notice:
                        received = self._job_notice(received)
                    if received and self._draining is None and self._drain(signal.Signals(received[0]).name):
                        continue  # a preemption notice: its workers leave at the next step boundary
                    if received:
                        name = signal.Signals(received[0]).name
                        self.say(f"received {name}: leaving the job with {len(self.sup.running())} worker(s)")
                        self.channel.report({"op": "leave", "reason": f"{name} received"})
                        self._stop_workers()
                        return 128 + received[0]
                    for worker in exited:
                        self._reported(worker)
                    if self._draining is not None and (
                        not self.sup.running() or time.monotonic() > self._draining
                    ):
                        return self._drained()
                    for command in self.channel.new_commands():
                        op = command.get("op")
                        if op == "spawn":
                            self._spawn(command)
                        elif op == "kill":
                            self.sup.kill(str(command["id"]))
                        elif op == "refuse":
                            self.say(
                                f"refused by the job's controller: {command.get('reason')}; "
                                "nothing was started"
                            )
                            return 2
                        elif op == "stop":
                            self.say(f"stopping: {command.get('reason', 'asked by the launcher')}")
                            self._stop_workers()
                            self.channel.report({"op": "bye"})
                            return 0
                    if self._tether is not None and self._tether.broken.is_set():
                        code = self._tether_closed()
                        if code is not None:
                            return code
                    now = time.monotonic()
                    if now >= next_beat:
                        self.channel.beat(self.sup.beat_counts())
                        next_beat = now + BEAT_SECONDS
                        self._hold_tether()
                        if self._controller_gone(now):
                            code = self._take_over("the controller stopped beating")
                            if code is not None:
                                return code
                    self._last_contact, self._store_trouble = now, False
                except StoreError as exc:
                    if not self._store_silent_within_timeout(exc):
                        raise
        except agent_channel.LeaseExpired as exc:
            self.say(f"{exc}: stopping {len(self.sup.running())} worker(s)")
            self._stop_workers()
            return 1
        except StoreError as exc:
            self.say(
                f"lost the job store at {cfg.store_url} (the launcher's host died, or the network "
                f"between us is down): stopping {len(self.sup.running())} worker(s). ({exc})"
            )
            self._stop_workers()
            return 1
        except BaseException:
            self._stop_workers()
            raise
        finally:
            self._done.set()
            registry.unregister_agent(cfg.job_id, cfg.host)
            if self._tether is not None:
                self._tether.close()
            self.sup.close()
            try:
                self.channel.leave()
            except StoreError:
                pass  # the lease runs out by itself
