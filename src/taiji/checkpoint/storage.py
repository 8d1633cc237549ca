"""A checkpoint root's file operations, through fsspec (local paths and URLs alike), and the DCP
storage writers and readers for its parts (DCP's own file-system writer for local paths, its
fsspec writer for URLs)."""

from __future__ import annotations

import json
import logging
import os
import uuid
import warnings
from typing import Any

from ..errors import ConfigError
from .layout import MANIFEST, PART_DONE, Listing, checkpoint_name, part_name, step_of

log = logging.getLogger(__name__)
# each part is a one-process DCP checkpoint by design (the workers never use DCP's collectives)
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
)


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


class Storage:
    """One checkpoint root (a directory or an fsspec URL)."""

    def __init__(self, root: str):
        import fsspec  # a dependency of torch

        if not root:
            raise ConfigError("a checkpoint root needs a path")
        self.url = root.rstrip("/") or root
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.remote = is_url(self.url)

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def url_of(self, *parts: str) -> str:
        return "/".join([self.url.rstrip("/"), *parts])

    # -- small files ------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Refuse a root that cannot be written now, rather than at the first save."""
        probe = self.path(f".taiji-probe-{uuid.uuid4().hex[:8]}")
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm_file(probe)
        except (OSError, PermissionError, ValueError) as exc:
            raise ConfigError(
                f"cannot write checkpoints to {self.url}: {exc}; give a writable directory "
                "(or URL) to taiji.Checkpoint / --checkpoint-dir"
            ) from None

    def write_json(self, rel: str, data: Any) -> None:
        """Write ``rel`` atomically: a temporary file, flushed (fsync'd on local disk), renamed."""
        target = self.path(rel)
        tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        payload = json.dumps(data).encode()
        if self.remote:
            self.fs.pipe_file(tmp, payload)
            self.fs.mv(tmp, target)
            return
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    def read_json(self, rel: str) -> Any:
        with self.fs.open(self.path(rel), "rb") as f:
            return json.loads(f.read())

    def read_ranges(self, rel: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes at (offset, length) in file ``rel``, each exactly (a short file raises)."""
        out = []
        with self.fs.open(self.path(rel), "rb") as f:
            for offset, length in ranges:
                f.seek(offset)
                data = f.read(length)
                if len(data) != length:
                    raise ValueError(
                        f"{rel} ends at byte {offset + len(data)}, before {offset + length}: truncated"
                    )
                out.append(data)
        return out

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    # -- checkpoints -------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Steps of the checkpoint directories under the root (complete or not)."""
        try:
            names = [n.rstrip("/").rsplit("/", 1)[-1] for n in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        return sorted(s for s in (step_of(n) for n in names) if s is not None)

    def is_complete(self, step: int) -> bool:
        name = checkpoint_name(step)
        try:
            parts = int(self.read_json(f"{name}/{MANIFEST}")["parts"])
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return False
        return all(self.exists(f"{name}/{part_name(i)}/{PART_DONE}") for i in range(parts))

    def listing(self) -> Listing:
        return Listing.of((s, self.is_complete(s)) for s in self.steps())

    def remove(self, rel: str) -> None:
        try:
            self.fs.rm(self.path(rel), recursive=True)
        except FileNotFoundError:
            pass

    # -- DCP ---------------------------------------------------------------------------------

    def dcp_writer(self, rel: str):  # noqa: ANN201 - a DCP StorageWriter
        from torch.distributed.checkpoint import FileSystemWriter

        if self.remote:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # DCP's fsspec writer

            return FsspecWriter(self.url_of(rel), sync_files=False)
        return FileSystemWriter(self.path(rel), sync_files=True)

    def dcp_reader(self, rel: str):  # noqa: ANN201 - a DCP StorageReader
        from torch.distributed.checkpoint import FileSystemReader

        if self.remote:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(self.url_of(rel))
        return FileSystemReader(self.path(rel))
