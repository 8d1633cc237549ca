"""The launcher's driver: feeds events to the pure controller and carries out its actions.

Events come from worker exits (pidfds), signals, the control socket (`taiji resize`), a few store
keys polled every tick (resize proposals, joiners ready, failure reports, job done) and the other
hosts (launch/hosts/remote.py: their agents' registrations, events, beats and tethers); the store
is hosted in this process, so a poll is a local round trip. Workers placed on this host are
started here; those placed on another host are started by its agent on a signed order.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from ..cluster import auth, spec
from ..cluster import controller as ctl
from ..cluster.etcd import EtcdKV, job_credentials, parse_url
from ..cluster.follow import KeyFollower, PrefixFollower
from ..cluster.store import JobStore, host_store, open_store
from ..errors import LaunchError, StoreError
from . import registry
from .checkpoint_cli import resume_note, stop_workers
from .control_socket import ControlServer
from .etcd_server import EtcdServer
from .hosts import agent_channel
from .hosts.remote import RemoteHosts
from .options import DriverConfig
from .supervisor import Supervisor, describe_exit
from .worker_env import StartedAhead, WorkerSettings, local_start

log = logging.getLogger(__name__)

TICK_SECONDS = 0.02
ETCD_TICK_SECONDS = 0.05  # each store poll is an HTTP round trip there: look less often
SNAPSHOT_SECONDS = 0.25  # how often rank 0's progress is read for `taiji status`
BEAT_POLL_TICKS = 5  # heartbeats are read every 0.1 s: well within the 1 s that tells busy from stuck
# ... and at least this often (seconds) when ticks run slow (many store round trips on a loaded
# host): the controller judges a silence up to now, so it must have looked lately — a controller
# that had not looked for 2 s took every host of a growing job for lost
BEAT_LOOK_MAX_S = 0.25


class Deposed(LaunchError):
    """Another controller took the job over (this one was judged dead): stop, touching nothing else."""


class Driver:
    """The controller's loop. ``Driver.launch`` hosts (or opens) the store and starts a job
    (`taiji run`); launch/takeover.py builds one from a running job's store for an agent that
    takes over when the launcher's host dies (etcd mode)."""

    def __init__(
        self,
        cfg: DriverConfig,
        settings: WorkerSettings,
        sup: Supervisor,
        job: JobStore,
        secret: bytes,
        state: ctl.ControllerState,
        *,
        store_address: str,
        tick: float,
        etcd: EtcdServer | None = None,
        term: bytes = b"",
    ):
        self.cfg, self.settings, self.sup, self.job, self.secret, self.state = (
            cfg,
            settings,
            sup,
            job,
            secret,
            state,
        )
        self.store_address, self.tick, self.etcd = store_address, tick, etcd
        self.term = term  # the election record this controller runs under (b"": the launcher)
        self.survivable = etcd is None and cfg.store != "tcp"  # the store outlives this host
        self.remote = RemoteHosts(job, cfg.host, self.say)  # the other hosts' agents and workers
        self._bell, self._controller_beats, self._proposal_seq, self._ticks = -1, 0, 0, 0
        self._looked = 0.0  # when the beats were last read (monotonic)
        self._doorbell: KeyFollower | None = None
        self._worker_keys: PrefixFollower | None = None  # etcd: the workers' flags (ready), watched
        self.secret_file = registry.secret_file(cfg.job_id)
        self._beat_counts: dict[str, int] = {}
        self._done_seen = self._fatal_seen = False
        self._snapshot: dict = {}
        self._snapshot_at = float("-inf")
        self._progress: dict | None = None
        self.control: ControlServer | None = None
        self.on_actions = None  # called with each decide's actions, if set (an observer: --metrics-port)

    @staticmethod
    def launch(
        cfg: DriverConfig, settings: WorkerSettings, output=None, ahead: StartedAhead | None = None
    ) -> Driver:
        """`taiji run`'s driver: the store hosted here (TCPStore or an etcd server) or opened.
        ``ahead``: the TCPStore's socket, secret, supervisor and first state with which the first
        workers were started before torch was imported (their spawns adopt them)."""
        etcd: EtcdServer | None = None
        secret = ahead.secret if ahead is not None else cfg.secret or auth.new_secret()
        if cfg.store == "tcp":
            store = host_store(
                cfg.host,
                cfg.port,
                timeout=cfg.timeout,
                listener=ahead.listener if ahead is not None else None,
            )
            settings = replace(settings, store_host=cfg.host, store_port=store.port, store_url="")
            address, tick = f"{cfg.host}:{store.port}", TICK_SECONDS
        else:
            credentials = job_credentials(cfg.job_id, secret)
            if cfg.store == "etcd":  # our own server: only this job's user may touch it
                etcd = EtcdServer(cfg.host, cfg.port).start()
                admin = EtcdKV(etcd.url, cfg.timeout)
                try:
                    admin.enable_auth(cfg.job_id, auth.derive(secret, "etcd-root").hex(), credentials[1])
                except BaseException:
                    etcd.stop()
                    raise
                finally:
                    admin.close()
            url = etcd.url if etcd is not None else cfg.store
            store = open_store(url, cfg.timeout, credentials)
            host, port = parse_url(url)[0]
            settings = replace(settings, store_host=host, store_port=port, store_url=url)
            address, tick = url, ETCD_TICK_SECONDS
        sup = ahead.sup if ahead is not None else Supervisor(output=output, prefix=cfg.output_prefix)
        state = ahead.state if ahead is not None else cfg.first_state()
        return Driver(
            cfg,
            settings,
            sup,
            JobStore(store, cfg.job_id, auth.Signer(secret)),
            secret,
            state,
            store_address=address,
            tick=tick,
            etcd=etcd,
        )

    def say(self, text: str) -> None:
        self.sup.write(f"taiji: {text}\n")

    # -- actions ----------------------------------------------------------------------

    def _spawn(self, workers: tuple[spec.WorkerSpec, ...]) -> None:
        joiner_ids = [j.id for j in self.state.joiners]
        size = self.state.config.size + len(joiner_ids)
        elsewhere: dict[str, list[tuple[str, int]]] = {}  # per other host: one record of orders to its agent
        for worker in workers:  # a joiner's rank is provisional: where it will be appended
            rank = self.state.config.rank_of(worker.id)
            if rank is None:
                rank = self.state.config.size + joiner_ids.index(worker.id)
            if worker.host != self.cfg.host:
                elsewhere.setdefault(worker.host, []).append((worker.id, rank))
                continue
            local_rank = self.sup.free_local_rank()
            command, environ = local_start(
                self.settings,
                self.secret,
                worker.id,
                rank,
                size,
                host=self.cfg.host,
                slots=self.state.hosts[0].slots,
                local_rank=local_rank,
            )
            self.sup.spawn(worker.id, rank, command, environ, local_rank=local_rank)
        for host, placed in elsewhere.items():
            self.remote.spawn(host, placed, size)

    def _kill(self, worker_id: str) -> None:
        if not self.remote.kill(worker_id):
            self.sup.kill(worker_id)

    def _is_running(self, worker_id: str) -> bool:
        remote = self.remote.workers.get(worker_id)
        if remote is not None:
            return remote.exit_code is None
        worker = self.sup.workers.get(worker_id)
        return worker is not None and worker.running

    def _publish(self, config: spec.ClusterConfig, reason: str) -> None:
        if not self.job.publish(config):
            raise Deposed(
                f"job {self.cfg.job_id}: could not publish cluster v{config.version}: another controller "
                f"did (the election record says {agent_channel.owner(self.job)!r}; this controller's term is "
                f"{self.term!r}). This one stops its own workers and leaves the job to it."
            )
        for wid, worker in list(self.sup.workers.items()) + list(self.remote.workers.items()):
            rank = config.rank_of(wid)
            if rank is not None:
                worker.rank = rank
        self.say(f"cluster v{config.version}: {config.size} worker(s) {list(config.ids)} ({reason})")

    def _report_root_cause(self, worker_id: str) -> None:
        local, remote = self.sup.workers.get(worker_id), self.remote.workers.get(worker_id)
        if local is not None and local.exit_code is not None:
            where, code, tail = f"rank {local.rank}, pid {local.pid}", local.exit_code, list(local.tail)
        elif remote is not None and remote.exit_code is not None:
            where, code, tail = (
                f"rank {remote.rank} on host {remote.host}",
                remote.exit_code,
                list(remote.tail),
            )
        else:
            return
        lines = "\n".join(f"    {line}" for line in tail[-20:]) or "    (no output)"
        self.say(
            f"worker {worker_id} ({where}) failed first: {describe_exit(code)}. "
            f"Last lines of its output:\n{lines}"
        )

    def _apply(self, actions: list[ctl.Action]) -> int | None:
        for action in actions:
            if isinstance(action, ctl.Spawn):
                self._spawn(action.workers)
            elif isinstance(action, ctl.Kill):
                if self._is_running(action.id):
                    self.say(f"stopping worker {action.id}: {action.reason}")
                self._kill(action.id)
            elif isinstance(action, ctl.Publish):
                self._publish(action.config, action.reason)
            elif isinstance(action, ctl.RefuseHost):
                self.remote.refuse(action.address, action.reason)
            elif isinstance(action, ctl.Log):
                self.say(action.message)
            elif isinstance(action, ctl.Finish):
                if action.code != 0:
                    if action.failed_worker:
                        self._report_root_cause(action.failed_worker)
                    self.say(f"job {self.cfg.job_id} stopped: {action.reason}")
                return action.code
        return None

    def _feed(self, event: ctl.Event) -> int | None:
        before = {h.address for h in self.state.hosts}
        self.state, actions = ctl.decide(self.state, event, time.monotonic())
        if self.on_actions is not None and actions:
            self.on_actions(actions)
        code = self._apply(actions)
        # release the hosts this event dropped (or a join it ignored) — not an agent registered
        # this tick whose HostJoined comes later in the tick
        dropped = before | ({event.address} if isinstance(event, ctl.HostJoined) else set())
        self.remote.release(dropped - {h.address for h in self.state.hosts})
        return code

    # -- the start ---------------------------------------------------------------------------

    def skip_past_records(self) -> None:
        """Take over a running job: react only to proposals and registrations written from now on."""
        self._proposal_seq = self.job.add("proposal/seq", 0)
        self.remote.skip_past_registrations()

    def _gathering_tick(self) -> int | None:
        """One tick while hosts gather: beat (agents must not take over a job not started) and wait;
        a signal received meanwhile."""
        now = time.monotonic()
        if self._look_at_beats(now):
            self._beat_events(now)
        _, received = self.sup.wait(timeout=self.tick)
        return received[0] if received else None

    def _start(self) -> None:
        """Gather the hosts --nnodes waits for, publish the first config and start its workers."""
        cfg = self.cfg
        if cfg.min_hosts > 1:
            others = self.remote.gather(
                cfg.min_hosts - 1, self.state, cfg.job_id, self._gathering_tick, BEAT_POLL_TICKS
            )
            try:
                self.state = ctl.initial_state(
                    cfg.nproc, cfg.bounds, cfg.host, cfg.slots or None, others, time.monotonic()
                )
            except ValueError as exc:
                raise LaunchError(
                    f"job {cfg.job_id}: {exc}: -np {cfg.nproc} does not fit the hosts that joined "
                    "(an agent offered fewer slots than --nproc-per-node?)"
                ) from None
        self._publish(self.state.config, "start")
        self._spawn(self.state.config.workers)

    # -- events from the store ----------------------------------------------------------

    def _store_events(self) -> list[ctl.Event]:
        events: list[ctl.Event] = []
        self._proposal_seq, proposals = self.job.proposals_after(self._proposal_seq)
        events += [
            ctl.Proposal(
                int(p["size"]),
                str(p.get("source", "user")),
                tuple((str(h), int(n)) for h, n in p.get("placement", ())),
            )
            for p in proposals
        ]
        version = self.state.config.version
        reported = self.job.failure_reports(version, self.state.config.ids)
        events += [
            ctl.FailureReported(i, version, step)
            for i, step in reported.items()
            if i not in self.state.reports
        ]
        if not self._fatal_seen:
            fatal = self.job.fatal_report()
            if fatal is not None:
                self._fatal_seen = True
                events.append(ctl.FatalReported(str(fatal["worker"]), str(fatal["message"])))
        return events

    def _ready_events(self, rang: bool) -> list[ctl.Event]:
        """Joiners that said they are ready: on etcd looked up in the watched worker keys every tick
        (a local read; the doorbell's watch may run ahead of theirs), else read once the doorbell rang."""
        if self._worker_keys is not None:
            watched = self._worker_keys.values
            return [
                ctl.WorkerReady(j.id)
                for j in self.state.joiners
                if not j.ready and f"worker/{j.id}/ready" in watched
            ]  # JobStore.mark_ready's key
        return (
            [ctl.WorkerReady(j.id) for j in self.state.joiners if not j.ready and self.job.is_ready(j.id)]
            if rang
            else []
        )

    def _look_at_beats(self, now: float) -> bool:
        """Is it time to read the beats: every ``BEAT_POLL_TICKS`` ticks, and at least every
        ``BEAT_LOOK_MAX_S`` seconds however long the ticks took."""
        self._ticks += 1
        blind = now - self._looked
        if self._ticks % BEAT_POLL_TICKS and blind < BEAT_LOOK_MAX_S:
            return False
        if self._looked and blind > 4 * BEAT_LOOK_MAX_S:
            log.warning(
                "job %s: the controller read no heartbeats for %.2fs (this host is overloaded, or the job "
                "store answered slowly)",
                self.cfg.job_id,
                blind,
            )
        self._looked = now
        return True

    def _beat_events(self, now: float) -> list[ctl.Event]:
        """A ``Beat`` for every running worker whose heartbeat count moved since the last look: this
        host's read from their files, the others' from their agents' summaries (read just before)."""
        if self.survivable:  # agents watch this beat to take over; nobody can where the store dies with us
            self._controller_beats += 1
            agent_channel.beat_controller(self.job, self._controller_beats)
            if agent_channel.owner(self.job) != self.term:
                raise Deposed(
                    f"job {self.cfg.job_id}: another controller took over (the election record says "
                    f"{agent_channel.owner(self.job)!r}): this one was judged dead; it stops its own "
                    "workers and leaves the job to the new one"
                )
        counts = {**self.sup.beat_counts(), **self.remote.beat_counts()}
        moved = [ctl.Beat(w, now) for w, n in counts.items() if n and n != self._beat_counts.get(w)]
        self._beat_counts = counts
        return moved

    def _forward_resizes(self) -> None:
        """Resizes asked through the control socket (`taiji resize`) join the job store's proposals:
        the one inbox of resizes (workers' `taiji.resize`, policies and schedulers write there too)."""
        if self.control is not None:
            for size, source, placement in self.control.take_proposals():
                self.job.propose(size, source, placement)

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
        self._snapshot = {
            "job": self.cfg.job_id,
            "pid": os.getpid(),
            "version": state.config.version,
            "workers": list(state.config.ids),
            "joiners": [j.id for j in state.joiners],
            "desired": state.desired,
            "min_np": state.bounds.min_np,
            "max_np": state.bounds.max_np,
            "failures": state.failures,
            "progress": self._progress,
            "busy": sorted(state.noted_busy) if state.report_started is not None else [],
            "hosts": [[h.address, h.slots, state.used_slots(h.address)] for h in state.hosts],
        }

    def _done_event(self) -> list[ctl.Event]:
        """Fed before this tick's exits: members exiting 0 at the end are finishing, not leaving."""
        if not self._done_seen and self.job.is_done():
            self._done_seen = True
            return [ctl.JobDone()]
        return []

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Start the job: publish its settings and first config, start its workers, serve."""
        cfg = self.cfg
        self.say(
            f"job {cfg.job_id}: {cfg.nproc} worker(s) (min {cfg.bounds.min_np}, max "
            f"{cfg.bounds.max_np}), store {self.store_address}, command: "
            f"{' '.join(self.settings.command)}"
        )
        self.say(
            f"resize with `taiji resize --job {cfg.job_id} N`, watch with `taiji status --job {cfg.job_id}`"
        )
        resuming = resume_note(self.settings.checkpoint_dir, self.settings.resume)
        if resuming:
            self.say(resuming)
        agent_channel.publish_settings(self.job, self.settings)
        agent_channel.publish_bounds(self.job, cfg.bounds)
        return self._serve(self._start)

    def resume(self, lost_host: str, reason: str, missed: list[ctl.Event]) -> int:
        """Serve a running job whose controller (on ``lost_host``) is gone: drop that host first,
        then feed what happened here while nobody controlled the job (``missed``)."""
        self.say(
            f"took over job {self.cfg.job_id} at cluster v{self.state.config.version} as its controller "
            f"({reason})"
        )
        return self._serve(lambda: None, [ctl.HostLost(lost_host, reason), *missed])

    def _announce_controller(self) -> None:
        """Who controls the job (agents watch its beat to take over when it stops, etcd mode)."""
        tether = (
            self.remote.open_tether(self.secret, self.sup.wake) if self.cfg.slots else ""
        )  # many hosts only
        agent_channel.publish_controller(
            self.job, self.cfg.host, os.getpid(), self.cfg.slots, survivable=self.survivable, tether=tether
        )
        auth.write_secret_file(self.secret_file, self.secret)
        if self.cfg.slots and not self.cfg.hosts_from:  # Ray and Slurm start the other hosts' agents
            self.say(
                f"add a host: copy {self.secret_file} there (it is the job's only credential), then run "
                f"`taiji join {self.cfg.job_id}@{self.store_address} --secret-file FILE "
                f"--nproc-per-node K --host ITS_IP`"
            )

    def _serve(self, start, first_events: list | None = None) -> int:
        cfg = self.cfg
        self._announce_controller()
        registry.register(
            registry.JobEntry.of_this_process(
                cfg.job_id, cfg.host, self.settings.store_port, self.settings.command, time.time()
            )
        )
        self._refresh_snapshot(time.monotonic())
        self.control = ControlServer(registry.control_socket(cfg.job_id), lambda: self._snapshot)
        started = time.monotonic()
        self.sup.install_signal_handlers()
        pending = list(first_events or [])
        self._doorbell = self.job.follow_doorbell()
        if self.job.can_watch:
            self._worker_keys = PrefixFollower(self.job.another_connection(), "worker/")
        try:
            start()
            self.sup.drop_ahead()  # a worker started ahead that the first config did not adopt
            pending += self.remote.early
            while True:
                exited, received = self.sup.wait(timeout=self.tick)
                if received:  # SIGTERM with --checkpoint-dir: a final checkpoint first
                    code = stop_workers(
                        received[0],
                        self.sup,
                        self.settings.checkpoint_dir,
                        cfg.grace,
                        cfg.checkpoint.grace,
                        self.say,
                        len(self.remote.running()),
                    )
                    self.remote.stop(cfg.grace + 2.0)
                    return code
                self._forward_resizes()
                # did anyone write what we react to? one read, or none where a watch keeps the count
                bell = self._doorbell.value if self._doorbell is not None else self.job.doorbell()
                rang, self._bell = bell != self._bell, bell
                events = self._done_event() if rang else []
                for worker in exited:
                    assert worker.exit_code is not None
                    if worker.exit_code != 0 and worker.worker_id not in self.state.killed:
                        self.say(
                            f"worker {worker.worker_id} (rank {worker.rank}) "
                            f"{describe_exit(worker.exit_code)}"
                        )
                    training = self.job.is_training(worker.worker_id)
                    events.append(ctl.WorkerExited(worker.worker_id, worker.exit_code, training))
                events += self._ready_events(rang) + (self._store_events() if rang else [])
                now = time.monotonic()
                look = self._look_at_beats(now)
                events += self.remote.events(self.state, now, rang, look)
                events += self._beat_events(now) if look else []
                events = pending + events + [ctl.Tick()]
                pending = []
                for event in events:
                    code = self._feed(event)
                    if code is not None:
                        self.sup.stop_all(cfg.grace)
                        self.remote.stop(cfg.grace + 2.0)
                        if code == 0:
                            self.say(
                                f"job {cfg.job_id} finished: every worker exited 0 in "
                                f"{time.monotonic() - started:.1f}s"
                            )
                        return code
                self._refresh_snapshot(now)
        except Deposed as exc:
            self.say(str(exc))
            self.sup.stop_all(cfg.grace)
            return 1
        except BaseException:
            self.sup.stop_all(cfg.grace)
            self.remote.stop(cfg.grace + 2.0)
            raise
        finally:
            self.sup.close()
            for follower in (self._doorbell, self._worker_keys):
                if follower is not None:
                    follower.close()
            if self.control is not None:
                self.control.close()
            self.remote.close()
            registry.unregister(cfg.job_id)
            if self.etcd is not None:
                self.etcd.stop()
