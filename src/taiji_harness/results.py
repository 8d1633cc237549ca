"""Benchmark results as data: ``benchmarks/results/<benchmark>.json``, one file per benchmark.

Every benchmark's result line (``bench.print_result``) is also written there, with where it came
from: the date (UTC), the commit, the machine, its load average and the command. The docs'
Benchmarks page is rendered from these files at build time (``docs/hooks/benchmarks.py``), so the
figures in the docs are always those of the latest run; earlier runs stay in git's history.

``TAIJI_BENCH_RESULTS`` names another directory to write to; empty, nothing is recorded (the
tests set it). A result without rows (a benchmark that skipped, saying why) is not recorded: it
would replace figures with nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "benchmarks" / "results"
RESULTS_ENV = "TAIJI_BENCH_RESULTS"
SOURCES = ("run", "transcribed")  # measured by this code, or copied from a dated written record


def results_dir() -> Path | None:
    """Where results are written: ``$TAIJI_BENCH_RESULTS`` if set (empty: nowhere), else
    ``benchmarks/results``."""
    value = os.environ.get(RESULTS_ENV)
    if value is None:
        return RESULTS_DIR
    return Path(value) if value else None


def commit() -> str | None:
    """The checkout's short commit, ``+`` if it has uncommitted changes; None outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPUs, CPU model, OS, Python and torch versions, and the GPU where the run
    (a process that imported torch) could use one."""
    try:
        torch = f", torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = ""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_available():
        torch += f", {cuda.device_count()} x {cuda.get_device_name(0)}"
    return (
        f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}{torch}"
    )


def command(argv: list[str]) -> str:
    """The command that ran, with the script's path relative to the repository where it lies there."""
    script = Path(argv[0]).resolve() if argv else None
    if script is not None and script.is_file() and script.is_relative_to(REPO):
        argv = [str(script.relative_to(REPO)), *argv[1:]]
    return shlex.join(["python", *argv])


def selection(argv: list[str]) -> str:
    """The cases a run was limited to (``--cases a,b``: ``a+b``; "" for a run of the default
    cases): a run of some cases is recorded beside, not over, a run of others."""
    for i, arg in enumerate(argv):
        value = (
            arg.split("=", 1)[1]
            if arg.startswith("--cases=")
            else argv[i + 1]
            if arg == "--cases" and i + 1 < len(argv)
            else None
        )
        if value is not None:
            return "+".join(sorted(c.strip() for c in value.split(",") if c.strip()))
    return ""


def record(result: dict, argv: list[str] | None = None) -> Path | None:
    """Write one result (the parsed result line) with its provenance; returns the file, or None
    when recording is off or the result has no rows. The file is ``<benchmark>.json``, or
    ``<benchmark>.<cases>.json`` for a run limited by ``--cases``, or ``<benchmark>.<variant>.json``
    for a result that names its ``variant`` (a run on other hardware, say)."""
    where = results_dir()
    if where is None or not result.get("rows"):
        return None
    argv = sys.argv if argv is None else argv
    entry = {
        "benchmark": result["benchmark"],
        "source": "run",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "command": command(argv),
        "result": result,
    }
    cases = selection(argv[1:]) or result.get("variant", "")
    if result.get("variant"):
        entry["variant"] = result["variant"]
    elif cases:
        entry["cases"] = cases
    where.mkdir(parents=True, exist_ok=True)
    path = where / (f"{result['benchmark']}.{cases}.json" if cases else f"{result['benchmark']}.json")
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(entry, indent=1) + "\n")
    temporary.replace(path)
    return path


def load_all(where: Path = RESULTS_DIR) -> list[dict]:
    """Every recorded result, by benchmark name; raises ValueError naming a malformed file."""
    entries = []
    for path in sorted(where.glob("*.json")):
        entry = json.loads(path.read_text())
        missing = [
            key
            for key in ("benchmark", "source", "date", "commit", "machine", "command", "result")
            if key not in entry
        ]
        if missing or entry["source"] not in SOURCES or entry["benchmark"] != path.stem.split(".")[0]:
            raise ValueError(
                f"{path}: not a benchmark result (missing {missing}, source {entry.get('source')!r})"
            )
        entries.append(entry)
    return entries
