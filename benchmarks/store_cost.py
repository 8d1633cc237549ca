"""The control plane's cost per training step: the same job on the etcd store vs the TCPStore.

``taiji run -np 2`` on ``_elastic_train.py`` (the MLP of ``benchmarks/elastic.py``), once with
``--store tcp`` (hosted by the launcher) and once with ``--store etcd`` (a local etcd server the
launcher starts), in alternating order per repetition. In steady state a worker touches the store
only from background threads (its heartbeat, its config watcher) and the launcher polls it every
tick; all of that shares the machine with training, so its cost shows as a longer step. The
figure is the median step time after the warm-up, etcd vs TCP, paired per repetition; beside it,
the requests per second the etcd server answered over the measured steps (its own count, from its
``/metrics``: the store's load at steady state; a TCPStore counts nothing).

    .venv/bin/python benchmarks/store_cost.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from taiji_harness.bench import contract_row, interleaved, median, paired_ratio, print_result, reap_on_sigterm  # noqa: E402
from taiji_harness.control_live import etcd_ops, store_address  # noqa: E402
from taiji_harness.elastic_analysis import step_intervals  # noqa: E402
from taiji_harness.elastic_runs import LaunchedJob, StepLog, steady_commits, steady_options, train_args  # noqa: E402


class EtcdLoad:
    """The requests an etcd server answered per second between ``at("warm")`` and ``at("end")``
    (steady_commits' marks); its URL from the launcher's first line in ``output``."""

    def __init__(self, output: Path):
        self.output, self.marks = output, {}
        self.per_s: float | None = None

    def at(self, mark: str) -> None:
        url = next(filter(None, map(store_address, self.output.read_text(errors="replace").splitlines())))
        with urllib.request.urlopen("http://" + url.split("://", 1)[1] + "/metrics", timeout=10) as answer:
            self.marks[mark] = (time.monotonic(), etcd_ops(answer.read().decode()))
        if mark == "end":
            (t0, ops0), (t1, ops1) = self.marks["warm"], self.marks["end"]
            self.per_s = (ops1 - ops0) / (t1 - t0)


def run(args: argparse.Namespace, store: str, out: Path, load: list[float]) -> float:
    """Median step seconds of rank 0 after the warm-up, on ``store`` (etcd: its requests per
    second over those steps appended to ``load``)."""
    log = StepLog(out, "taiji")
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--store",
        store,
        "--job-id",
        f"cost{os.getpid()}{store}",
        "--run-dir",
        str(out / "run"),
        "--",
        *train_args(args, out, "--max-steps", str(args.warm + args.steps)),
    ]
    job = LaunchedJob(f"taiji-{store}", cmd, out, dict(os.environ, TAIJI_HOME=str(out / "home")), log)
    etcd = EtcdLoad(out / f"taiji-{store}.out")
    try:
        steps = median(
            step_intervals(steady_commits(args, job, log, etcd.at if store == "etcd" else lambda m: None))
        )
    finally:
        job.close()
    if etcd.per_s is not None:
        load.append(etcd.per_s)
    return steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 150 steps")
    args = steady_options(parser, 150, 400, 180.0, argv)
    reap_on_sigterm()
    if shutil.which("etcd") is None:
        print(
            "# store_cost: no etcd binary (apt-get install -y etcd-server); nothing measured", file=sys.stderr
        )
        print_result("store_cost", [], skipped="no etcd binary")
        return
    base = Path(tempfile.mkdtemp(prefix="taiji-store-cost-"))
    steps: dict[str, list[float]] = {"etcd": [], "tcp": []}
    etcd_load: list[float] = []
    try:
        for rep in range(args.reps):
            for store in interleaved(["etcd", "tcp"], rep):
                out = base / f"{store}-{rep}"
                out.mkdir()
                steps[store].append(run(args, store, out, etcd_load))
                print(
                    f"# rep {rep} {store}: {steps[store][-1] * 1e3:.2f} ms/step", file=sys.stderr, flush=True
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = paired_ratio(steps["etcd"], steps["tcp"])
    row = contract_row(
        "step time, etcd store vs TCPStore (ms, 2 workers, MLP)",
        round(median(steps["etcd"]) * 1e3, 3),
        round(median(steps["tcp"]) * 1e3, 3),
        higher_is_better=False,
        ratio=ratio,
        etcd_all_ms=[round(s * 1e3, 3) for s in steps["etcd"]],
        tcp_all_ms=[round(s * 1e3, 3) for s in steps["tcp"]],
        overhead_pct=round((1 / ratio - 1) * 100, 2),
    )
    print(
        f"# etcd vs tcp: {row['taiji']} vs {row['anchor']} ms/step, overhead {row['overhead_pct']}%; "
        f"etcd answered {[round(x) for x in etcd_load]} requests/s",
        file=sys.stderr,
    )
    load = contract_row(
        "etcd requests per second at steady state (2 workers, MLP; the server's count)",
        round(median(etcd_load), 1),
        None,
        higher_is_better=False,
        all_per_s=[round(x, 1) for x in etcd_load],
    )
    print_result("store_cost", [row, load], reps=args.reps, quick=args.quick)


if __name__ == "__main__":
    main()
