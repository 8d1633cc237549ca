"""Thread-level fault injection for the runtime (torchft's event-injector pattern).

Ranks run as threads in one process, each with its own Peer and real gloo groups over an
in-process HashStore; the job store is the in-memory ``FakeStore``. Each rank's Communicator is
an ``InjectingCommunicator`` that consults one shared ``Injector``: at the n-th call of an op on
a channel in a cluster version, a rank can *die* (its thread ends, as a killed worker would) or
*observe a failure* (the collective raises PeerLost / CollectiveTimeout, as a survivor's would).
A small launcher thread stands in for the controller: once every survivor reported the failure
of a version, it publishes the next config without the dead. Every failure path of
``Transitions``/``StepEngine`` runs in well under a second this way.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from taiji.cluster import spec
from taiji.cluster.fake_store import FakeStore
from taiji.cluster.store import JobStore
from taiji.comm.communicator import Communicator, Handle
from taiji.errors import CollectiveTimeout, PeerLost
from taiji.runtime.peer import Peer, PeerOptions


class WorkerDied(BaseException):
    """Ends a rank's thread the way SIGKILL ends a worker: nothing of its Job runs after it."""


@dataclass(frozen=True)
class Inject:
    worker: str  # whose call it is
    version: int  # in which cluster version
    channel: str  # "grad" (gradient buckets) or "ctrl" (control message, state sync)
    op: str  # "allreduce", "allgather" or "broadcast"
    nth: int  # the n-th such call of this worker in this version (1 = first)
    action: str  # "die", "lose" (PeerLost), "timeout" (CollectiveTimeout), or "lose_after":
    # the collective runs (its peers complete it), then raises PeerLost here


class Injector:
    def __init__(self, faults: Sequence[Inject]):
        self.faults = list(faults)
        self.calls: dict[tuple[str, int, str, str], int] = {}
        self.fired: list[Inject] = []
        self.lock = threading.Lock()

    def consult(self, worker: str, version: int, channel: str, op: str) -> Inject | None:
        with self.lock:
            key = (worker, version, channel, op)
            self.calls[key] = n = self.calls.get(key, 0) + 1
            for fault in self.faults:
                if (fault.worker, fault.version, fault.channel, fault.op, fault.nth) == (*key, n):
                    self.fired.append(fault)
                    return fault
        return None

    def communicator(self, worker: str) -> type[Communicator]:
        injector = self

        class InjectingCommunicator(Communicator):
            def _fault(self, op: str, channel: str, async_op: bool, run: Callable[[], Handle]) -> Any:
                fault = injector.consult(worker, self.version, channel, op)
                if fault is None:
                    return run() if async_op else run().wait()
                if fault.action == "die":
                    raise WorkerDied(f"{worker} died in {op} on {channel} (v{self.version})")
                kind = CollectiveTimeout if fault.action == "timeout" else PeerLost
                error = kind(
                    f"[rank {self.rank} v={self.version}] {op} on channel '{channel}': injected "
                    f"{fault.action}",
                    channel=channel,
                    op=op,
                    version=self.version,
                )
                real = run() if fault.action == "lose_after" else None

                def fail() -> Any:
                    if real is not None:
                        real.wait()  # done for every rank: only this one is told it failed
                    raise error

                handle = Handle(None, fail, self, op, channel)
                return handle if async_op else handle.wait()

            def allreduce(self, tensor, op="sum", *, channel="grad", async_op=False):  # type: ignore[override]
                return self._fault(
                    "allreduce",
                    channel,
                    async_op,
                    lambda: super(InjectingCommunicator, self).allreduce(
                        tensor, op, channel=channel, async_op=True
                    ),
                )

            def allgather(self, tensor, *, channel="ctrl", async_op=False):  # type: ignore[override]
                return self._fault(
                    "allgather",
                    channel,
                    async_op,
                    lambda: super(InjectingCommunicator, self).allgather(
                        tensor, channel=channel, async_op=True
                    ),
                )

            def broadcast(self, tensor, src=0, *, channel="ctrl", async_op=False):  # type: ignore[override]
                return self._fault(
                    "broadcast",
                    channel,
                    async_op,
                    lambda: super(InjectingCommunicator, self).broadcast(
                        tensor, src, channel=channel, async_op=True
                    ),
                )

        return InjectingCommunicator


class ThreadCluster:
    """A job whose workers are threads (see module doc). ``run(fn)`` calls ``fn(peer)`` on every
    initial worker (and ``joiner_fn`` on joiners added with ``grow``)."""

    def __init__(self, n: int, injector: Injector | None = None, timeout: float = 5.0):
        self.injector = injector or Injector([])
        self.raw = dist.HashStore()
        self.kv = FakeStore(timeout=timeout)
        self.store = JobStore(self.kv, "threads")
        self.timeout = timeout
        self.config = spec.initial([spec.WorkerSpec(f"w{r}") for r in range(n)])
        assert self.store.publish(self.config)
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.died: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def peer(self, worker: str, member: bool = True) -> Peer:
        return Peer(
            self.raw,
            JobStore(self.kv, "threads"),
            worker,
            self.config if member else None,
            PeerOptions(timeout=self.timeout),
            make_comm=self.injector.communicator(worker),
        )

    def start(self, worker: str, fn: Callable[[Peer], Any], member: bool = True) -> None:
        def body() -> None:
            peer = self.peer(worker, member)
            try:
                self.results[worker] = fn(peer)
            except WorkerDied:
                self.died.add(worker)
            except SystemExit as exc:
                self.results[worker] = ("exit", exc.code)
            except BaseException:  # reported by join()
                self.errors[worker] = traceback.format_exc()
            finally:
                peer.close()

        thread = threading.Thread(target=body, name=f"rank-{worker}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def launcher(self, replace: dict[int, Sequence[str]] | None = None) -> None:
        """Stand in for the controller: when the survivors of version v reported its failure,
        publish v+1 without the workers that died (plus ``replace[v]`` joiners, if given)."""

        def body() -> None:
            while not self._stop.is_set():
                config = self.store.read_config()
                members = [w for w in config.ids if w not in self.died]
                reported = self.store.failure_reports(config.version, members)
                alive = [
                    w for w in members if any(t.name == f"rank-{w}" and t.is_alive() for t in self._threads)
                ]
                if alive and set(alive) <= set(reported):
                    gone = [w for w in config.ids if w not in alive]
                    survivors = tuple(w for w in config.workers if w.id in alive)
                    joiners = tuple(spec.WorkerSpec(j) for j in (replace or {}).get(config.version, ()))
                    self.store.publish(spec.ClusterConfig(config.version + 1, survivors + joiners))
                    for worker in gone:
                        self.died.add(worker)
                    continue
                self._stop.wait(0.01)

        thread = threading.Thread(target=body, name="launcher", daemon=True)
        thread.start()
        self._launcher = thread

    def publish(self, config: spec.ClusterConfig) -> None:
        assert self.store.publish(config)

    def join(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.01))
        self._stop.set()
        hung = [t.name for t in self._threads if t.is_alive()]
        if hung:
            raise AssertionError(f"{hung} did not finish within {timeout}s (a hang)")
        if self.errors:
            worker, tb = sorted(self.errors.items())[0]
            raise AssertionError(f"{worker} failed:\n{tb}")
        return self.results


def tiny_job_parts(seed: int = 0, n: int = 48) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """A model, optimizer and data set small enough that a step costs well under a millisecond."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
    model = torch.nn.Linear(4, 1)
    init = torch.Generator().manual_seed(seed)  # not the global RNG: the ranks are threads
    with torch.no_grad():
        model.weight.copy_(torch.randn(model.weight.shape, generator=init))
        model.bias.copy_(torch.randn(model.bias.shape, generator=init))
    return model, torch.optim.SGD(model.parameters(), lr=0.05), torch.utils.data.TensorDataset(x, y)
