"""Peer-to-peer model store: round trips, atomic snapshots, authentication, failure modes."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import threading
import time

import pytest
import torch

from taiji.comm import p2p
from taiji.comm.p2p import BackgroundFetcher, ModelStore, Snapshot, fetch
from taiji.errors import CommError, ConfigError, PeerLost

SECRET = b"job-secret-for-tests"
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def store():
    with ModelStore(SECRET) as s:
        yield s


@contextlib.contextmanager
def fake_server(script):
    """A one-shot TCP server running ``script(conn)`` on its first connection."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(10)
    done = threading.Event()

    def serve():
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        with conn:
            try:
                script(conn)
            except OSError:
                pass
            done.wait(10)  # keep the connection open until the test is done with it

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield lsock.getsockname()[:2]
    finally:
        done.set()
        lsock.close()
        th.join(5)


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def handshake(conn, secret=SECRET):
    """Server side of the handshake, written from the protocol description."""
    sn = b"s" * 16
    conn.sendall(p2p._MAGIC + sn)
    answer = recv_exact(conn, 48)
    cn = answer[:16]
    conn.sendall(p2p._mac(secret, b"server", sn, cn))


def send_header(conn, header: bytes | dict):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    conn.sendall(struct.pack(">I", len(raw)) + raw)


def test_round_trip_dtypes_and_shapes(store):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = [
        base,
        torch.tensor(3.25, dtype=torch.float64),  # 0-d
        torch.arange(-5, 5, dtype=torch.int64),
        torch.randn(2, 3).to(torch.bfloat16),  # no numpy dtype
        torch.randn(4).half(),
        torch.tensor([True, False, True]),
        torch.arange(6, dtype=torch.uint8).reshape(2, 3),
        torch.tensor([-3, 7], dtype=torch.int8),
        torch.empty(0, 5, dtype=torch.int32),  # empty
        torch.randn(3, dtype=torch.complex64),
        base.t(),  # non-contiguous
        torch.randn(3, requires_grad=True),
    ]
    store.publish(7, tensors)
    snap = fetch(store.address, SECRET, timeout=5)
    assert isinstance(snap, Snapshot) and snap.version == 7
    assert len(snap.tensors) == len(tensors)
    for got, want in zip(snap.tensors, tensors):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want.detach())
        assert not got.requires_grad


def test_publish_copies_and_latest_wins(store):
    t = torch.zeros(4)
    store.publish(1, [t])
    t.add_(1)  # the training thread keeps mutating its parameters
    snap = fetch(store.address, SECRET, timeout=5)
    assert snap.version == 1 and torch.equal(snap.tensors[0], torch.zeros(4))
    store.publish(2, [t])
    snap = fetch(store.address, SECRET, timeout=5)
    assert snap.version == 2 and torch.equal(snap.tensors[0], torch.ones(4))


def test_publish_reuses_the_buffers_of_a_snapshot_nobody_is_reading(store):
    t = torch.arange(6.0)
    store.publish(1, [t])
    first = store._current.tensors[0].data_ptr()
    store.publish(2, [t + 1])
    second = store._current.tensors[0].data_ptr()
    store.publish(3, [t + 2])
    assert store._current.tensors[0].data_ptr() == first != second, "the retired buffer is reused"
    store.publish(4, [torch.zeros(3)])  # another layout: fresh buffers, still correct
    assert torch.equal(fetch(store.address, SECRET, timeout=5).tensors[0], torch.zeros(3))


def test_nothing_published_returns_none(store):
    assert fetch(store.address, SECRET, timeout=5) is None


def test_publish_validates():
    with ModelStore(SECRET) as s:
        with pytest.raises(ConfigError, match="version"):
            s.publish(-1, [torch.zeros(1)])
        with pytest.raises(ConfigError, match="dtype"):
            s.publish(1, [torch.zeros(1, dtype=torch.uint16)])


def test_concurrent_fetches_never_see_mixed_snapshot(store):
    shapes = [(256, 256), (1000,), (), (64, 3, 3), (0,)]
    store.publish(0, [torch.zeros(s) for s in shapes])
    stop = threading.Event()
    errors: list[str] = []
    counts: list[int] = []

    def publisher():
        v = 0
        while not stop.is_set():
            v += 1
            store.publish(v, [torch.full(s, float(v)) for s in shapes])

    def fetcher():
        last, n = -1, 0
        while not stop.is_set():
            snap = fetch(store.address, SECRET, timeout=5)
            n += 1
            if snap.version < last:
                errors.append(f"version went back {last} -> {snap.version}")
            last = snap.version
            for t in snap.tensors:
                if t.numel() and not bool((t == snap.version).all()):
                    errors.append(f"mixed snapshot at version {snap.version}")
        counts.append(n)

    threads = [threading.Thread(target=publisher)] + [threading.Thread(target=fetcher) for _ in range(8)]
    for th in threads:
        th.start()
    time.sleep(1.0)
    stop.set()
    for th in threads:
        th.join(10)
    assert not errors, errors[:5]
    assert len(counts) == 8 and min(counts) > 0


def test_wrong_secret_rejected(store, caplog):
    store.publish(1, [torch.ones(1000)])
    with caplog.at_level(logging.WARNING, logger="taiji.comm.p2p"):
        with pytest.raises(PeerLost, match="authentication failed") as ei:
            fetch(store.address, b"wrong", timeout=5)
        assert f"{store.address[0]}:{store.address[1]}" in str(ei.value)
        # Raw client: nothing but the greeting ever comes back to an unauthenticated peer.
        with socket.create_connection(store.address, timeout=5) as s:
            hello = recv_exact(s, len(p2p._MAGIC) + 16)
            assert hello.startswith(p2p._MAGIC)
            s.sendall(b"x" * 48)
            rest = b""
            while chunk := s.recv(65536):
                rest += chunk
            assert rest == b""
    for _ in range(50):  # the handler logs just after closing; give it a moment
        if sum("authentication failed" in r.getMessage() for r in caplog.records) >= 2:
            break
        time.sleep(0.02)
    assert sum("authentication failed" in r.getMessage() for r in caplog.records) >= 2


def test_impostor_server_rejected():
    def script(conn):
        conn.sendall(p2p._MAGIC + b"s" * 16)
        recv_exact(conn, 48)
        conn.sendall(b"\0" * 32)  # cannot compute the proof without the secret
        send_header(conn, {"version": 1, "tensors": []})

    with fake_server(script) as addr:
        with pytest.raises(PeerLost, match="authentication failed.*prove"):
            fetch(addr, SECRET, timeout=5)


def test_unreachable_peer_fails_fast():
    s = ModelStore(SECRET)
    addr = s.address
    s.close()
    t0 = time.monotonic()
    with pytest.raises(PeerLost, match=f"{addr[1]}.*cannot connect"):
        fetch(addr, SECRET, timeout=5)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("stall_after", ["accept", "greeting", "header", "payload"])
def test_silent_server_times_out(stall_after):
    def script(conn):
        if stall_after == "accept":
            return
        if stall_after == "greeting":
            conn.sendall(p2p._MAGIC + b"s" * 16)
            return
        handshake(conn)
        if stall_after == "header":
            conn.sendall(struct.pack(">I", 100) + b"{")
            return
        send_header(conn, {"version": 3, "tensors": [{"dtype": "float32", "shape": [1000]}]})
        conn.sendall(b"\0" * 100)

    with fake_server(script) as addr:
        t0 = time.monotonic()
        with pytest.raises(PeerLost, match="timed out after 0.5s"):
            fetch(addr, SECRET, timeout=0.5)
        assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize(
    "header, match",
    [
        (b"not json", "malformed header"),
        (b"[1, 2]", "malformed header"),
        ({"version": True, "tensors": []}, "bad version"),
        ({"version": -2, "tensors": []}, "bad version"),
        ({"version": 1, "tensors": {}}, "not a list"),
        ({"version": 1, "tensors": [{"dtype": "object", "shape": [1]}]}, "dtype 'object'"),
        ({"version": 1, "tensors": [{"dtype": "float32", "shape": [-1]}]}, "bad shape"),
        ({"version": 1, "tensors": [{"dtype": "float32", "shape": [1.5]}]}, "bad shape"),
        ({"version": 1, "tensors": [{"dtype": "float32", "shape": [0, 2**70]}]}, "bad shape"),
        ({"version": 1, "tensors": [{"dtype": "float32"}]}, "malformed header"),
        ({"version": 1, "tensors": [{"dtype": "float64", "shape": [1 << 20, 1 << 20]}]}, "limit"),
        ({"version": None, "tensors": [{"dtype": "float32", "shape": [1]}]}, "without a version"),
    ],
)
def test_malformed_header(header, match):
    with fake_server(lambda conn: (handshake(conn), send_header(conn, header))) as addr:
        with pytest.raises(PeerLost, match=match):
            fetch(addr, SECRET, timeout=5)


def test_oversized_header_length_and_bad_greeting():
    def big(conn):
        handshake(conn)
        conn.sendall(struct.pack(">I", p2p.MAX_HEADER_BYTES + 1))

    with fake_server(big) as addr:
        with pytest.raises(PeerLost, match="exceeds the limit"):
            fetch(addr, SECRET, timeout=5)
    with fake_server(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")) as addr:
        with pytest.raises(PeerLost, match="bad greeting"):
            fetch(addr, SECRET, timeout=5)


def test_payload_limit_and_truncated_payload(store):
    store.publish(1, [torch.zeros(1000)])
    with pytest.raises(PeerLost, match="limit of 100 bytes"):
        fetch(store.address, SECRET, timeout=5, max_bytes=100)

    def truncated(conn):
        handshake(conn)
        send_header(conn, {"version": 1, "tensors": [{"dtype": "float32", "shape": [10]}]})
        conn.sendall(b"\0" * 8)
        conn.shutdown(socket.SHUT_WR)

    with fake_server(truncated) as addr:
        with pytest.raises(PeerLost, match="closed the connection while receiving tensor 0"):
            fetch(addr, SECRET, timeout=5)


def test_close_is_idempotent_prompt_and_frees_port():
    s = ModelStore(SECRET)
    s.publish(1, [torch.ones(10)])
    port = s.address[1]
    idle = socket.create_connection(s.address, timeout=5)  # a client that never answers
    recv_exact(idle, len(p2p._MAGIC) + 16)
    t0 = time.monotonic()
    s.close()
    s.close()
    assert time.monotonic() - t0 < 1.0
    assert idle.recv(10) == b""  # the stalled connection was shut down too
    idle.close()
    with ModelStore(SECRET, port=port) as again:
        assert again.address[1] == port
        again.publish(2, [torch.ones(1)])
        assert fetch(again.address, SECRET, timeout=5).version == 2


def test_empty_secret_only_on_loopback():
    with ModelStore(b"") as s:
        s.publish(1, [torch.ones(2)])
        assert fetch(s.address, b"", timeout=5).version == 1
        with pytest.raises(PeerLost, match="authentication failed"):
            fetch(s.address, SECRET, timeout=5)
    with pytest.raises(ConfigError, match="loopback"):
        ModelStore(b"", host="0.0.0.0")
    with pytest.raises(ConfigError, match="loopback"):
        fetch(("10.1.2.3", 1234), b"", timeout=1)


def test_str_secret_matches_bytes(store):
    store.publish(4, [torch.ones(1)])
    assert fetch(store.address, SECRET.decode(), timeout=5).version == 4


def test_background_fetcher(store):
    release = threading.Event()

    def slow(conn):
        release.wait(5)
        conn.sendall(p2p._MAGIC + b"s" * 16)
        recv_exact(conn, 48)
        conn.shutdown(socket.SHUT_RDWR)  # as a store does on a failed authentication

    bg = BackgroundFetcher(SECRET, timeout=5)
    with fake_server(slow) as slow_addr:
        assert bg.start(slow_addr)
        assert bg.in_flight
        assert not bg.start(store.address)  # at most one fetch in flight
        assert bg.poll() is None
        release.set()
        for _ in range(200):
            if not bg.in_flight:
                break
            time.sleep(0.01)
    result = bg.poll()
    assert isinstance(result, PeerLost)  # the fake server closed after the greeting
    assert bg.poll() is None  # each result is handed out once

    store.publish(9, [torch.full((3,), 9.0)])
    assert bg.start(store.address)
    for _ in range(200):
        result = bg.poll()
        if result is not None:
            break
        time.sleep(0.01)
    assert isinstance(result, Snapshot) and result.version == 9
    bg.close()
    bg.close()
    with pytest.raises(CommError, match="closed"):
        bg.start(store.address)


def _polled(bg: BackgroundFetcher, address):
    assert bg.start(address)
    deadline = time.monotonic() + 10
    while bg.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    return bg.poll()


def test_one_connection_per_peer_serves_every_fetch_and_an_idle_one_is_reopened():
    from taiji.comm.p2p import PeerConnection
    from taiji_harness.testing import wait_for

    with ModelStore(SECRET, idle_timeout=0.3) as store:
        connection = PeerConnection(store.address, SECRET, timeout=5)
        for version in (1, 2, 3):  # each fetch sees the latest publish, on the same connection
            store.publish(version, [torch.full((4,), float(version))])
            snap = connection.fetch()
            assert snap.version == version and torch.equal(snap.tensors[0], torch.full((4,), float(version)))
        assert store.connections_accepted == 1
        connection.close()
        wait_for(lambda: store.open_connections == 0, 5, "the store to end the closed connection")

        bg = BackgroundFetcher(SECRET, timeout=5)
        try:
            assert _polled(bg, store.address).version == 3
            assert _polled(bg, store.address).version == 3 and store.connections_accepted == 2
            wait_for(lambda: store.open_connections == 0, 5, "the store to drop the idle connection")
            store.publish(4, [torch.full((4,), 4.0)])
            assert _polled(bg, store.address).version == 4  # the dropped connection is reopened, once
            assert store.connections_accepted == 3
        finally:
            bg.close()
        wait_for(lambda: store.open_connections == 0, 5, "closing the fetcher to close its connections")


def test_the_fetcher_keeps_only_its_most_recent_peers_connections_and_closes_promptly(monkeypatch):
    monkeypatch.setattr(p2p, "KEPT_CONNECTIONS", 1)
    with ModelStore(SECRET) as first, ModelStore(SECRET) as second:
        first.publish(1, [torch.ones(2)])
        second.publish(2, [torch.ones(2)])
        bg = BackgroundFetcher(SECRET, timeout=5)
        try:
            for store in (first, first, second, first):
                assert _polled(bg, store.address).version in (1, 2)
            # first: one connection, then a new one after second's evicted it
            assert (first.connections_accepted, second.connections_accepted) == (2, 1)
        finally:
            bg.close()

    greeted, stalled = threading.Event(), threading.Event()

    def silent(conn):  # greets, then never answers: a fetch hangs until its timeout
        conn.sendall(p2p._MAGIC + b"s" * 16)
        greeted.set()
        stalled.wait(10)

    bg = BackgroundFetcher(SECRET, timeout=8)
    with fake_server(silent) as address:
        assert bg.start(address)
        assert greeted.wait(5)
        started = time.monotonic()
        bg.close()  # interrupts the fetch in progress instead of waiting out its timeout
        assert time.monotonic() - started < 3
        stalled.set()
    assert isinstance(bg.poll(), PeerLost)


def test_fetch_25mb_is_fast(store, capsys):
    # ~25 MB over 40 tensors of mixed sizes, like a small convnet's parameters.
    tensors = [torch.randn(160_000) for _ in range(40)] + [torch.randn(64) for _ in range(20)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    pubs = []
    for v in range(3):  # the first publish also page-faults fresh memory
        t0 = time.perf_counter()
        store.publish(v, tensors)
        pubs.append(time.perf_counter() - t0)
    fetch(store.address, SECRET, timeout=10)  # warm up
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        snap = fetch(store.address, SECRET, timeout=10)
        times.append(time.perf_counter() - t0)
    assert all(torch.equal(a, b) for a, b in zip(snap.tensors, tensors))
    best = min(times)
    with capsys.disabled():
        print(
            f"\np2p: publish {nbytes / 1e6:.1f} MB in {min(pubs) * 1e3:.1f} ms (best of 3); "
            f"fetch best {best * 1e3:.1f} ms, median {sorted(times)[2] * 1e3:.1f} ms "
            f"({nbytes / best / 1e9:.2f} GB/s)"
        )
    assert best < 2.0


def test_an_interrupt_before_the_connection_is_made_still_fails_the_fetch_at_once():
    """close() may interrupt a fetch whose socket is not assigned yet (the connect still returning
    on a loaded machine): the fetch must fail as soon as it connects, not wait out its timeout."""
    from taiji.comm.p2p import PeerConnection

    def silent(conn):  # greets, then never answers (fake_server holds the connection open)
        conn.sendall(p2p._MAGIC + b"s" * 16)

    with fake_server(silent) as address:
        connection = PeerConnection(address, SECRET, timeout=8)
        connection.interrupt()
        started = time.monotonic()
        with pytest.raises(PeerLost, match="interrupted while connecting"):
            connection.fetch()
        assert time.monotonic() - started < 3
        connection.close()
