"""The launcher's control socket: `taiji status` and `taiji resize` talk to a running launcher.

A Unix socket next to the job's registry entry (owner-only permissions), one JSON request line
and one JSON reply line per connection. The launcher answers from a thread: ``status`` returns
the snapshot its driver last published, ``resize`` queues a proposal that the driver writes to
the job store's proposals (the one inbox of resizes) at its next tick. Standard library only, so that the CLI
side never loads torch.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StoreError

log = logging.getLogger(__name__)

REQUEST_LIMIT = 64 * 1024


class ControlServer:
    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]]):
        self.path = path
        self.snapshot = snapshot
        self.proposals: queue.SimpleQueue[tuple[int, str, tuple[tuple[str, int], ...]]] = queue.SimpleQueue()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)  # created owner-only: no window in which others may connect
        try:
            self._sock.bind(str(path))
        finally:
            os.umask(old_mask)
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="taiji-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    reply = self._answer(json.loads(read_line(conn)))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    reply = {"ok": False, "error": f"bad request: {exc}"}
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass  # the client gave up

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return {"ok": True, **self.snapshot()}
        if op == "resize":
            size = int(request["size"])
            raw = request.get("placement") or {}
            if not isinstance(raw, dict):
                return {"ok": False, "error": "placement must map host addresses to worker counts"}
            placement = tuple((str(host), int(n)) for host, n in raw.items())
            self.proposals.put((size, str(request.get("source", "taiji resize")), placement))
            return {"ok": True}
        return {"ok": False, "error": f"unknown request {op!r}"}

    def take_proposals(self) -> list[tuple[int, str, tuple[tuple[str, int], ...]]]:
        """(size, source, placement) of each resize asked since the last call; placement: (host,
        workers) pairs a scheduler wants, or () for any hosts."""
        taken = []
        while True:
            try:
                taken.append(self.proposals.get_nowait())
            except queue.Empty:
                return taken

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(2.0)
        self.path.unlink(missing_ok=True)


def read_line(conn: socket.socket, within: float = 10.0, limit: int = REQUEST_LIMIT) -> bytes:
    """One JSON line of a request or reply, read within ``within`` seconds in all (a client
    trickling bytes cannot hold a one-connection server longer) and at most ``limit`` bytes."""
    deadline = time.monotonic() + within
    data = b""
    while not data.endswith(b"\n"):
        if time.monotonic() > deadline:
            raise ValueError("the line took too long to arrive")
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("line too long")
    return data


def request(path: Path, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one request to a launcher's control socket and return its reply."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(read_line(sock, timeout) or b"{}")
    except (OSError, ValueError) as exc:
        raise StoreError(f"the launcher did not answer on {path}: {exc}") from None
    if not reply.get("ok"):
        raise StoreError(f"the launcher refused the request: {reply.get('error', 'no reply')}")
    return reply
