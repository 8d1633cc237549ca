"""The Benchmarks page's figures, rendered at build time from benchmarks/results/*.json
(generated_pages.py). One section per benchmark: what it measures (the first paragraph of the
script's docstring), when, at which commit, on which machine and by which command the figures
were taken, and a table of the result line's rows. The files are written by the benchmarks themselves
(``taiji_harness.results``), so the page shows the latest recorded run of each.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from taiji_harness import results

DETAILS = ("unit", "target", "target_met")  # row fields worth a column where any row has them


def summary(benchmark: str) -> str:
    """The first paragraph of the benchmark script's docstring, on one line."""
    script = results.REPO / "benchmarks" / f"{benchmark}.py"
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def value(x) -> str:
    """A cell: numbers as they were recorded, lists and dicts as compact JSON."""
    if x is None:
        return "–"
    if isinstance(x, (list, dict)):
        x = json.dumps(x, separators=(", ", ": "))
    return " ".join(str(x).split()).replace("|", "\\|")


def provenance(entry: dict) -> str:
    load = entry.get("load_average")
    if isinstance(load, list):  # measured: 1, 5 and 15 minutes; transcribed: as recorded
        load = " / ".join(map(str, load)) + " (1 / 5 / 15 min)"
    lines = [
        f"- **Date** {entry['date']}, **commit** `{entry['commit'] or 'unknown'}`",
        f"- **Machine** {entry['machine']}" + (f"; load average: {load}" if load else ""),
        f"- **Command** `{entry['command']}`",
    ]
    if entry["source"] == "transcribed":
        lines.append(
            f"- Transcribed from the written record {entry.get('record', 'benchmarks/README.md')} "
            "(figures from a run before the benchmark recorded its own results)"
        )
    return "\n".join(lines)


def settings(result: dict) -> str:
    """The result line's scalar settings (reps, quick, ...), on one line."""
    scalars = {
        k: v
        for k, v in result.items()
        if k not in ("benchmark", "rows") and isinstance(v, (int, float, str, bool))
    }
    return ", ".join(f"`{k}={v}`" for k, v in scalars.items())


def table(rows: list[dict]) -> str:
    details = [key for key in DETAILS if any(key in row for row in rows)]
    head = ["case", "taiji", "anchor", "ratio", *details]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(value(row.get(key)) for key in head) + " |" for row in rows]
    return "\n".join(out)


def section(entry: dict) -> str:
    result = entry["result"]
    variant = entry.get("variant") or (
        f"--cases {entry['cases'].replace('+', ',')}" if entry.get("cases") else ""
    )
    title = entry["benchmark"] + (f" (`{variant}`)" if variant else "")
    parts = [f"## {title}", summary(entry["benchmark"]), provenance(entry), table(result["rows"])]
    if settings(result):
        parts.append(f"Settings: {settings(result)}")
    return "\n\n".join(parts) + "\n"


def render(where: Path = results.RESULTS_DIR) -> str:
    """Every recorded benchmark, alphabetically."""
    entries = results.load_all(where)
    if not entries:
        raise ValueError(f"no benchmark results in {where}")
    return "\n".join(section(entry) for entry in entries)
