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

**One worker: no communication work.** With a single worker there is nothing to average: a step
begun on a one-worker communicator leaves the gradients where autograd put them (no hook copies,
no bucket, no collective) and only scales them by the share and measures their norms when asked.
Inside a Job (or ``taiji.Optimizer``) the hooks themselves are removed while the cluster has one
worker (``cluster_changed``) and put back at the boundary where a second worker is admitted, before
its first step.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import env
from ..cluster.spec import ClusterView
from ..comm.communicator import Communicator, Handle
from ..comm.transfer import FLOAT32_PIECES, float32_pieces, float64_from_pieces
from ..errors import ConfigError, TaijiError
from ..monitor.norms import BucketNorm, Part, sum_of_parts
from .base import CommSource, Directory, Strategy, resolve_comm_source

log = logging.getLogger(__name__)

FIRST_BUCKET_MB = 1.0  # small first bucket so communication starts early (as DDP does)

# two strategies hooked onto one model would each send every gradient
_attached_models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor  # the gradients (the slices are views of it)
    slices: list[torch.Tensor]  # views of ``buffer``, one per param, param-shaped
    ready: list[bool] = field(default_factory=list)
    ready_count: int = 0
    handle: Handle | None = None
    wire: torch.Tensor | None = (
        None  # ``buffer`` and a tail for control rows (the last bucket, when it carries)
    )
    rows: np.ndarray | None = None  # that tail, [workers, FLOAT32_PIECES, width], as a numpy view of ``wire``
    norm: BucketNorm | None = (
        None  # measures ``buffer`` (made when first needed, again if ``buffer`` changes)
    )
    norm_share: BucketNorm | None = None  # this worker's share of the averaged ``buffer`` (also per cluster)

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.ready_count = 0
        self.handle = None


def _views(buffer: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """One param-shaped view of ``buffer`` per parameter, in order."""
    views, offset = [], 0
    for p in params:
        views.append(buffer[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
    return views


def _fresh_memory(bucket: _Bucket) -> None:
    """A collective given up on (its cluster version was abandoned) stays in flight until gloo
    ends it and may still write into its buffer: the retry gets new memory."""
    bucket.buffer = torch.zeros_like(bucket.buffer)
    bucket.slices = _views(bucket.buffer, bucket.params)
    bucket.wire = bucket.rows = None  # carry() builds a new wire around the new buffer


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
            raise ConfigError(
                f"bucket sizes must be positive (bucket_mb={self.bucket_mb}, "
                f"first_bucket_mb={first_bucket_mb})"
            )
        self.first_bucket_mb = min(first_bucket_mb, self.bucket_mb)
        self._buckets: list[_Bucket] = []
        self._where: dict[torch.nn.Parameter, tuple[int, int]] = {}
        self._hooks: list = []
        self._comm_source: CommSource | None = None
        self._comm: Communicator | None = None
        self._weight = 1.0
        self._step = 0
        self._active = False
        self._next_launch = 0
        self._sync_enabled = True
        self._measure_norms = False  # this step takes the squared norms the monitors need
        self._local_parts: list[Part] = []  # this step's measured norms, summed when asked for
        self._global_parts: list[Part] | None = None  # this worker's share, once measured
        self._param_names: dict[torch.nn.Parameter, str] = {}
        self._model: torch.nn.Module | None = None
        self._carrying: tuple[int, Callable[[], list[float]]] | None = None  # (width, row_of) this step
        self._carried: list[list[float]] | None = None
        self._params: list[torch.nn.Parameter] = []
        self._solo = False  # this step's communicator has one worker: nothing to send

    # -- setup ------------------------------------------------------------------------

    def attach(self, model: torch.nn.Module, comm: CommSource | Communicator | None = None) -> SyncSGD:
        if self._model is not None:
            raise TaijiError("this SyncSGD is already attached to a model; create one per model")
        if model in _attached_models:
            raise TaijiError(
                "this model already has a taiji strategy attached (another Job or SyncSGD); "
                "call .detach() on the old one first"
            )
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
                raise ConfigError(
                    f"SyncSGD: parameter {self._param_names.get(p, '?')} has non-floating dtype {p.dtype}"
                )
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
        self._params = params
        self._hook()
        self._model = model
        _attached_models.add(model)
        log.debug("SyncSGD: %d parameters in %d buckets", len(params), len(self._buckets))
        return self

    def _hook(self) -> None:
        if not self._hooks:
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params]

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    @property
    def hooked(self) -> bool:
        """Whether the gradient hooks are in place (not while a Job's cluster has one worker)."""
        return bool(self._hooks)

    def cluster_changed(self, view: ClusterView, directory: Directory | None = None) -> None:
        if self._model is None:
            return
        if view.size > 1:
            self._hook()
        else:
            self._unhook()

    def detach(self) -> None:
        self._unhook()
        self._params = []
        if self._model is not None:
            _attached_models.discard(self._model)
            self._model = None

    @property
    def num_buckets(self) -> int:
        """How many gradient buckets the model's parameters were planned into."""
        return len(self._buckets)

    # -- one step ---------------------------------------------------------------------

    def begin_step(self, weight: float, step: int = 0, measure_norms: bool = False) -> None:
        if self._comm_source is None:
            raise TaijiError("SyncSGD.begin_step() before attach(model)")
        if self._active:
            self.abort_step()
        self._comm = self._comm_source()
        self._solo = self._comm.size == 1
        self._weight = float(weight)
        self._step = step
        self._measure_norms = measure_norms
        self.norm_seconds = 0.0
        self._next_launch = 0
        self._local_parts = []
        self._global_parts = None
        self._carrying = self._carried = None
        for bucket in self._buckets:
            bucket.reset()
        self._active = True

    def carry(self, width: int, row_of: Callable[[], list[float]]) -> bool:
        """This step's last bucket carries every worker's control row (see module doc); False
        where it cannot (one worker, not a float32 CPU bucket), and the caller sends them itself."""
        last, comm = self._buckets[-1], self._comm
        if (
            not self._active
            or comm is None
            or comm.size < 2
            or last.buffer.dtype != torch.float32
            or last.buffer.device.type != "cpu"
        ):
            return False
        shape = (comm.size, FLOAT32_PIECES, width)
        if last.rows is None or last.rows.shape != shape:  # first time, or the cluster's size changed
            wire = torch.zeros(
                last.buffer.numel() + comm.size * FLOAT32_PIECES * width, dtype=last.buffer.dtype
            )
            last.wire, last.buffer = wire, wire[: last.buffer.numel()]  # (_measure notices: a new norm)
            last.slices = _views(last.buffer, last.params)  # synchronize() points the grads at them
            # numpy, not tensor ops, on the rows: 13 numbers do not pay a torch op's dispatch
            last.rows = wire[last.buffer.numel() :].numpy().reshape(shape)
        self._carrying = (width, row_of)
        return True

    def carried(self) -> list[list[float]]:
        """Every worker's control row, in rank order (after ``synchronize`` of a carrying step)."""
        if self._carried is None:
            raise TaijiError("SyncSGD.carried() before synchronize() of a step that carried control rows")
        return self._carried

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
                "in one step. Wrap all but the last backward of an accumulation in `with sync.no_sync():`."
            )
        if self._solo:  # one worker: the gradient stays where autograd put it
            bucket.ready[j] = True
            return
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
            self._measure(bucket, self._local_parts, share=False)
        wire = bucket.buffer
        if self._carrying is not None and bucket is self._buckets[-1]:
            assert bucket.rows is not None and bucket.wire is not None
            bucket.rows.fill(0.0)
            float32_pieces(self._carrying[1](), out=bucket.rows[self._comm.rank])
            wire = bucket.wire
        bucket.handle = self._comm.allreduce(wire, "sum", channel="grad", async_op=True)

    def _measure(self, bucket: _Bucket, parts: list[Part], share: bool) -> None:
        """``share``: only this worker's share of the bucket (it holds the averaged gradient,
        which every worker holds alike: each measures 1/n of it, see ``monitor.norms``)."""
        started = time.perf_counter()  # on a CPU the norm is done when it returns
        assert self._comm is not None
        rank, size = (self._comm.rank, self._comm.size) if share else (0, 1)
        norm = bucket.norm_share if share else bucket.norm
        if norm is None or norm.flat is not bucket.buffer or (norm.rank, norm.size) != (rank, size):
            norm = BucketNorm(bucket.buffer, rank, size)
            if share:
                bucket.norm_share = norm
            else:
                bucket.norm = norm
        parts += norm.parts(self._step)
        self.norm_seconds += time.perf_counter() - started

    def _launch_ready(self) -> None:
        while self._next_launch < len(self._buckets) and self._buckets[self._next_launch].ready_count == len(
            self._buckets[self._next_launch].params
        ):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def launch_all(self) -> None:
        """Send every bucket not sent yet (unused parameters contribute zero); no waiting."""
        if not self._active:  # no gradient and no begin_step: contribute zeros so peers don't wait
            self.begin_step(0.0)
        if self._solo:
            if self._next_launch == 0:
                self._next_launch = len(self._buckets)
                self._scale_and_measure_alone()
            return
        for bucket in self._buckets[self._next_launch :]:
            for j, ready in enumerate(bucket.ready):
                if not ready:  # unused here (or an empty local batch): contribute zero
                    bucket.slices[j].zero_()
            self._launch(bucket)
        self._next_launch = len(self._buckets)

    def local_sqnorm(self) -> float | None:
        """|g_r|² of this worker's own gradient (unscaled), if measured this step."""
        if not self._local_parts or self._weight <= 0:
            return None
        return sum_of_parts(self._local_parts) / (self._weight * self._weight)

    def global_sqnorm_share(self) -> float | None:
        """This worker's share of |ḡ|² of the averaged gradient, if measured this step (after
        ``synchronize``): the shares of the step's workers, in rank order, sum to |ḡ|²."""
        return None if self._global_parts is None else sum_of_parts(self._global_parts)

    def synchronize(self) -> None:
        try:
            self.launch_all()
            if self._solo:
                return
            if self._measure_norms:
                self._global_parts = []
            for bucket in self._buckets:
                assert bucket.handle is not None
                bucket.handle.wait()
                if self._global_parts is not None:
                    self._measure(bucket, self._global_parts, share=True)
                for p, slot in zip(bucket.params, bucket.slices):
                    if p.grad is not slot:
                        p.grad = slot
            if self._carrying is not None:
                rows = self._buckets[-1].rows
                assert rows is not None
                self._carried = float64_from_pieces(rows).tolist()
        finally:
            self._active = False

    def _scale_and_measure_alone(self) -> None:
        """One worker's gradient is the average: scaled by its share, its norm measured if asked."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if self._weight != 1.0:  # (a Job's one worker holds the whole batch: 1.0)
            for g in grads:
                g.mul_(self._weight)
        if self._measure_norms:
            started = time.perf_counter()
            total = sum((g.detach().float().square().sum() for g in grads), torch.zeros(()))
            self._local_parts = self._global_parts = [(total, 1.0)]
            self.norm_seconds += time.perf_counter() - started

    def abort_step(self) -> None:
        self._active = False
        self._next_launch = 0
        self._carrying = self._carried = None
        self._global_parts = None
        for bucket in self._buckets:
            if bucket.handle is not None and not bucket.handle.is_completed():
                _fresh_memory(bucket)
            bucket.reset()
