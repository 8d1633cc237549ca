"""Asynchronous pair averaging (AD-PSGD style) over the peer-to-peer model store.

Every worker trains at its own pace on the batches it claims (the Job runs this strategy
*decoupled*: no collective per step). After each local step it averages its parameters with
the latest model of a random peer, fetched in the background while it computed, then
publishes its own model for others to fetch. A slow peer never blocks a fast one: a fetch that
has not arrived yet is simply used at a later step, and a peer that left or died is skipped.

A stale model does not get an equal vote. Every published model carries its clock: the global
position (in samples, shared by all workers through the claim counter) of the last batch it was
trained on. A peer's model that is more than one global batch behind this worker's own gets the
weight ``0.5 · s / (s + excess)`` instead of 0.5, where ``excess`` is how far beyond that one batch
it lags and ``s = age_scale`` global batches (``age_scale=None``: always 0.5, plain AD-PSGD).
``fetch_every=k`` averages (and fetches) only every k-th local step, for slow networks.
"""

from __future__ import annotations

import logging
import random

import torch

from ..cluster import auth
from ..cluster.spec import ClusterView
from ..comm.communicator import Communicator
from ..comm.p2p import BackgroundFetcher, ModelStore, Snapshot
from ..errors import CommError, ConfigError, StoreError, TaijiError
from .base import CommSource, Directory, Strategy

log = logging.getLogger(__name__)


def p2p_key(worker_id: str) -> str:
    return f"p2p/{worker_id}"


class PairAveraging(Strategy):
    """Asynchronous pair averaging: after each local step, average with a random peer's latest model
    (a stale one weighted down by ``age_scale``); no collective per step."""

    name = "pair_averaging"
    exact = False
    lockstep = False

    def __init__(
        self, fetch_timeout: float = 10.0, seed: int = 0, age_scale: float | None = 1.0, fetch_every: int = 1
    ):
        if fetch_timeout <= 0:
            raise ConfigError(f"PairAveraging: fetch_timeout must be > 0, got {fetch_timeout}")
        if fetch_every < 1:
            raise ConfigError(f"PairAveraging: fetch_every must be >= 1 local steps, got {fetch_every}")
        self.fetch_every = fetch_every
        self._steps = 0
        if age_scale is not None and age_scale <= 0:
            raise ConfigError(
                f"PairAveraging: age_scale must be > 0 global batches (or None), got {age_scale}"
            )
        self.fetch_timeout = fetch_timeout
        self.age_scale = age_scale
        self._seed = seed
        self._params: list[torch.nn.Parameter] = []
        self._store: ModelStore | None = None
        self._fetcher: BackgroundFetcher | None = None
        self._peers: dict[str, tuple[str, int]] = {}
        self._random = random.Random(seed)
        self._clock = 0  # global position of the last batch this model trained on
        self._batch_size = 1
        self._pending_members: list[str] = []
        self._directory: Directory | None = None
        self._target: str | None = None
        self.averaged = 0  # local steps that averaged with a peer's model
        self.skipped = 0  # fetches that failed (peer gone) and were skipped
        self.weights = 0.0  # sum of the weights the peers' models got (weights / averaged: the mean)

    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> PairAveraging:
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ConfigError("PairAveraging: the model has no parameters that require gradients")
        return self

    def cluster_changed(self, view: ClusterView, directory: Directory | None = None) -> None:
        """Serve this worker's model (once), say where, and learn where the other members serve."""
        secret = auth.p2p_key()
        self._random = random.Random(f"{self._seed}/{view.worker_id}/{view.version}")
        if self._store is None:
            self._store = ModelStore(secret, host=view.host)
            self._fetcher = BackgroundFetcher(secret, self.fetch_timeout)
            # nothing is published before this worker's first step: a model with clock 0 (a joiner's,
            # synced from a peer) would look stale to everyone, and it is a peer's model anyway
        self._peers = {}
        self._directory = directory
        if directory is None:
            return
        try:
            host, port = self._store.address
            directory.set(p2p_key(view.worker_id), f"{host}:{port}")
        except StoreError as exc:
            log.warning("pair averaging: could not publish this worker's model store address (%s)", exc)
        self._pending_members = [m for m in view.members if m != view.worker_id]
        self._discover()

    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        if not self._params:
            raise TaijiError("PairAveraging.begin_step() before attach(model)")

    def claimed(self, position: int, batch_size: int) -> None:
        self._clock, self._batch_size = max(self._clock, position), max(1, batch_size)

    def weight_of(self, their_clock: int) -> float:
        """The weight a peer's model published at ``their_clock`` gets against this worker's own."""
        excess = self._clock - their_clock - self._batch_size
        if self.age_scale is None or excess <= 0:
            return 0.5
        scale = self.age_scale * self._batch_size
        return 0.5 * scale / (scale + excess)

    def synchronize(self) -> None:
        return None

    def abort_step(self) -> None:
        return None

    def after_update(self) -> None:
        """Average with the peer model that arrived (if any), publish ours, fetch the next (every
        ``fetch_every`` local steps; the model is published after each)."""
        if self._fetcher is None:
            return
        self._steps += 1
        if self._steps % self.fetch_every:
            self._publish()
            return
        result = self._fetcher.poll()
        if isinstance(result, Snapshot) and len(result.tensors) == len(self._params):
            weight = self.weight_of(result.version)
            with torch.no_grad():
                for p, theirs in zip(self._params, result.tensors):
                    p.lerp_(theirs.to(device=p.device, dtype=p.dtype), weight)
            self.averaged += 1
            self.weights += weight
        elif isinstance(result, CommError):
            self.skipped += 1
            self._peers.pop(self._target or "", None)  # gone: not asked again until the cluster changes
            log.debug("pair averaging: skipped peer %s: %s", self._target, result)
        self._publish()
        self._fetch_next()

    def _publish(self) -> None:
        assert self._store is not None
        self._store.publish(self._clock, [p.detach() for p in self._params])  # the version is the clock

    def _fetch_next(self) -> None:
        assert self._fetcher is not None
        if self._fetcher.in_flight:
            return
        if self._pending_members:  # members that registered after the cluster changed
            self._discover()
        if self._peers:
            self._target = self._random.choice(sorted(self._peers))
            self._fetcher.start(self._peers[self._target])

    def _discover(self) -> None:
        """Members that had not registered their address when the cluster changed."""
        store = self._directory
        for worker_id in list(self._pending_members):
            try:
                if store is not None and store.has(p2p_key(worker_id)):
                    h, p = store.get(p2p_key(worker_id)).decode().rsplit(":", 1)
                    self._peers[worker_id] = (h, int(p))
                    self._pending_members.remove(worker_id)
            except StoreError:
                return

    def detach(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
        if self._store is not None:
            self._store.close()
        self._fetcher = self._store = None
        self._peers = {}
