"""What the membership controller (cluster/controller.py) knows: the job's bounds, its hosts and
their slots, the joiners on their way in, and the state ``decide`` folds events into; plus the
states a controller starts from (a new job, or a running one it takes over)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import spec

# -- state ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    min_np: int = 1
    max_np: int = 1 << 30
    replace: bool = False
    join_timeout: float = 60.0
    suspect_window: float = 5.0  # after a failure report, how long to wait for the others'
    max_failures: int = 3
    liveness_timeout: float = 5.0  # no heartbeat for this long: the process is stopped or frozen
    exit_timeout: float = 30.0  # after training ended: a worker exiting (heartbeat stopped at its
    # exit, the interpreter tearing down) is killed only after this long
    busy_timeout: float = 600.0  # a live worker may keep its waiting peers this long (evaluation)
    stale_after: float = 1.0  # a heartbeat older than this at a failure report: not busy
    host_timeout: float = 5.0  # an agent silent this long: its host is lost
    max_hosts: int = 1 << 30  # hosts in the job at once, the launcher's included (--nnodes MIN:MAX)
    grow_on_join: bool = True  # a joining host's slots are grown onto (False: only a resize uses them)
    max_rebuilds: int = 10  # versions in a row whose every worker failed at the same step: the job stops

    def __post_init__(self) -> None:
        if not 1 <= self.min_np <= self.max_np:
            raise ValueError(f"need 1 <= min_np <= max_np, got {self.min_np}, {self.max_np}")


@dataclass(frozen=True)
class Joiner:
    id: str
    spawned_at: float
    ready: bool = False
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class Host:
    address: str
    slots: int


@dataclass(frozen=True)
class ControllerState:
    config: spec.ClusterConfig
    bounds: Bounds
    desired: int
    hosts: tuple[Host, ...] = (Host("127.0.0.1", 1 << 30),)  # the launcher's host first
    placement: tuple[tuple[str, int], ...] = ()  # workers wanted per host (a scheduler's); () = any
    joiners: tuple[Joiner, ...] = ()
    next_index: int = 0
    exited: frozenset[str] = frozenset()  # config members whose process is gone
    killed: frozenset[str] = frozenset()  # processes we stopped on purpose
    removed_pending: tuple[str, ...] = ()  # failed members to drop with the next grow
    short_since: float | None = None  # since when removed_pending waits for replacements
    failures: int = 0
    first_failure: tuple[str, int] | None = None
    reports: frozenset[str] = frozenset()  # members that reported a failure in config.version
    report_started: float | None = None
    failed_step: int = -1  # the furthest step a failure of config.version was reported at
    rebuilds: tuple[int, int] = (-1, 0)  # (step, versions in a row rebuilt after every worker failed there)
    beats: Mapping[str, float] = field(default_factory=dict)  # worker -> when its heartbeat last moved
    noted_busy: frozenset[str] = frozenset()  # busy members already logged in this version
    host_beats: Mapping[str, float] = field(default_factory=dict)  # joined host -> its agent's last beat
    done: bool = False
    finished: bool = False

    @property
    def alive_members(self) -> tuple[str, ...]:
        return tuple(i for i in self.config.ids if i not in self.exited and i not in self.removed_pending)

    def host_of(self, worker_id: str) -> str | None:
        for worker in self.config.workers:
            if worker.id == worker_id:
                return worker.host
        return next((j.host for j in self.joiners if j.id == worker_id), None)

    def used_slots(self, address: str) -> int:
        alive = set(self.alive_members)
        return sum(1 for w in self.config.workers if w.host == address and w.id in alive) + sum(
            1 for j in self.joiners if j.host == address
        )

    def wanted_on(self, address: str) -> int | None:
        """Workers the placement wants on ``address`` (0 if it names other hosts only); None
        without a placement."""
        if not self.placement:
            return None
        return dict(self.placement).get(address, 0)

    @property
    def capacity(self) -> int:
        return sum(h.slots for h in self.hosts)


def initial_state(
    size: int,
    bounds: Bounds,
    host: str = "127.0.0.1",
    slots: int | None = None,
    others: tuple[Host, ...] = (),
    now: float = 0.0,
) -> ControllerState:
    """``size`` workers on the launcher's ``host``, which has ``slots`` (default: as many as
    ``max_np``, i.e. one host), then on ``others`` in order: hosts whose agents joined before the
    start (`--nnodes MIN:MAX` waits for MIN hosts), each counted as just heard from at ``now``."""
    hosts = (Host(host, bounds.max_np if slots is None else slots),) + tuple(others)
    placed: list[str] = []
    for h in hosts:
        placed += [h.address] * min(h.slots, size - len(placed))
    if len(placed) < size:
        raise ValueError(
            f"{size} workers do not fit the {sum(h.slots for h in hosts)} slots of {len(hosts)} host(s)"
        )
    workers = [spec.WorkerSpec(f"w{i}", address) for i, address in enumerate(placed)]
    return ControllerState(
        config=spec.initial(workers),
        bounds=bounds,
        desired=size,
        hosts=hosts,
        next_index=size,
        host_beats={h.address: now for h in others},
    )


def adopted_state(
    config: spec.ClusterConfig, bounds: Bounds, hosts: tuple[Host, ...], next_index: int, now: float
) -> ControllerState:
    """The state of a controller taking over a running job (its launcher's host died): the latest
    published ``config``, ``hosts`` with the new controller's own host first; every member and
    every other host counts as just heard from, so only real silence is judged from here on."""
    return ControllerState(
        config=config,
        bounds=bounds,
        desired=config.size,
        hosts=hosts,
        next_index=next_index,
        beats={w: now for w in config.ids},
        host_beats={h.address: now for h in hosts[1:]},
    )
