"""The live scheduler's request channel: ``taiji sched submit|status|cancel|stop`` talk to the
daemon over TCP on the one address it was given, authenticated with its secret file.

Per connection: the daemon sends a fresh nonce (one JSON line), the client sends one JSON line
``{"request": {...}, "nonce": hex, "mac": hex}`` with a fresh nonce of its own and the MAC
(HMAC-SHA256, a key derived from the secret) over the daemon's nonce and the request's canonical
JSON, and the daemon answers one JSON line ``{"reply": {...}, "mac": hex}``, signed with another
key derived from the secret over the client's nonce and the reply. Neither a request nor a reply
can be replayed (each side's nonce is new each time), a client refuses a reply that is not signed
with the daemon's secret (AuthError), and nothing is unpickled. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

from ...errors import AuthError, ConfigError, StoreError
from ..control_socket import read_line

log = logging.getLogger(__name__)

LINE_LIMIT = 1 << 20
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def channel_key(secret: bytes) -> bytes:
    return hmac.new(secret, b"taiji/sched-requests", hashlib.sha256).digest()


def reply_key(secret: bytes) -> bytes:
    return hmac.new(secret, b"taiji/sched-replies", hashlib.sha256).digest()


def _mac(key: bytes, nonce: str, request: dict[str, Any]) -> str:
    body = nonce.encode() + json.dumps(request, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"an address is HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


class RequestServer:
    """Answers authenticated requests with ``handler``, each connection on a thread of its own
    (the handler does its own locking)."""

    def __init__(self, address: str, secret: bytes, handler: Handler):
        host, port = split_address(address)
        self._key = channel_key(secret)
        self._reply_key = reply_key(secret)
        self._handler = handler
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.2)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="taiji-sched-requests", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            # a thread per connection: a request may wait (a cancel, until its job is gone) while
            # others, the agents' polls among them, are answered
            threading.Thread(
                target=self._answer, args=(conn, peer), name="taiji-sched-request", daemon=True
            ).start()

    def _answer(self, conn: socket.socket, peer: Any) -> None:
        with conn:
            conn.settimeout(5.0)
            theirs = ""
            try:
                nonce = secrets.token_hex(16)
                conn.sendall(json.dumps({"nonce": nonce}).encode() + b"\n")
                message = json.loads(read_line(conn, limit=LINE_LIMIT))
                request = message["request"]
                theirs = str(message.get("nonce", ""))
                if not isinstance(request, dict) or not hmac.compare_digest(
                    str(message.get("mac", "")), _mac(self._key, nonce, request)
                ):
                    log.warning("refused a request from %s: bad signature (not our secret)", peer)
                    reply = {
                        "ok": False,
                        "error": "not authenticated: the request is not signed with this daemon's secret",
                    }
                else:
                    reply = self._handler(request)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request: {exc}"}
            except Exception as exc:  # the handler's own failure: answer it, keep serving
                log.exception("taiji sched: a request failed")
                reply = {"ok": False, "error": f"the daemon failed on this request: {exc}"}
            try:
                signed = {"reply": reply, "mac": _mac(self._reply_key, theirs, reply)}
                conn.sendall(json.dumps(signed).encode() + b"\n")
            except OSError:
                pass  # the client gave up

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(2.0)


def ask(address: str, secret: bytes, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Send one request; the daemon's reply (``ok`` true), or StoreError / AuthError saying why not."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            nonce = json.loads(read_line(sock, timeout, LINE_LIMIT))["nonce"]
            mine = secrets.token_hex(16)
            signed = {
                "request": request,
                "nonce": mine,
                "mac": _mac(channel_key(secret), str(nonce), request),
            }
            sock.sendall(json.dumps(signed).encode() + b"\n")
            line = read_line(sock, timeout, LINE_LIMIT)
            if not line:  # the daemon stopped (or was killed) before it answered: no reply, not a forged one
                raise OSError("the connection closed before a reply")
            answer = json.loads(line)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"no scheduler daemon answered on {address} ({exc}); start one with `taiji sched serve`"
        ) from None
    reply = answer.get("reply") if isinstance(answer, dict) else None
    if not isinstance(reply, dict) or not hmac.compare_digest(
        str(answer.get("mac", "")), _mac(reply_key(secret), mine, reply)
    ):
        raise AuthError(
            f"the reply from {address} is not signed with this scheduler's secret: another process "
            f"answers there, or the secret file differs from the daemon's (check --state-dir and "
            f"--secret-file); the reply was ignored"
        )
    if not reply.get("ok"):
        error = str(reply.get("error", "no reply"))
        if reply.get("refused"):  # the daemon will not take this client as it is configured
            raise ConfigError(error)
        raise (AuthError if error.startswith("not authenticated") else StoreError)(error)
    return reply
