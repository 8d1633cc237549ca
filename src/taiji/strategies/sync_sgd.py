"""Synchronous SGD: gradients averaged across workers while backward still runs.

Parameters are grouped into buckets in reverse registration order (roughly the order
autograd produces their gradients). A post-accumulate-grad hook copies each gradient,
pre-scaled by this worker's share ``b_r / B`` of the global batch, into its bucket; the
bucket's ``sum`` allreduce starts as soon as it is full, overlapping the rest of backward.
Buckets are launched strictly in index order so every rank issues the same collectives in
the same sequence, whatever order its hooks fire in. After the wait, ``param.grad`` is a
view into the reduced bucket: no copy back.

The last bucket can carry the step's control message (``carry``): a float32 bucket gets a
tail of one zeroed slot per worker, each worker writes its float64 row there as float32 pieces
(``comm.transfer.float32_pieces``), and the bucket's sum is then every worker's row exactly.
One collective a step, not two.
"""
from __future__ import annotations

import contextlib
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .. import env
from ..comm.communicator import Communicator, Handle
from ..comm.transfer import FLOAT32_PIECES, float32_pieces, float64_from_pieces
from ..errors import ConfigError, TaijiError
from .base import CommSource, Strategy, resolve_comm_source

log = logging.getLogger(__name__)

FIRST_BUCKET_MB = 1.0  # small first bucket so communication starts early (as DDP does)

# two strategies hooked onto one model would each send every gradient
_attached_models: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor        # the gradients (the slices are views of it)
    slices: list[torch.Tensor]           # views of ``buffer``, one per param, param-shaped
    ready: list[bool] = field(default_factory=list)
    ready_count: int = 0
    handle: Handle | None = None
    wire: torch.Tensor | None = None  # ``buffer`` and a tail for control rows (the last bucket, when it carries)

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


def _views(buffer: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """One param-shaped view of ``buffer`` per parameter, in order."""
    views, offset = [], 0
    for p in params:
        views.append(buffer[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    return views


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
        self._carrying: tuple[int, Callable[[], list[float]]] | None = None  # (width, row_of) this step
        self._carried: list[list[float]] | None = None

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
                bucket = _Bucket(members, buffer, _views(buffer, members))
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
        self._carrying = self._carried = None
        for bucket in self._buckets:
            bucket.reset()
        self._active = True

    def carry(self, width: int, row_of: Callable[[], list[float]]) -> bool:
        """This step's last bucket carries every worker's control row (see module doc); False
        where it cannot (one worker, not a float32 CPU bucket), and the caller sends them itself."""
        last, comm = self._buckets[-1], self._comm
        if not self._active or comm is None or comm.size < 2 or last.buffer.dtype != torch.float32 \
                or last.buffer.device.type != "cpu":
            return False
        total = last.buffer.numel() + comm.size * FLOAT32_PIECES * width
        if last.wire is None or last.wire.numel() != total:  # first time, or the cluster's size changed
            wire = torch.zeros(total, dtype=last.buffer.dtype)
            last.wire, last.buffer = wire, wire[:last.buffer.numel()]
            last.slices = _views(last.buffer, last.params)  # synchronize() points the grads at them
        self._carrying = (width, row_of)
        return True

    def carried(self) -> list[list[float]]:
        """Every worker's control row, in rank order (after ``synchronize`` of a carrying step)."""
        if self._carried is None:
            raise TaijiError("SyncSGD.carried() before synchronize() of a step that carried control rows")
        return self._carried

    def _rows(self, bucket: _Bucket) -> torch.Tensor:
        assert bucket.wire is not None and self._carrying is not None and self._comm is not None
        return bucket.wire[bucket.buffer.numel():].view(self._comm.size, FLOAT32_PIECES, self._carrying[0])

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
        wire = bucket.buffer
        if self._carrying is not None and bucket is self._buckets[-1]:
            rows = self._rows(bucket)
            rows.zero_()
            rows[self._comm.rank] = float32_pieces(self._carrying[1]())
            wire = bucket.wire
        bucket.handle = self._comm.allreduce(wire, "sum", channel="grad", async_op=True)

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
            if self._carrying is not None:
                self._carried = float64_from_pieces(self._rows(self._buckets[-1])).tolist()
            self._global_sqnorm = total
        finally:
            self._active = False

    def abort_step(self) -> None:
        self._active = False
        self._next_launch = 0
        self._carrying = self._carried = None
        for bucket in self._buckets:
            bucket.reset()
