"""Peer-to-peer model store for asynchronous pair averaging (AD-PSGD style).

Each worker runs a :class:`ModelStore` that serves the latest snapshot of its parameters;
another worker pulls it with :func:`fetch` (or :class:`BackgroundFetcher`, off the training
thread), so a slow peer never blocks a fast one: there is no collective, only a read of
whatever the peer published last.

Wire protocol (docs/design.md#security: nothing is unpickled, the job secret authenticates peers):

1. server -> client: ``MAGIC`` + 16-byte server nonce
2. client -> server: 16-byte client nonce + ``HMAC(secret, b"client" + sn + cn)``
3. server checks it with ``hmac.compare_digest``; on mismatch it logs a warning and closes
   without sending anything else. Otherwise it sends ``HMAC(secret, b"server" + sn + cn)``
   (so the client knows the server holds the secret too), a 4-byte big-endian header length,
   the JSON header ``{"version": int | null, "tensors": [{"dtype": "float32", "shape": [..]}]}``
   and then each tensor's raw bytes back to back. ``version: null`` means nothing published.
4. The connection stays open: each further byte ``AGAIN`` gets the latest snapshot (step 3
   without the proof); closing, or ``idle_timeout`` of silence, ends it. A worker pays the
   connect and the handshake once per peer, not per fetch (:class:`PeerConnection`).

An empty secret is accepted only on loopback (the launcher always generates a secret). The
HMAC exchange authenticates but does not encrypt: do not carry secrets in the tensors.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import CommError, ConfigError, PeerLost
from .p2p_header import DTYPES, EMPTY_HEADER, decode_header, encode_header

log = logging.getLogger(__name__)

_MAGIC = b"TJP2P1\n"
_NONCE = 16
_MAC = 32
_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 64 << 30  # a corrupt header must not make us allocate without bound
_AGAIN = b"\x01"
KEPT_CONNECTIONS = 16  # a fetcher keeps its connections to the peers it asked most recently

Address = tuple[str, int]


@dataclass(frozen=True)
class Snapshot:
    """One whole published model: every tensor comes from the same ``publish`` call."""

    version: int
    tensors: list[torch.Tensor]


def _mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    # The role tag keeps a client answer from being replayed as a server proof.
    return hmac.new(secret, b"taiji-p2p/" + role + server_nonce + client_nonce, "sha256").digest()


def _key(secret: bytes | str, host: str, who: str) -> bytes:
    """The HMAC key; an empty one authenticates nothing, so it is refused off loopback."""
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key and host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConfigError(
                f"{who}: an empty job secret is allowed only on loopback, not "
                f"{host!r}; pass the job secret (TAIJI_SECRET, set by the launcher)"
            )
    return key


def _raw(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (bfloat16/bool included)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _same_layout(mine: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor]) -> bool:
    return len(mine) == len(theirs) and all(
        a.shape == b.shape and a.dtype == b.dtype for a, b in zip(mine, theirs)
    )


class ModelStore:
    """Serves this worker's latest published parameters to authenticated peers.

    ``publish`` makes exactly one copy and swaps a reference, so a fetch in progress keeps
    sending the snapshot it started with: a peer never sees half an old and half a new model.
    The copy goes into the buffers of an older snapshot that no connection is sending any more
    (when one exists), so publishing every step does not allocate and page-fault a new model.
    """

    def __init__(
        self,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        io_timeout: float = 30.0,
        max_connections: int = 256,
        idle_timeout: float = 300.0,
    ):
        self._key = _key(secret, host, "ModelStore")
        self._io_timeout, self._max_conns, self._idle_timeout = io_timeout, max_connections, idle_timeout
        self._current: Snapshot | None = None
        self._spare: Snapshot | None = None  # retired, unread: its buffers can be reused
        self._readers: dict[int, int] = {}  # id(snapshot) -> connections sending it
        self._lock = threading.Lock()
        self._closed = False
        self._handlers: dict[threading.Thread, socket.socket] = {}
        self.connections_accepted = 0  # over its life: with persistent clients, about one per peer
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.settimeout(0.05)  # accept loop polls the stop flag: close() is prompt
        self.address: Address = tuple(self._listener.getsockname()[:2])  # type: ignore[assignment]
        self._acceptor = threading.Thread(
            target=self._accept_loop, daemon=True, name=f"taiji-p2p-store:{self.address[1]}"
        )
        self._acceptor.start()

    def publish(self, version: int, tensors: Sequence[torch.Tensor]) -> None:
        """Snapshot ``tensors`` (one copy to contiguous CPU memory) and make it the one served."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigError(f"ModelStore.publish: version must be an int >= 0, got {version!r}")
        for i, t in enumerate(tensors):
            if t.dtype not in DTYPES.values():
                raise ConfigError(
                    f"ModelStore.publish: tensor {i} has dtype {t.dtype}, which "
                    f"p2p cannot send; supported: {sorted(DTYPES)}"
                )
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and not _same_layout(spare.tensors, tensors):
            spare = None
        copies = (
            spare.tensors if spare is not None else [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        )
        with torch.no_grad():
            for dst, t in zip(copies, tensors):
                dst.copy_(t.detach())
        snap = Snapshot(version, copies)  # not written again while it is current or being sent
        with self._lock:
            old, self._current = self._current, snap
            if old is not None and not self._readers.get(id(old)):
                self._spare = old

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            with self._lock:
                if self._closed or len(self._handlers) >= self._max_conns:
                    log.debug(
                        "p2p store %s: refusing connection from %s (closed or busy)", self.address, peer
                    )
                    conn.close()
                    continue
                th = threading.Thread(
                    target=self._handle, args=(conn, peer), daemon=True, name=f"taiji-p2p-serve:{peer}"
                )
                self._handlers[th] = conn
                self.connections_accepted += 1
            th.start()

    def _handle(self, conn: socket.socket, peer: object) -> None:
        try:
            conn.settimeout(self._io_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server_nonce = secrets.token_bytes(_NONCE)
            conn.sendall(_MAGIC + server_nonce)
            answer = _recv_exact_plain(conn, _NONCE + _MAC)
            client_nonce, mac = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(mac, _mac(self._key, b"client", server_nonce, client_nonce)):
                log.warning(
                    "p2p store %s: rejected %s: authentication failed (wrong job secret?)", self.address, peer
                )
                return
            conn.sendall(_mac(self._key, b"server", server_nonce, client_nonce))
            while True:
                self._serve_latest(conn)
                conn.settimeout(self._idle_timeout)
                try:
                    if conn.recv(1) != _AGAIN:  # closed (b""), or not our protocol
                        return
                except TimeoutError:
                    return  # idle: the client reconnects when it wants another
                conn.settimeout(self._io_timeout)
        except (OSError, EOFError) as e:  # the client went away or stalled: its problem, not ours
            log.debug("p2p store %s: connection from %s ended: %s", self.address, peer, e)
        finally:
            conn.close()
            with self._lock:
                self._handlers.pop(threading.current_thread(), None)

    def _release(self, snap: Snapshot) -> None:
        with self._lock:
            left = self._readers.get(id(snap), 1) - 1
            if left > 0:
                self._readers[id(snap)] = left
                return
            self._readers.pop(id(snap), None)
            if snap is not self._current and self._spare is None:
                self._spare = snap

    def _serve_latest(self, conn: socket.socket) -> None:
        """Send the current snapshot; publishing meanwhile does not touch the one being sent."""
        with self._lock:
            snap = self._current
            if snap is not None:
                self._readers[id(snap)] = self._readers.get(id(snap), 0) + 1
        try:
            header = encode_header(snap.version, snap.tensors) if snap is not None else EMPTY_HEADER
            conn.sendall(_LEN.pack(len(header)) + header)
            for t in snap.tensors if snap is not None else ():
                if t.numel():
                    conn.sendall(_raw(t))
        finally:
            if snap is not None:
                self._release(snap)

    def close(self, timeout: float = 2.0) -> None:
        """Stop serving, free the port and join the serving threads (at most ~``timeout`` s)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout
        self._acceptor.join(timeout)
        self._listener.close()
        with self._lock:
            handlers = dict(self._handlers)
        for conn in handlers.values():
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked in send/recv
            except OSError:
                pass
        for th in handlers:
            th.join(max(0.0, deadline - time.monotonic()))

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._handlers)

    def __enter__(self) -> ModelStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _recv_exact_plain(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:  # a recv with a timeout may return part: MSG_WAITALL does not help there
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"peer closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


class _Client:
    """A connection with one overall deadline: no single step can stretch past ``timeout``."""

    def __init__(self, address: Address, timeout: float):
        self.where = f"{address[0]}:{address[1]}"
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.sock: socket.socket | None = None
        self.timed_out = False

    def fail(self, what: str) -> PeerLost:
        return PeerLost(f"p2p fetch from {self.where} failed: {what}", channel="p2p", op="fetch")

    def settimeout(self, stage: str) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise self.fail(f"timed out after {self.timeout:g}s while {stage}")
        assert self.sock is not None
        self.sock.settimeout(left)

    def recv_into(self, view: memoryview, stage: str, closed: str = "") -> None:
        """Fill ``view``; ``closed`` replaces the message if the peer closes instead."""
        assert self.sock is not None
        got, n = 0, len(view)
        while got < n:
            self.settimeout(stage)
            try:
                k = self.sock.recv_into(view[got:])
            except TimeoutError:
                self.timed_out = True
                raise self.fail(f"timed out after {self.timeout:g}s while {stage}") from None
            if k == 0:
                raise self.fail(
                    closed or f"peer closed the connection while {stage} (got {got} of {n} bytes)"
                )
            got += k

    def recv(self, n: int, stage: str, closed: str = "") -> bytes:
        buf = bytearray(n)
        self.recv_into(memoryview(buf), stage, closed)
        return bytes(buf)


class PeerConnection:
    """One authenticated connection to a peer's :class:`ModelStore`, kept for repeated fetches.

    ``fetch()`` raises :class:`PeerLost` (naming the address and what happened) if the peer is
    unreachable, closes, stalls past ``timeout`` seconds in total, sends a malformed header or
    fails authentication (in either direction); the connection is then closed, and the next
    ``fetch()`` opens a new one.
    """

    def __init__(
        self, address: Address, secret: bytes, timeout: float, *, max_bytes: int = MAX_PAYLOAD_BYTES
    ):
        self.address, self.timeout, self.max_bytes = address, timeout, max_bytes
        self._key = _key(secret, address[0], "p2p fetch")
        self._sock: socket.socket | None = None
        self._interrupted = False
        # the last fetch failed on a connection opened before it, before any byte of the reply and
        # not by a timeout: the store restarted or ended the idle connection, worth one fresh try
        self.went_stale = False

    def fetch(self) -> Snapshot | None:
        """The peer's latest snapshot; ``None`` if it has published nothing yet."""
        c = _Client(self.address, self.timeout)
        reused, replied = self._sock is not None, False
        try:
            if self._sock is None:
                self._open(c)
            else:
                c.sock = self._sock
                c.settimeout("asking for the next snapshot")
                self._sock.sendall(_AGAIN)
            c.sock = self._sock
            (hlen,) = _LEN.unpack(c.recv(_LEN.size, "reading the header length"))
            replied = True
            if hlen > MAX_HEADER_BYTES:
                raise c.fail(f"malformed header: {hlen} bytes exceeds the limit of {MAX_HEADER_BYTES}")
            try:
                version, tensors = decode_header(c.recv(hlen, "reading the header"), self.max_bytes)
            except ValueError as e:
                raise c.fail(f"malformed header ({e})") from None
            for i, t in enumerate(tensors):
                if t.numel():
                    c.recv_into(_raw(t), f"receiving tensor {i} of {len(tensors)}")
            return None if version is None else Snapshot(version, tensors)
        except (PeerLost, OSError) as e:  # OSError: reset mid-transfer and the like (timeouts are PeerLost)
            self.close()
            self.went_stale = reused and not replied and not c.timed_out
            if isinstance(e, PeerLost):
                raise
            raise c.fail(f"connection error ({e.strerror or e})") from None

    def _open(self, c: _Client) -> None:
        try:
            c.sock = self._sock = socket.create_connection(self.address, timeout=self.timeout)
        except TimeoutError:
            raise c.fail(f"timed out after {self.timeout:g}s while connecting") from None
        except OSError as e:
            raise c.fail(f"cannot connect ({e.strerror or e}); peer gone or address stale?") from None
        try:
            if self._interrupted:  # interrupt() ran before the socket was ours to shut down
                raise c.fail("interrupted while connecting (the fetcher is closing)")
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = c.recv(len(_MAGIC) + _NONCE, "waiting for the greeting")
            if not hello.startswith(_MAGIC):
                raise c.fail("bad greeting: not a taiji p2p model store")
            server_nonce, client_nonce = hello[len(_MAGIC) :], secrets.token_bytes(_NONCE)
            c.settimeout("authenticating")
            c.sock.sendall(client_nonce + _mac(self._key, b"client", server_nonce, client_nonce))
            proof = c.recv(
                _MAC,
                "authenticating",
                closed="authentication failed: the peer rejected "
                "our job secret and closed the connection (different TAIJI_SECRET?)",
            )
            if not hmac.compare_digest(proof, _mac(self._key, b"server", server_nonce, client_nonce)):
                raise c.fail(
                    "authentication failed: the peer could not prove it holds the job "
                    "secret (different TAIJI_SECRET, or not our peer)"
                )
        except BaseException:
            self.close()
            raise

    def interrupt(self) -> None:
        """From another thread: make a fetch in progress fail now (one still connecting, too: it
        fails once connected instead of waiting out its timeout)."""
        self._interrupted = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def fetch(
    address: Address, secret: bytes, timeout: float, *, max_bytes: int = MAX_PAYLOAD_BYTES
) -> Snapshot | None:
    """Fetch a peer's latest snapshot once (connect, authenticate, read, close); ``None`` if it
    has published nothing yet. Raises :class:`PeerLost` as :meth:`PeerConnection.fetch` does."""
    connection = PeerConnection(address, secret, timeout, max_bytes=max_bytes)
    try:
        return connection.fetch()
    finally:
        connection.close()


FetchResult = Snapshot | None | Exception


class BackgroundFetcher:
    """Runs at most one fetch at a time on one long-lived thread, off the training thread,
    keeping one connection per peer (a connection that fails is reopened once, for a peer that
    restarted its store or dropped an idle connection).

    ``poll()`` returns ``None`` both while a fetch runs and when the finished fetch found
    nothing published; ``in_flight`` tells them apart. Either way there is nothing to average.
    """

    def __init__(self, secret: bytes, timeout: float):
        self._secret, self._timeout = secret, timeout
        self._lock = threading.Condition()
        self._connections: OrderedDict[Address, PeerConnection] = OrderedDict()  # least recently used first
        self._current: PeerConnection | None = None
        self._asked: Address | None = None
        self._busy = False  # a fetch was started and its result not polled yet
        self._done = False
        self._result: FetchResult = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="taiji-p2p-fetch")
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        with self._lock:
            return self._busy and not self._done

    def start(self, address: Address) -> bool:
        """Begin fetching from ``address``; False (and nothing started) if a fetch is running
        or its result has not been polled yet."""
        with self._lock:
            if self._closed:
                raise CommError("BackgroundFetcher.start: the fetcher is closed", channel="p2p")
            if self._busy:
                return False
            self._busy, self._done, self._result, self._asked = True, False, None, address
            self._lock.notify()
            return True

    def _serve(self) -> None:
        while True:
            with self._lock:
                while self._asked is None and not self._closed:
                    self._lock.wait()
                if self._closed:
                    break
                address, self._asked = self._asked, None
            try:
                result: FetchResult = self._fetch(address)
            except Exception as e:  # handed to the caller through poll(), never lost
                result = e
            with self._lock:
                self._result, self._done = result, True
        for connection in self._connections.values():
            connection.close()

    def _fetch(self, address: Address) -> Snapshot | None:
        connection = self._connections.pop(address, None) or PeerConnection(
            address, self._secret, self._timeout
        )
        self._connections[address] = self._current = connection
        if self._closed:  # close() ran before it could see this connection to interrupt it
            raise CommError("the fetcher was closed", channel="p2p")
        while len(self._connections) > KEPT_CONNECTIONS:  # peers not asked for longest (or gone)
            self._connections.popitem(last=False)[1].close()
        try:
            return connection.fetch()
        except PeerLost:
            if not connection.went_stale or self._closed:
                raise
            return connection.fetch()  # its store restarted, or ended the idle connection: one fresh try
        finally:
            self._current = None

    def poll(self) -> FetchResult:
        """The finished fetch's snapshot, None or exception (once); None while one runs."""
        with self._lock:
            if not self._busy or not self._done:
                return None
            result, self._result, self._busy = self._result, None, False
            return result

    def close(self) -> None:
        """Refuse new fetches, wait for the running one (bounded by its timeout), close the connections."""
        with self._lock:
            self._closed = True
            if self._busy and self._asked is not None:  # asked but not begun: settle it
                self._asked, self._result, self._done = (
                    None,
                    CommError("the fetcher was closed", channel="p2p"),
                    True,
                )
            self._lock.notify()
            current = self._current
        if current is not None:
            current.interrupt()
        self._thread.join(self._timeout + 1.0)
