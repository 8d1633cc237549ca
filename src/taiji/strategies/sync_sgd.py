"""Synchronous SGD: gradients averaged across workers while backward still runs.

Parameters are grouped into buckets in reverse registration order (roughly the order
autograd produces their gradients). A post-accumulate-grad hook copies each gradient,
pre-scaled by this worker's share ``b_r / B`` of the global batch, into its bucket; the
bucket's ``sum`` allreduce starts as soon as it is full, overlapping the rest of backward.
Buckets are launched strictly in index order so every rank issues the same collectives in
the same sequence, whatever order its hooks fire in. After the wait, ``param.grad`` is a
view into the reduced bucket: no copy back.
"""
from __future__ import annotations

import contextlib
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .. import env
from ..comm.communicator import Communicator, Handle
from ..errors import ConfigError, TaijiError
from .base import CommSource, Strategy, resolve_comm_source

log = logging.getLogger(__name__)

FIRST_BUCKET_MB = 1.0  # small first bucket so communication starts early (as DDP does)

# two strategies hooked onto one model would each send every gradient
_attached_models: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor
    slices: list[torch.Tensor]           # views of ``buffer``, one per param, param-shaped
    ready: list[bool] = field(default_factory=list)
    ready_count: int = 0
    handle: Handle | None = None

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.ready_count = 0
        self.handle = None


SAMPLE_ABOVE = 1 << 20           # buckets with more elements get a sampled norm
SAMPLE_CHUNK, SAMPLE_PERIOD = 256, 4096


def _exact_sqnorm(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=t.device)
    if t.dtype in (torch.float16, torch.bfloat16) or not t.is_contiguous():
        return torch.linalg.vector_norm(t, dtype=torch.float32).to(torch.float64) ** 2
    return torch.dot(t, t).to(torch.float64)


def sqnorm(flat: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of a flat bucket as a float64 scalar tensor (no host sync).

    Above ``SAMPLE_ABOVE`` elements it is estimated from evenly spread contiguous chunks
    (``SAMPLE_CHUNK`` of every ``SAMPLE_PERIOD`` elements, scaled up; the tail exactly): one
    full pass over a large bucket costs a few ms of memory bandwidth on a CPU, and the noise
    scale needs two per step. The same coordinates are read before and after the allreduce, so
    the two-batch differences compare like with like.
    """
    n = flat.numel()
    if n <= SAMPLE_ABOVE:
        return _exact_sqnorm(flat)
    rows = n // SAMPLE_PERIOD
    # gathering the strided chunks into one contiguous run first is ~4x faster than a strided
    # reduction on a CPU (the copy is 1/16 of the bucket; the dot is then one vectorised pass)
    chunks = flat[: rows * SAMPLE_PERIOD].view(rows, SAMPLE_PERIOD)[:, :SAMPLE_CHUNK].contiguous().view(-1)
    return _exact_sqnorm(chunks) * (SAMPLE_PERIOD / SAMPLE_CHUNK) + _exact_sqnorm(flat[rows * SAMPLE_PERIOD:])


def plan_buckets(sizes_bytes: list[int], cap_bytes: int, first_cap_bytes: int) -> list[list[int]]:
    """Group consecutive items into buckets, closing a bucket once it holds ``cap_bytes``
    (the first once it holds ``first_cap_bytes``).

    Closing *after* the item that reaches the cap (as DDP does) keeps large gradients in
    early buckets, so their allreduce overlaps the rest of backward; closing before it
    would push them into one big bucket that is only sent when backward ends.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, size in enumerate(sizes_bytes):
        current.append(i)
        used += size
        if used >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, used = [], 0
    if current:
        buckets.append(current)
    return buckets


class SyncSGD(Strategy):
    """Exact data-parallel SGD with bucketed, overlapped gradient allreduce."""

    name = "sync_sgd"

    def __init__(self, bucket_mb: float | None = None, first_bucket_mb: float = FIRST_BUCKET_MB):
        self.bucket_mb = env.BUCKET_MB.get() if bucket_mb is None else float(bucket_mb)
        if self.bucket_mb <= 0 or first_bucket_mb <= 0:
            raise ConfigError(f"bucket sizes must be positive (bucket_mb={self.bucket_mb}, "
                              f"first_bucket_mb={first_bucket_mb})")
        self.first_bucket_mb = min(first_bucket_mb, self.bucket_mb)
        self._buckets: list[_Bucket] = []
        self._where: dict[torch.nn.Parameter, tuple[int, int]] = {}
        self._hooks: list = []
        self._comm_source: CommSource | None = None
        self._comm: Communicator | None = None
        self._weight = 1.0
        self._active = False
        self._next_launch = 0
        self._sync_enabled = True
        self._measure_norms = False  # this step takes the squared norms the monitors need
        self._local_sqnorm: torch.Tensor | None = None
        self._global_sqnorm: torch.Tensor | None = None
        self._param_names: dict[torch.nn.Parameter, str] = {}
        self._model: torch.nn.Module | None = None

    # -- setup ------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> "SyncSGD":
        if self._hooks:
            raise TaijiError("this SyncSGD is already attached to a model; create one per model")
        if model in _attached_models:
            raise TaijiError("this model already has a taiji strategy attached (another Job or SyncSGD); "
                             "call .detach() on the old one first")
        self._comm_source = resolve_comm_source(comm)
        self._param_names = {p: n for n, p in model.named_parameters()}
        params = [p for p in reversed(list(model.parameters())) if p.requires_grad]
        if not params:
            raise ConfigError("SyncSGD: the model has no parameters that require gradients")
        cap = int(self.bucket_mb * 2**20)
        first_cap = int(self.first_bucket_mb * 2**20)
        # one bucket holds one (device, dtype); keep reverse order within each group
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for p in params:
            if not p.is_floating_point():
                raise ConfigError(f"SyncSGD: parameter {self._param_names.get(p, '?')} has "
                                  f"non-floating dtype {p.dtype}")
            groups.setdefault((p.device, p.dtype), []).append(p)
        for (device, dtype), group in groups.items():
            plan = plan_buckets([p.numel() * p.element_size() for p in group], cap, first_cap)
            for member_ids in plan:
                members = [group[i] for i in member_ids]
                total = sum(p.numel() for p in members)
                buffer = torch.zeros(total, dtype=dtype, device=device)
                slices, offset = [], 0
                for p in members:
                    slices.append(buffer[offset:offset + p.numel()].view(p.shape))
                    offset += p.numel()
                bucket = _Bucket(members, buffer, slices)
                bucket.reset()
                for j, p in enumerate(members):
                    self._where[p] = (len(self._buckets), j)
                self._buckets.append(bucket)
        for p in params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        self._model = model
        _attached_models.add(model)
        log.debug("SyncSGD: %d parameters in %d buckets", len(params), len(self._buckets))
        return self

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._model is not None:
            _attached_models.discard(self._model)
            self._model = None

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    # -- one step ---------------------------------------------------------------------

    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        if self._comm_source is None:
            raise TaijiError("SyncSGD.begin_step() before attach(model)")
        if self._active:
            self.abort_step()
        self._comm = self._comm_source()
        self._weight = float(weight)
        self._measure_norms = measure_norms
        self.norm_seconds = 0.0
        self._next_launch = 0
        self._local_sqnorm = None
        self._global_sqnorm = None
        for bucket in self._buckets:
            bucket.reset()
        self._active = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (for all but the last micro-batch)."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def _on_grad_ready(self, param: torch.nn.Parameter) -> None:
        if not self._sync_enabled:
            return
        if not self._active:  # used piecewise: a plain loss.backward() starts an equal-share step
            comm = self._comm_source() if self._comm_source else None
            self.begin_step(1.0 / (comm.size if comm else 1))
        b, j = self._where[param]
        bucket = self._buckets[b]
        if bucket.ready[j]:
            raise TaijiError(
                f"SyncSGD: parameter {self._param_names.get(param, '?')} received a second gradient "
                "in one step. Wrap all but the last backward of an accumulation in `with sync.no_sync():`.")
        if bucket.handle is not None:
            raise TaijiError("SyncSGD: a gradient arrived for a bucket already sent")
        slot = bucket.slices[j]
        assert param.grad is not None
        torch.mul(param.grad, self._weight, out=slot)
        bucket.ready[j] = True
        bucket.ready_count += 1
        if bucket.ready_count == len(bucket.params) and b == self._next_launch:
            self._launch_ready()

    def _launch(self, bucket: _Bucket) -> None:
        assert self._comm is not None
        if self._measure_norms:  # |w·g_r|² of this bucket, read just before it is reduced in place
            part = self._timed_sqnorm(bucket.buffer)
            self._local_sqnorm = part if self._local_sqnorm is None else self._local_sqnorm + part
        bucket.handle = self._comm.allreduce(bucket.buffer, "sum", channel="grad", async_op=True)

    def _timed_sqnorm(self, flat: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()  # on a CPU the norm is done when it returns
        part = sqnorm(flat)
        self.norm_seconds += time.perf_counter() - started
        return part

    def _launch_ready(self) -> None:
        while (self._next_launch < len(self._buckets)
               and self._buckets[self._next_launch].ready_count == len(self._buckets[self._next_launch].params)):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def launch_all(self) -> None:
        """Send every bucket not sent yet (unused parameters contribute zero); no waiting."""
        if not self._active:  # no gradient and no begin_step: contribute zeros so peers don't wait
            self.begin_step(0.0)
        for bucket in self._buckets[self._next_launch:]:
            for j, ready in enumerate(bucket.ready):
                if not ready:  # unused here (or an empty local batch): contribute zero
                    bucket.slices[j].zero_()
            self._launch(bucket)
        self._next_launch = len(self._buckets)

    def local_sqnorm(self) -> float | None:
        """|g_r|² of this worker's own gradient (unscaled), if measured this step."""
        if self._local_sqnorm is None or self._weight <= 0:
            return None
        return float(self._local_sqnorm) / (self._weight * self._weight)

    def global_sqnorm(self) -> float | None:
        """|ḡ|² of the averaged gradient, if measured this step (after ``synchronize``)."""
        return None if self._global_sqnorm is None else float(self._global_sqnorm)

    def synchronize(self) -> None:
        try:
            self.launch_all()
            total = None
            for bucket in self._buckets:
                assert bucket.handle is not None
                bucket.handle.wait()
                if self._measure_norms:
                    part = self._timed_sqnorm(bucket.buffer)
                    total = part if total is None else total + part
                for p, slot in zip(bucket.params, bucket.slices):
                    if p.grad is not slot:
                        p.grad = slot
            self._global_sqnorm = total
        finally:
            self._active = False

    def abort_step(self) -> None:
        self._active = False
        self._next_launch = 0
        for bucket in self._buckets:
            bucket.reset()
