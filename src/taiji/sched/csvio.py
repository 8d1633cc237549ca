"""Reading the scheduler's CSV inputs, plain or gzip-compressed, with line numbers for errors.

The shipped Pollux data lives in ``taiji/sched/data`` as ``*.csv.gz``; users may pass their own
plain ``.csv`` files. Every reader error names the file and the 1-based line, so a bad row in a
160-job trace is found at once.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from taiji.errors import ConfigError

try:  # Python >= 3.11; importlib.abc keeps it until 3.13 for 3.10
    from importlib.resources.abc import Traversable
except ImportError:  # pragma: no cover
    from importlib.abc import Traversable

Source = str | Path | Traversable


@dataclass(frozen=True)
class Row:
    """One data row: its 1-based line number in the file and its fields by column name."""

    line: int
    fields: dict[str, str]


def data_root() -> Traversable:
    """The package's data directory (works from a wheel or a source checkout)."""
    return resources.files("taiji.sched").joinpath("data")


def read_text(source: Source) -> str:
    """The decompressed text of ``source``; ``.gz`` files are gunzipped."""
    path = Path(source) if isinstance(source, str) else source
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc})") from exc
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw.decode("ascii", errors="replace")


def read_rows(source: Source, required: tuple[str, ...]) -> Iterator[Row]:
    """The rows of a headed CSV; raises ConfigError naming the file if a required column is missing
    and naming the line if a row has the wrong number of fields. Blank lines are skipped."""
    reader = csv.reader(io.StringIO(read_text(source)))
    header = next(reader, None)
    if header is None:
        raise ConfigError(f"{source}: empty file, expected a header with {','.join(required)}")
    header = [name.strip() for name in header]
    missing = [name for name in required if name not in header]
    if missing:
        raise ConfigError(
            f"{source}:1: header lacks column(s) {', '.join(missing)} (expected {','.join(required)})"
        )
    for values in reader:
        line = reader.line_num
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise ConfigError(
                f"{source}:{line}: {len(values)} fields, expected {len(header)} ({','.join(header)})"
            )
        yield Row(line, {name: value.strip() for name, value in zip(header, values)})


def parse_number(source: Source, row: Row, column: str, kind: type = float) -> float:
    """``row[column]`` as ``kind`` (int or float); ConfigError naming file, line and column if not."""
    text = row.fields[column]
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(
            f"{source}:{row.line}: column {column!r} is {text!r}, "
            f"expected {'an integer' if kind is int else 'a number'}"
        ) from None
    if kind is float and not value == value:  # NaN never makes sense in these traces
        raise ConfigError(f"{source}:{row.line}: column {column!r} is NaN")
    return value
