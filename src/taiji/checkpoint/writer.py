"""One worker's share of a checkpoint: staged in host memory (the only stall), written in the
background through DCP; at most one write in flight. A failed write is logged and leaves the
checkpoint incomplete, hence invisible: the previous complete one stays the latest."""
from __future__ import annotations

import logging
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .layout import DIGEST, MANIFEST, Manifest, checkpoint_name, part_name
from .storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveRecord:
    """What one save cost this worker."""
    step: int
    stall_seconds: float       # staging (and waiting for the previous write), in the step loop
    staged_bytes: int          # host memory the staging copy holds until written


def stage(tensors: Mapping[str, torch.Tensor],
          buffers: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
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
                staged[k] = t.detach().to("cpu", copy=True)
    return staged


def part_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """A CRC-32 over each tensor's key, dtype, shape and bytes, in key order (it catches a damaged
    file, not a forged one; read in place: no copy of the state)."""
    crc = 0
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        crc = zlib.crc32(repr((key, str(t.dtype), tuple(t.shape))).encode(), crc)
        crc = zlib.crc32(memoryview(t.reshape(-1).view(torch.uint8).numpy()), crc)
    return f"crc32:{crc:08x}"


def write_part(storage: Storage, step: int, part: int, staged: Mapping[str, torch.Tensor],
               manifest: Manifest | None) -> None:
    """Write one part (and the manifest, for the part that carries it); DCP's metadata last."""
    import torch.distributed.checkpoint as dcp
    name = checkpoint_name(step)
    if manifest is not None:
        storage.write_json(f"{name}/{MANIFEST}", manifest.to_json())
    rel = f"{name}/{part_name(part)}"
    storage.write_json(f"{rel}/{DIGEST}", {"digest": part_digest(staged), "keys": sorted(staged)})
    dcp.save(dict(staged), storage_writer=storage.dcp_writer(rel), no_dist=True)


class Writer:
    """Background writes of this worker's parts (see module doc), on one thread that lives as
    long as the Writer: a save hands it the staged copy and returns without waiting for it."""

    def __init__(self, storage: Storage, after_write: Callable[[int], None] = lambda step: None):
        self.storage = storage
        self._after_write = after_write
        self._changed = threading.Condition()
        self._pending: tuple[int, int, dict[str, torch.Tensor], Manifest | None] | None = None
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.last_written: int | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # the last staged copy, reused once written

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def save(self, step: int, part: int, tensors: Mapping[str, torch.Tensor],
             manifest: Manifest | None) -> SaveRecord:
        """Stage ``tensors`` and write them in the background; returns once staged."""
        start = time.perf_counter()
        if self.busy:
            log.warning("the checkpoint before step %d is still being written: waiting for it (checkpoint "
                        "less often to avoid this stall)", step)
        self.wait()
        staged, self._buffers = stage(tensors, self._buffers), {}
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="taiji-checkpoint-writer", daemon=True)
            self._thread.start()
        with self._changed:
            self._pending = (step, part, staged, manifest)
            self._changed.notify_all()
        stall = time.perf_counter() - start
        return SaveRecord(step, stall, sum(t.numel() * t.element_size() for t in staged.values()))

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
                self._write(*job)
            finally:
                with self._changed:
                    self._pending = None
                    self._changed.notify_all()

    def _write(self, step: int, part: int, staged: dict[str, torch.Tensor], manifest: Manifest | None) -> None:
        self._buffers = staged  # read by the next save only after the write is done
        try:
            write_part(self.storage, step, part, staged, manifest)
        except Exception as exc:  # noqa: BLE001 - a failed write must never stop training
            self.failures += 1
            log.warning("checkpoint at step %d could not be written to %s (%s: %s); training goes on and "
                        "the previous complete checkpoint stays the one to resume from", step,
                        self.storage.url, type(exc).__name__, exc)
            self.storage.remove(f"{checkpoint_name(step)}/{part_name(part)}")  # free what it took
            return
        self.last_written = step
        try:
            self._after_write(step)
        except Exception as exc:  # noqa: BLE001
            log.warning("after writing the checkpoint at step %d: %s", step, exc)
