"""The anchor of ``benchmarks/control_scale.py --live``: torchrun's c10d rendezvous with simulated
agents, driven the way taiji's simulation is.

``H`` simulated nodes (one per host; torchrun's agent, not its workers, takes part): each a
``DynamicRendezvousHandler`` on a ``C10dRendezvousBackend`` over its own client of one TCPStore on
loopback, ``min_nodes = H - 1``, ``max_nodes = H``, torchrun's default keep-alive (5 s, 3 tries)
and a 1 s last call (its default is 30 s). One node is a process of its own
(``python -m taiji_harness.control_torchrun HOST PORT RUN_ID H``), the others threads of this one.
Measured: the rendezvous of the H nodes; the store's operations per second at steady state (every
agent's monitor loop asks ``num_nodes_waiting`` every 0.1 s, torchrun's ``monitor_interval``; its
keep-alive runs by itself); after the lone node's process is killed, the re-rendezvous of the H-1
others, from the moment they all start over (torchrun starts over once its workers' collectives
fail; that wait is not counted) until each has its new rank.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import os
import subprocess
import sys
import threading
import time

import torch.distributed as dist

from taiji.launch.supervisor import die_with_parent

MONITOR_INTERVAL_S = 0.1  # torchrun's default
LAST_CALL_S = 1.0
OPS = itertools.count()


class CountedStore(dist.Store):
    """A TCPStore client that counts the calls the rendezvous makes."""

    def __init__(self, store: dist.Store):
        super().__init__()
        self.store = store

    def set(self, key, value):
        next(OPS)
        return self.store.set(key, value)

    def get(self, key):
        next(OPS)
        return self.store.get(key)

    def compare_set(self, key, expected, desired):
        next(OPS)
        return self.store.compare_set(key, expected, desired)

    def add(self, key, amount):
        next(OPS)
        return self.store.add(key, amount)

    def check(self, keys):
        next(OPS)
        return self.store.check(keys)

    def wait(self, keys, timeout=None):
        next(OPS)
        return self.store.wait(keys) if timeout is None else self.store.wait(keys, timeout)

    def set_timeout(self, timeout):
        self.store.set_timeout(timeout)


def handler(host: str, port: int, run_id: str, nodes: int):
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    store = CountedStore(dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=600)))
    return DynamicRendezvousHandler.from_backend(
        run_id,
        store,
        C10dRendezvousBackend(store, run_id),
        min_nodes=max(nodes - 1, 1),
        max_nodes=nodes,
        timeout=RendezvousTimeout(
            join=datetime.timedelta(seconds=600), last_call=datetime.timedelta(seconds=LAST_CALL_S)
        ),
    )


def all_rendezvous(handlers: list, timeout: float) -> float | None:
    """Every handler's ``next_rendezvous`` at once; seconds until the last one returned (None:
    not within ``timeout``)."""
    t0 = time.monotonic()
    errors: list[BaseException] = []

    def one(h) -> None:
        try:
            h.next_rendezvous()
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in handlers]
    for t in threads:
        t.start()
    deadline = t0 + timeout
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0.0))
    if errors:
        raise errors[0]
    return None if any(t.is_alive() for t in threads) else time.monotonic() - t0


def measure(workers: int, window: float, per_host: int = 8, timeout: float = 120.0) -> dict:
    """The figures for ``workers / per_host`` nodes (None: a rendezvous not done within ``timeout``)."""
    nodes = max(workers // per_host, 2)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # no store server of rank 0's own
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    run_id = f"scale{os.getpid()}n{nodes}"
    lone = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taiji_harness.control_torchrun",
            "127.0.0.1",
            str(server.port),
            run_id,
            str(nodes),
        ],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    handlers: list = []
    handlers_done = False
    try:
        assert lone.stdout is not None
        if lone.stdout.readline().strip() != "ready":
            raise RuntimeError(f"torchrun's lone simulated node did not start ({lone.poll()})")
        handlers = [handler("127.0.0.1", server.port, run_id, nodes) for _ in range(nodes - 1)]
        start_s = all_rendezvous(handlers, timeout)
        if start_s is None:
            return {"workers": workers, "hosts": nodes, "start_s": None, "ops_per_s": None, "loss_s": None}
        stop = threading.Event()

        def monitor(h) -> None:
            while not stop.wait(MONITOR_INTERVAL_S):
                h.num_nodes_waiting()

        threads = [threading.Thread(target=monitor, args=(h,), daemon=True) for h in handlers]
        for t in threads:
            t.start()
        time.sleep(1.0)
        t0, ops0 = time.monotonic(), next(OPS)
        time.sleep(window)
        ops_per_s = (next(OPS) - ops0) / (time.monotonic() - t0)
        stop.set()
        for t in threads:
            t.join()
        lone.kill()
        lone.wait()
        loss_s = all_rendezvous(handlers, timeout)
        handlers_done = loss_s is not None  # else some still wait in the rendezvous: left to the exit
        return {
            "workers": workers,
            "hosts": nodes,
            "start_s": start_s,
            "ops_per_s": ops_per_s,
            "loss_s": loss_s,
        }
    finally:
        for h in handlers if handlers_done else ():
            h.shutdown()  # ends its keep-alive timer
        if lone.poll() is None:
            lone.kill()
            lone.wait()


def main(argv: list[str]) -> None:
    """The lone node: join the first rendezvous, then keep alive until killed."""
    host, port, run_id, nodes = argv
    node = handler(host, int(port), run_id, int(nodes))
    print("ready", flush=True)
    node.next_rendezvous()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
