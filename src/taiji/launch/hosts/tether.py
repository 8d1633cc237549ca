"""Tethers: one TCP connection from each agent to the job's controller, open for the agent's life.

A heartbeat tells that a process is gone only once it is overdue (a quarter second at best, etcd
leases a few seconds), while a process that dies on a host that keeps running has its sockets
closed by that host's kernel at once. So every agent holds a connection to the controller and
each end reads the other's death as the connection closing:

- the controller sees an agent's tether close: the agent is gone, and its workers with it (they
  die with their agent), so its host leaves the job in one version now, not when its beat stops;
- an agent sees the controller's tether close: the launcher's process is gone. Where the store
  outlives it (etcd), the agent checks that the store still names that tether's address as the
  controller's and that the port refuses a new connection, then stands for election at once.

An agent that closes its tether on purpose (to tether to a new controller, or as it stops) sends
``bye`` first, so only a death — or a reset by the network, rare on the trusted network the data
plane needs anyway — drops a host. TCP keepalive on both ends finds a tether whose peer vanished
without a FIN (minutes, not the heartbeat's seconds: for that case the heartbeat decides).

A host that loses power or its link closes nothing: the heartbeats (leases) still judge those.
The hello is authenticated (HMAC of the controller's nonce with a key derived from the job
secret), so nobody without the secret can tether as a host and then drop that host by
closing. Standard library only; one selector thread serves every agent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...cluster import auth
from ...errors import AuthError, LaunchError

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0  # a connection that has not said who it is by then is dropped
HELLO_LIMIT = 4096
MAX_UNNAMED = 64  # connections still owing their hello: more are refused (no file-descriptor flood)
PROBE_TIMEOUT_S = 0.2
BYE = b"bye\n"  # an agent closing its end on purpose (not dying) says so first
KEEPALIVE_IDLE_S = 10  # TCP keepalive: a peer gone without a FIN or RST is found out eventually,
KEEPALIVE_COUNT = 3  # and an idle tether is not forgotten by a stateful firewall


def _proof(key: bytes, nonce: bytes, address: str, session: str) -> str:
    return hmac.new(
        key, b"tether\0" + nonce + b"\0" + address.encode() + b"\0" + session.encode(), hashlib.sha256
    ).hexdigest()


def _keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_IDLE_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class _Peer:
    nonce: bytes
    deadline: float
    buffer: bytes = b""
    who: tuple[str, str] | None = None  # (host address, agent session) once the hello checked out


class TetherServer:
    """The controller's end. ``lost()`` returns the agents whose tether closed since the last call."""

    def __init__(self, host: str, secret: bytes, on_lost: Callable[[], None] = lambda: None):
        self._key = auth.derive(secret, "tether")
        self._on_lost = (
            on_lost  # called (on the tether's thread) once a tether closed: the controller looks now
        )
        self._listener = socket.create_server(
            (host, 0)
        )  # the advertised address only, like every server here
        self._listener.setblocking(False)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._peers: dict[socket.socket, _Peer] = {}
        self._lock = threading.Lock()
        self._lost: list[tuple[str, str]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="taiji-tether", daemon=True)
        self._thread.start()

    def lost(self) -> list[tuple[str, str]]:
        """(address, session) of every agent whose tether closed since the last call."""
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=2.0)
        for sock in list(self._peers) + [self._listener, self._wake_r, self._wake_w]:
            sock.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is not self._wake_r:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            for sock, peer in list(self._peers.items()):
                if peer.who is None and now > peer.deadline:
                    self._drop(sock)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if sum(1 for peer in self._peers.values() if peer.who is None) >= MAX_UNNAMED:
            sock.close()
            return
        _keep_alive(sock)
        nonce = secrets.token_bytes(16)
        try:
            sock.sendall(nonce.hex().encode() + b"\n")
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self._peers[sock] = _Peer(nonce, time.monotonic() + HELLO_TIMEOUT_S)
        self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(HELLO_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if peer.who is not None:
                with self._lock:
                    self._lost.append(peer.who)
                self._on_lost()
            self._drop(sock)
            return
        if peer.who is not None:
            if BYE in peer.buffer + data:  # it closes on purpose (to tether anew): not a death
                self._drop(sock)
            peer.buffer = data[-len(BYE) :]
            return
        peer.buffer += data
        if b"\n" not in peer.buffer:
            if len(peer.buffer) > HELLO_LIMIT:
                self._drop(sock)
            return
        try:
            hello = json.loads(peer.buffer.split(b"\n", 1)[0])
            address, session = str(hello["address"]), str(hello["session"])
            good = hmac.compare_digest(str(hello["proof"]), _proof(self._key, peer.nonce, address, session))
        except (ValueError, KeyError, TypeError):
            good = False
        if not good:
            log.warning("refused a tether that could not prove it holds the job's secret")
            self._drop(sock)
            return
        peer.who, peer.buffer = (address, session), b""
        try:
            sock.sendall(b"ok\n")
        except OSError:
            pass  # the close that follows is read next

    def _drop(self, sock: socket.socket) -> None:
        self._peers.pop(sock, None)
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()


class Tether:
    """An agent's end: ``broken`` is set when the controller's side of the connection closes."""

    def __init__(self, address: str, secret: bytes, host: str, session: str, timeout: float = 5.0):
        self.address = address
        self.broken = threading.Event()
        self._closing = False
        try:
            self._sock = socket.create_connection(split_address(address), timeout=timeout)
        except OSError as exc:
            raise LaunchError(f"could not reach the job's controller at {address} ({exc})") from None
        try:
            reader = self._sock.makefile("rb")
            nonce = bytes.fromhex(reader.readline(HELLO_LIMIT).decode().strip())
            proof = _proof(auth.derive(secret, "tether"), nonce, host, session)
            self._sock.sendall(
                json.dumps({"address": host, "session": session, "proof": proof}).encode() + b"\n"
            )
            answer = reader.readline(HELLO_LIMIT)
        except (OSError, ValueError) as exc:
            self._sock.close()
            raise LaunchError(
                f"the job's controller at {address} broke off the tether's hello ({exc})"
            ) from None
        if answer != b"ok\n":
            self._sock.close()
            raise AuthError(
                f"the job's controller at {address} refused this agent's tether (not this job's secret?)"
            )
        self._sock.settimeout(None)
        _keep_alive(self._sock)
        threading.Thread(target=self._hold, name="taiji-tether", daemon=True).start()

    def _hold(self) -> None:
        try:
            while self._sock.recv(64):
                pass
        except OSError:
            pass
        if not self._closing:
            self.broken.set()

    def drop(self) -> None:
        """Close as the agent's death would (no ``bye``): the controller drops this host at once
        (benchmarks/control_scale.py --live simulates a host's loss this way)."""
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # a FIN, as the kernel sends for a dead process
        except OSError:
            pass
        self._sock.close()

    def close(self) -> None:
        """Close on purpose: the controller is told, so it does not take it for this agent's death."""
        self._closing = True
        try:
            self._sock.sendall(BYE)
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Does a process listen at ``address``? A dead one's live host refuses at once."""
    try:
        socket.create_connection(split_address(address), timeout=timeout).close()
        return True
    except OSError:
        return False
