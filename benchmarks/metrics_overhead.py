"""What serving Prometheus metrics costs a job: samples/s with `--metrics-port` scraped every second
vs the same job without it.

``taiji run -np 2`` on ``_elastic_train.py`` (the MLP of ``benchmarks/elastic.py``), once with
``--metrics-port`` and a scraper fetching ``/metrics`` every second (as a Prometheus server with a
1 s scrape interval would), once without, in alternating order per repetition. The figure is
rank 0's samples/s over the measured steps (all of them, from the first measured commit to the
last: a once-a-second stall counts, which a median step would hide), paired per repetition.
Rank 0's status record (written to the store at least once a second) is there on both sides.
On a loaded machine samples/s varies by far more than 0.5% between runs; the launcher's CPU share
over the measured steps (``/proc``), which is where serving and scraping run, bounds the cost:
the workers' processes do nothing different on the two sides.

    .venv/bin/python benchmarks/metrics_overhead.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from taiji_harness.bench import (
    contract_row,
    free_port,
    interleaved,
    median,
    paired_ratio,
    print_result,  # noqa: E402
    reap_on_sigterm,
)
from taiji_harness.elastic_runs import LaunchedJob, StepLog, steady_commits, steady_options, train_args  # noqa: E402

SIDES = ("metrics", "plain")


class Scraper:
    """Fetches http://127.0.0.1:PORT/metrics every ``interval`` seconds on a thread; counts the
    scrapes that returned the job's step series."""

    def __init__(self, port: int, interval: float = 1.0):
        self.url, self.interval = f"http://127.0.0.1:{port}/metrics", interval
        self.ok = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                text = urllib.request.urlopen(self.url, timeout=2).read().decode()
                self.ok += "taiji_job_step{" in text
            except OSError:
                self.failed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args: argparse.Namespace, side: str, out: Path) -> tuple[float, int, float]:
    """Rank 0's samples/s over the measured steps, the scrapes that saw the job's series, and the
    launcher's CPU share over the measured steps (what serving the metrics adds shows there)."""
    log = StepLog(out, "taiji")
    port = free_port()
    metrics = ["--metrics-port", str(port)] if side == "metrics" else []
    cmd = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        *metrics,
        "--job-id",
        f"mo{os.getpid()}{side}",
        "--run-dir",
        str(out / "run"),
        "--",
        *train_args(args, out, "--max-steps", str(args.warm + args.steps)),
    ]
    job = LaunchedJob(f"taiji-{side}", cmd, out, dict(os.environ, TAIJI_HOME=str(out / "home")), log)
    scraper = Scraper(port) if side == "metrics" else None
    marks: dict[str, tuple[float, float]] = {}
    try:
        commits = steady_commits(
            args,
            job,
            log,
            lambda mark: marks.setdefault(mark, (time.monotonic(), cpu_seconds(job.session.pid))),
        )
        seconds = commits[-1]["time"] - commits[0]["time"]
        (t0, cpu0), (t1, cpu1) = marks["warm"], marks["end"]
        return (
            (len(commits) - 1) * args.batch / seconds,
            (scraper.ok if scraper else 0),
            (cpu1 - cpu0) / (t1 - t0),
        )
    finally:
        if scraper is not None:
            scraper.close()
        job.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 300 steps")
    args = steady_options(parser, 300, 1500, 240.0, argv)
    reap_on_sigterm()
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print(
            "# metrics_overhead: prometheus_client missing (pip install -e '.[metrics]'); nothing measured",
            file=sys.stderr,
        )
        print_result("metrics_overhead", [], skipped="prometheus_client missing")
        return
    base = Path(tempfile.mkdtemp(prefix="taiji-metrics-overhead-"))
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    launcher_cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    scrapes: list[int] = []
    try:
        for rep in range(args.reps):
            for side in interleaved(list(SIDES), rep):
                out = base / f"{side}-{rep}"
                out.mkdir()
                rate, seen, cpu = run(args, side, out)
                rates[side].append(rate)
                launcher_cpu[side].append(cpu)
                scrapes += [seen] if side == "metrics" else []
                print(
                    f"# rep {rep} {side}: {rate:.0f} samples/s, launcher CPU {100 * cpu:.2f}%"
                    + (f", {seen} scrapes" if side == "metrics" else ""),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # costs (seconds per sample) paired per repetition: the ratio is metrics' samples/s over plain's
    ratio = paired_ratio([1 / r for r in rates["metrics"]], [1 / r for r in rates["plain"]])
    row = contract_row(
        "samples/s, metrics served and scraped every second vs none (2 workers, MLP)",
        round(median(rates["metrics"]), 1),
        round(median(rates["plain"]), 1),
        higher_is_better=True,
        ratio=ratio,
        metrics_all=[round(r, 1) for r in rates["metrics"]],
        plain_all=[round(r, 1) for r in rates["plain"]],
        scrapes=scrapes,
        cost_pct=round((1 / ratio - 1) * 100, 2),
        target_cost_pct=0.5,
        launcher_cpu_pct_metrics=[round(100 * c, 2) for c in launcher_cpu["metrics"]],
        launcher_cpu_pct_plain=[round(100 * c, 2) for c in launcher_cpu["plain"]],
    )
    print(
        f"# metrics vs none: {row['taiji']} vs {row['anchor']} samples/s, cost {row['cost_pct']}%",
        file=sys.stderr,
    )
    print_result("metrics_overhead", [row], reps=args.reps, quick=args.quick)


if __name__ == "__main__":
    main()
