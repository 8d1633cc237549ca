"""`taiji top`: the jobs running on this host, redrawn once a second in a plain terminal.

Each refresh asks every launcher in the job registry for its status over its control socket (as
`taiji status` does: no torch, a fraction of a second) and redraws one table: cluster size and
version, step, samples/s, batch, GNS, learning rate, step time, allreduce wait, straggler ratio,
failures. ``render`` is a pure function of the statuses; the loop only fetches and prints. Plain
text and two ANSI codes (home, clear), so it reads the same over ssh and in a log (``--once``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError, StoreError
from . import registry
from .control_socket import request

CLEAR = "\x1b[H\x1b[2J"

COLUMNS = (
    ("JOB", 11),
    ("SIZE", 9),
    ("VER", 4),
    ("STEP", 8),
    ("SAMPLES/S", 10),
    ("BATCH", 6),
    ("GNS", 8),
    ("LR", 9),
    ("STEP MS", 8),
    ("WAIT MS", 8),
    ("STRAGGLER", 9),
    ("FAIL", 4),
    ("AGE", 6),
)


def add_parser(sub: Any) -> None:
    top = sub.add_parser(
        "top",
        help="a live view of the jobs running on this host (refreshed every second)",
        usage="taiji top [--job ID] [--interval SECONDS] [--once]",
    )
    top.add_argument("--job", default=None, help="only this job (default: every job on this host)")
    top.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between refreshes (default: %(default)s)",
    )
    top.add_argument("--once", action="store_true", help="print one view and exit")


def _fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return str(int(value)) if spec == "d" else format(value * scale, spec)


def row(status: Mapping[str, Any], now: float) -> tuple[str, ...]:
    """One job's cells, from its launcher's status reply."""
    progress = status.get("progress") or {}
    workers = len(status.get("workers") or [])
    joining = len(status.get("joiners") or [])
    size = (
        f"{workers}"
        + (f"+{joining}" if joining else "")
        + (f"/{status['desired']}" if status.get("desired") not in (None, workers) else "")
    )
    age = now - progress["time"] if isinstance(progress.get("time"), (int, float)) else None
    return (
        str(status.get("job", "?")),
        size,
        f"v{status.get('version', '?')}",
        _fmt(progress.get("step"), "d"),
        _fmt(progress.get("samples_per_s"), ".0f"),
        _fmt(progress.get("batch_size"), "d"),
        _fmt(progress.get("gns"), ".0f"),
        _fmt(progress.get("lr"), ".3g"),
        _fmt(progress.get("step_s"), ".1f", 1000),
        _fmt(progress.get("allreduce_wait_s"), ".1f", 1000),
        _fmt(progress.get("straggler"), ".2f"),
        str(status.get("failures", "-")),
        "-" if age is None else f"{max(age, 0):.0f}s",
    )


def render(statuses: Sequence[Mapping[str, Any]], errors: Mapping[str, str], now: float) -> str:
    """The whole view: a title line, the table, then each job's hosts and busy workers."""
    lines = [
        f"taiji top — {len(statuses)} job(s) running, {time.strftime('%H:%M:%S', time.localtime(now))}"
        "  (SIZE: workers[+joining][/wanted]; AGE: of rank 0's last report; Ctrl-C quits)",
        "",
    ]
    lines.append(
        " ".join(f"{name:>{width}}" if i else f"{name:<{width}}" for i, (name, width) in enumerate(COLUMNS))
    )
    for status in statuses:
        cells = row(status, now)
        lines.append(
            " ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))
        )
    for status in statuses:
        hosts = status.get("hosts") or []
        notes = []
        if len(hosts) > 1:
            notes.append("hosts " + ", ".join(f"{h[0]} {h[2]}/{h[1]}" for h in hosts))
        if status.get("busy"):
            notes.append("busy: " + ", ".join(status["busy"]))
        if notes:
            lines.append(f"  {status.get('job')}: " + "; ".join(notes))
    for job, error in sorted(errors.items()):
        lines.append(f"  {job}: no answer ({error})")
    if not statuses and not errors:
        lines.append("  (no job is running on this host)")
    return "\n".join(lines) + "\n"


def snapshot(job: str | None) -> tuple[list[dict], dict[str, str]]:
    """Every running job's status (or only ``job``'s), and the jobs that did not answer."""
    registry.prune()
    entries = [e for e in registry.all_jobs() if job is None or e.job == job]
    statuses, errors = [], {}
    for entry in entries:
        try:
            statuses.append(request(registry.control_socket(entry.job), {"op": "status"}, timeout=0.5))
        except StoreError as exc:
            errors[entry.job] = str(exc)
    return statuses, errors


def main(args: argparse.Namespace, write: Callable[[str], Any] = sys.stdout.write) -> int:
    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, got {args.interval}")
    clear = CLEAR if sys.stdout.isatty() and not args.once else ""
    try:
        while True:
            started = time.monotonic()
            statuses, errors = snapshot(args.job)
            write(clear + render(statuses, errors, time.time()))
            sys.stdout.flush()
            if args.once:
                return 0
            time.sleep(max(args.interval - (time.monotonic() - started), 0.05))
    except KeyboardInterrupt:
        return 0
