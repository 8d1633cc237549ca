"""The control plane past this machine: the pure controller and the signed store protocol at up
to 1,024 simulated workers on 128 hosts, with the in-memory store (no processes, no network).

For each size (workers = 8 per host): the time of one ``decide`` for the events a running job
sees (a tick with every heartbeat known, one worker's exit, a host lost, a shrink), the time to
publish a cluster config (seal + compare-and-set) and to read and verify it, the config's size,
and the control message's bytes per step (one float64 row per worker, allgathered: every worker
receives all rows). The anchor is what torchrun keeps for the same membership: its c10d
rendezvous state (a pickled ``_RendezvousState`` with every node, base64 in the store), which
every agent reads and rewrites by compare-and-set on each rendezvous change.

    .venv/bin/python benchmarks/control_scale.py --quick

``--live`` measures instead against real stores, with the real launcher and up to 1,024 simulated
workers (taiji_harness/control_live.py says how), torchrun's c10d rendezvous beside it; as
``--cases live`` its figures are recorded in benchmarks/results/control_scale.live.json:

    .venv/bin/python benchmarks/control_scale.py --cases live --quick
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import pickle
import shutil
import sys
import time
from dataclasses import fields

from taiji.cluster import auth  # noqa: E402
from taiji.cluster.controller import (
    Beat,
    Bounds,
    HostBeat,
    HostJoined,
    HostLost,
    Proposal,
    Tick,  # noqa: E402
    WorkerExited,
    WorkerReady,
    decide,
    initial_state,
)
from taiji.cluster.fake_store import FakeStore  # noqa: E402
from taiji.cluster.store import JobStore  # noqa: E402
from taiji.monitor.stats import ControlRow  # noqa: E402
from taiji_harness.bench import contract_row, median, print_result, reap_on_sigterm  # noqa: E402

PER_HOST = 8


def grown_state(hosts: int):
    state = initial_state(PER_HOST, Bounds(max_np=hosts * PER_HOST), "10.0.0.1", PER_HOST)
    for h in range(1, hosts):
        state, actions = decide(state, HostJoined(f"10.0.{h // 250}.{h % 250 + 2}", PER_HOST), 0.0)
        ids = [w.id for a in actions for w in getattr(a, "workers", ())]
        for wid in ids:
            state, _ = decide(state, WorkerReady(wid), 0.0)
    for wid in state.config.ids:
        state, _ = decide(state, Beat(wid, 0.0), 0.0)
    for host in state.hosts[1:]:
        state, _ = decide(state, HostBeat(host.address, 0.0), 0.0)
    assert state.config.size == hosts * PER_HOST, state.config.size
    return state


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times)


def torchrun_state_bytes(hosts: int) -> int:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    now = datetime.datetime.now()
    for h in range(hosts):
        node = _NodeDesc(f"10.0.{h // 250}.{h % 250 + 1}", 40000 + h, 0)
        state.participants[node] = h
        state.last_heartbeats[node] = now
    return len(base64.b64encode(pickle.dumps(state)))


def measure(hosts: int, repeat: int) -> dict:
    state = grown_state(hosts)
    n = state.config.size
    last = state.config.ids[-1]
    victim_host = state.hosts[-1].address
    job = JobStore(FakeStore(), "scale", auth.Signer(auth.new_secret()))
    config = type(state.config)(0, state.config.workers)  # published as v1, v2, ...

    def publish() -> None:
        nonlocal config
        config = type(config)(config.version + 1, config.workers)
        assert job.publish(config)

    publish_s = timed(publish, repeat)
    read_s = timed(lambda: job.read_config(), repeat)
    sealed = job.get(f"config/v{config.version}")
    row_floats = len(fields(ControlRow))
    return {
        "workers": n,
        "hosts": hosts,
        "decide_tick_ms": timed(lambda: decide(state, Tick(), 0.5), repeat) * 1e3,
        "decide_exit_ms": timed(lambda: decide(state, WorkerExited(last, 1, True), 0.5), repeat) * 1e3,
        "decide_host_lost_ms": timed(lambda: decide(state, HostLost(victim_host, "bench"), 0.5), repeat)
        * 1e3,
        "decide_shrink_ms": timed(lambda: decide(state, Proposal(n // 2), 0.5), repeat) * 1e3,
        "publish_ms": publish_s * 1e3,
        "read_verify_ms": read_s * 1e3,
        "config_bytes": len(config.to_json()),
        "sealed_config_bytes": len(sealed),
        "control_bytes_received_per_worker_step": 8 * row_floats * n,
        "torchrun_rendezvous_state_bytes": torchrun_state_bytes(hosts),
    }


def live(args: argparse.Namespace) -> None:
    from taiji_harness import control_live, control_torchrun

    reap_on_sigterm()  # the launchers and simulated hosts it started are stopped and reaped
    stores = [s for s in args.stores.split(",") if s != "etcd" or shutil.which("etcd")]
    skipped = {"etcd": "no etcd binary (make etcd)"} if "etcd" in args.stores and "etcd" not in stores else {}
    sizes = [int(n) for n in args.sizes.split(",")]
    results, anchors = [], {}
    for n in sizes:
        anchors[n] = control_torchrun.measure(n, args.window) if args.torchrun else {}
        print(
            f"# torchrun c10d, {n} workers: {anchors[n]} (None: not within 120 s)",
            file=sys.stderr,
            flush=True,
        )
        for store in stores:
            results.append(control_live.measure(store, n, args.window, args.sim_procs))
            print(
                f"# taiji {store}, {n} workers / {control_live.summary(results[-1])}",
                file=sys.stderr,
                flush=True,
            )
    print_result(
        "control_scale",
        control_live.rows(results, anchors, contract_row),
        quick=args.quick,
        live=True,
        growth_ops=control_live.growth(results, "ops_per_s"),
        growth_loss=control_live.growth(results, "loss_s"),
        growth_launcher_cpu=control_live.growth(results, "launcher_cpu"),
        skipped=skipped,
        sizes=results,
        torchrun=list(anchors.values()),
        load=os.getloadavg(),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (--live: 64 and 256 workers)")
    parser.add_argument(
        "--live", action="store_true", help="real stores, the real launcher, simulated workers"
    )
    parser.add_argument(
        "--cases",
        choices=["live"],
        default=None,
        help="live: --live, its figures recorded beside the in-memory ones (control_scale.live.json)",
    )
    parser.add_argument("--sizes", default=None, help="--live: workers per run (default 64,128,256,512,1024)")
    parser.add_argument("--stores", default="tcp,etcd", help="--live: tcp,etcd")
    parser.add_argument("--window", type=float, default=None, help="--live: steady-state seconds measured")
    parser.add_argument(
        "--no-torchrun",
        dest="torchrun",
        action="store_false",
        help="--live: no torchrun anchor (to iterate on taiji's own figures)",
    )
    parser.add_argument("--sim-procs", type=int, default=2, help="--live: processes of simulated hosts")
    args = parser.parse_args(argv)
    if args.live or args.cases == "live":
        args.sizes = args.sizes or ("64,256" if args.quick else "64,128,256,512,1024")
        args.window = args.window or (3.0 if args.quick else 10.0)
        return live(args)
    repeat = 5 if args.quick else 25
    results = [measure(hosts, repeat) for hosts in (8, 32, 128)]
    for r in results:
        print(
            f"# {r['workers']:5d} workers / {r['hosts']:3d} hosts: decide tick {r['decide_tick_ms']:.2f} ms, "
            f"exit {r['decide_exit_ms']:.2f} ms, host lost {r['decide_host_lost_ms']:.2f} ms, shrink "
            f"{r['decide_shrink_ms']:.2f} ms; publish {r['publish_ms']:.2f} ms, read+verify "
            f"{r['read_verify_ms']:.2f} ms; config {r['sealed_config_bytes']} B sealed (torchrun's "
            f"rendezvous state {r['torchrun_rendezvous_state_bytes']} B); control message "
            f"{r['control_bytes_received_per_worker_step']} B received per worker per step",
            file=sys.stderr,
        )
    big, small = results[-1], results[0]
    growth = {
        k: round(big[k] / small[k], 2)
        for k in ("decide_tick_ms", "decide_exit_ms", "publish_ms", "sealed_config_bytes")
        if small[k]
    }
    rows = [
        contract_row(
            "cluster config bytes at 1,024 workers / 128 hosts (sealed JSON vs torchrun's rendezvous state)",
            big["sealed_config_bytes"],
            big["torchrun_rendezvous_state_bytes"],
            higher_is_better=False,
        ),
        contract_row(
            "decide, one worker's exit, 1,024 workers (ms)",
            round(big["decide_exit_ms"], 3),
            None,
            higher_is_better=False,
        ),
        contract_row(
            "publish a config, 1,024 workers (ms)", round(big["publish_ms"], 3), None, higher_is_better=False
        ),
    ]
    print_result("control_scale", rows, quick=args.quick, growth_8_to_128_hosts=growth, sizes=results)


if __name__ == "__main__":
    main()
