"""One worker's share of a checkpoint: staged in host memory, written in the background through
DCP; at most one write in flight. A failed write is logged and leaves the checkpoint incomplete,
hence invisible: the previous complete one stays the latest.

Staging is the step loop's only stall, and most of it can leave the loop too: tensors that stay
unchanged until a known point (parameters and optimizer state change only at the next optimizer
update) are handed over as ``later`` and staged by the writer thread while the next step's forward
and backward run; ``settle()`` (called before that update) waits for them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from .layout import DIGEST, INDEX, MANIFEST, Manifest, checkpoint_name, part_name
from .storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveRecord:
    """What one save cost this worker."""

    step: int
    stall_seconds: float  # blocking in the step loop: staging, waiting for the previous write, and
    #                            waiting for overlapped staging before the next update (``settle``)
    staged_bytes: int  # host memory the staging copy holds until written
    overlapped_bytes: int = 0  # of which staged by the writer thread, overlapping the next step


def stage(
    tensors: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A host-memory copy of ``tensors`` that training may overwrite freely afterwards, into
    ``buffers`` (the previous save's copy, written already) where shapes and dtypes match: memory
    touched before costs no page faults."""
    staged = {}
    with torch.no_grad():
        for k, t in tensors.items():
            buffer = (buffers or {}).get(k)
            if buffer is not None and buffer.shape == t.shape and buffer.dtype == t.dtype:
                staged[k] = buffer.copy_(t.detach())
            else:
                staged[k] = host_copy(t.detach())
    return staged


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in host memory; of a GPU's tensor, in pinned memory (the GPU copies into it
    directly, at the link's speed, instead of through a driver's bounce buffer; and the buffer is
    reused by the next save)."""
    if t.is_cuda:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to("cpu", copy=True)


def until_update(
    tensors: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split ``tensors`` into (the rest, those only ``optimizer``'s update changes: the parameters
    it updates and its state). The second may be staged as ``later``, before that update; buffers
    are in the first (a forward changes them)."""
    changing = [p for group in optimizer.param_groups for p in group["params"]]
    changing += [
        v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    ]
    addresses = {t.data_ptr() for t in changing if t.numel() > 0}
    later = {k: t for k, t in tensors.items() if t.numel() > 0 and t.data_ptr() in addresses}
    return {k: t for k, t in tensors.items() if k not in later}, later


def part_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """A CRC-32 over each tensor's key, dtype, shape and bytes, in key order (it catches a damaged
    file, not a forged one; read in place: no copy of the state)."""
    crc = 0
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        crc = zlib.crc32(repr((key, str(t.dtype), tuple(t.shape))).encode(), crc)
        crc = zlib.crc32(memoryview(t.reshape(-1).view(torch.uint8).numpy()), crc)
    return f"crc32:{crc:08x}"


def write_part(
    storage: Storage, step: int, part: int, staged: Mapping[str, torch.Tensor], manifest: Manifest | None
) -> None:
    """Write one part (and the manifest, for the part that carries it); DCP's metadata last."""
    import torch.distributed.checkpoint as dcp

    name = checkpoint_name(step)
    if manifest is not None:
        storage.write_json(f"{name}/{MANIFEST}", manifest.to_json())
    rel = f"{name}/{part_name(part)}"
    storage.write_json(f"{rel}/{DIGEST}", {"digest": part_digest(staged), "keys": sorted(staged)})
    with torch_crc32_off():
        metadata = dcp.save(dict(staged), storage_writer=storage.dcp_writer(rel), no_dist=True)
    if metadata.storage_data is None:  # torch 2.11's writer records it on a copy: read what it wrote
        metadata = storage.dcp_reader(rel).read_metadata()
    storage.write_json(f"{rel}/{INDEX}", index_of(metadata))


@contextlib.contextmanager
def torch_crc32_off() -> Iterator[None]:
    """``torch.save`` (DCP writes each tensor with it) computes a CRC-32 of every record, which
    ``torch.load`` never checks; the part's digest is what catches a damaged file (checked on
    load), and the second CRC-32 over the same bytes cost as much CPU as the digest (a third of
    the write's): off while a part is written. The setting is process-wide: a ``torch.save`` that
    runs meanwhile on another thread writes no CRC either (and loads the same)."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def index_of(metadata) -> dict[str, list]:  # noqa: ANN001 - DCP's Metadata
    """Where DCP wrote each whole tensor: key -> [file, offset, length] of its ``torch.save``
    record (a tensor in several chunks, or transformed, is left to DCP's reader)."""
    seen: dict[str, int] = {}
    for index in metadata.storage_data:
        seen[index.fqn] = seen.get(index.fqn, 0) + 1
    return {
        index.fqn: [info.relative_path, info.offset, info.length]
        for index, info in metadata.storage_data.items()
        if seen[index.fqn] == 1 and not info.transform_descriptors
    }


@dataclass(frozen=True)
class _Job:
    step: int
    part: int
    staged: dict[str, torch.Tensor]
    later: dict[str, torch.Tensor]  # staged by the writer thread before it writes
    buffers: dict[str, torch.Tensor]  # the previous save's copy, reused
    manifest: Manifest | None


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class Writer:
    """Background writes of this worker's parts (see module doc), on one thread that lives as
    long as the Writer: a save hands it the staged copy and returns without waiting for it."""

    def __init__(self, storage: Storage, after_write: Callable[[int], None] = lambda step: None):
        self.storage = storage
        self._after_write = after_write
        self._changed = threading.Condition()
        self._pending: _Job | None = None
        self._staging = False  # tensors handed over as ``later`` are not staged yet
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.last_written: int | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # the last staged copy, reused once written

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def save(
        self,
        step: int,
        part: int,
        tensors: Mapping[str, torch.Tensor],
        manifest: Manifest | None,
        later: Mapping[str, torch.Tensor] | None = None,
    ) -> SaveRecord:
        """Stage ``tensors`` and write them in the background; returns once staged. ``later``:
        tensors the caller leaves unchanged until ``settle()`` returns (staged by the writer
        thread first). The record's stall excludes ``settle``'s wait: the caller adds it."""
        start = time.perf_counter()
        if self.busy:
            log.warning(
                "the checkpoint before step %d is still being written: waiting for it (checkpoint "
                "less often to avoid this stall)",
                step,
            )
        self.wait()
        buffers, self._buffers = self._buffers, {}
        staged = stage(tensors, buffers)
        later = dict(later or {})
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="taiji-checkpoint-writer", daemon=True)
            self._thread.start()
        with self._changed:
            self._pending = _Job(step, part, staged, later, buffers, manifest)
            self._staging = bool(later)
            self._changed.notify_all()
        stall = time.perf_counter() - start
        return SaveRecord(step, stall, nbytes(staged) + nbytes(later), nbytes(later))

    def settle(self) -> float:
        """Wait until the tensors of the last save's ``later`` are staged (training may change
        them afterwards); returns the seconds waited."""
        if not self._staging:
            return 0.0
        start = time.perf_counter()
        with self._changed:
            self._changed.wait_for(lambda: not self._staging)
        return time.perf_counter() - start

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight; False if it is still running after ``timeout``."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is None, timeout)

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None)
                job = self._pending
            assert job is not None
            try:
                self._write(job)
            finally:
                with self._changed:
                    self._pending, self._staging = None, False
                    self._changed.notify_all()

    def _write(self, job: _Job) -> None:
        staged = job.staged
        try:
            staged.update(stage(job.later, job.buffers))
        finally:
            with self._changed:
                self._staging = False
                self._changed.notify_all()
        self._buffers = staged  # read by the next save only after the write is done
        step, part = job.step, job.part
        try:
            write_part(self.storage, step, part, staged, job.manifest)
        except Exception as exc:  # noqa: BLE001 - a failed write must never stop training
            self.failures += 1
            log.warning(
                "checkpoint at step %d could not be written to %s (%s: %s); training goes on and "
                "the previous complete checkpoint stays the one to resume from",
                step,
                self.storage.url,
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, OSError),
            )  # not the storage's: where it came from
            self.storage.remove(f"{checkpoint_name(step)}/{part_name(part)}")  # free what it took
            return
        self.last_written = step
        try:
            self._after_write(step)
        except Exception as exc:  # noqa: BLE001
            log.warning("after writing the checkpoint at step %d: %s", step, exc)
