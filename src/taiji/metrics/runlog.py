"""The run directory: rank 0's append-only record of metrics and events.

``metrics.jsonl`` holds one JSON object per logged step, ``events.jsonl`` one per event
(start, resize, failure, recovery, policy, strategy, pause, stop, end). A Job's step rows carry
``batch_size``, the decided global batch size, and ``samples``, what the step trained on (fewer
in an epoch's short last batch), which is what their ``samples_per_s`` counts. A ``pause`` event
is time outside training (``job.pause()``): ``time`` is when it began, ``seconds`` how long it
lasted, ``step`` the steps committed before it. Both files are opened in append mode and
flushed after every line, so a crash loses at most the line being written and the rank 0
that takes over after a failure continues the same files. ``read_jsonl`` reads them back,
tolerating the torn line such a crash can leave.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
PAUSE_EVENT = "pause"  # drawn as a span (time .. time + seconds), not as a line
EVENT_KINDS = ("start", "resize", "failure", "recovery", "policy", "strategy", PAUSE_EVENT, "stop", "end")


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by None and tensors/numpy scalars made plain.

    JSON has no NaN or infinity (``json.dumps`` would write the non-standard ``NaN``, which
    strict readers reject), and a diverging loss is exactly when the log must stay readable.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    # torch tensors and numpy scalars/arrays both offer tolist(); a 0-d one gives a number.
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_safe(tolist())
    return str(value)


def _dumps(record: dict[str, Any]) -> str:
    # allow_nan=False turns any NaN that slipped past json_safe into an error, not bad JSON.
    return json.dumps(json_safe(record), allow_nan=False, separators=(",", ":"))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All JSON objects in ``path``, one per line, skipping lines that do not parse.

    A crash mid-write leaves a torn last line; after a restart the next writer starts on a
    fresh line, so that fragment can also end up in the middle. Both are skipped (with a
    warning) rather than failing, since everything around them is intact.
    """
    with open(path, encoding="utf-8") as handle:
        return _objects(handle, path)


def last_recorded_step(run_dir: str | Path, tail_bytes: int = 1 << 16) -> int | None:
    """The highest step in the last ``tail_bytes`` of ``run_dir``'s metrics and events files
    (None when neither has one): how far a run that wrote there got, to within its metrics
    interval. Read before this run appends (a resumed run's ``resume`` event counts the steps it
    redoes with it)."""
    steps = [
        record.get("step")
        for name in (METRICS_FILE, EVENTS_FILE)
        for record in read_jsonl_ends(Path(run_dir) / name, head_bytes=0, tail_bytes=tail_bytes)[1]
    ]
    return max((step for step in steps if isinstance(step, int)), default=None)


def read_jsonl_ends(
    path: str | Path, head_bytes: int = 1 << 12, tail_bytes: int = 1 << 16
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the objects in the first ``head_bytes``, those in the last ``tail_bytes``) of ``path``, oldest
    first, without reading a long file whole (([], []) when it does not exist). A line either end
    cuts into, or a torn one (a crash mid-write), is skipped; the two lists overlap on a short file."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(head_bytes)
            size = handle.seek(0, 2)
            start = max(0, size - tail_bytes)
            handle.seek(start)
            tail = handle.read()
    except OSError:
        return [], []
    head_lines = head.decode("utf-8", errors="replace").splitlines(keepends=True)
    if len(head) < size and head_lines and not head_lines[-1].endswith("\n"):
        head_lines = head_lines[:-1]  # cut by head_bytes
    tail_lines = tail.decode("utf-8", errors="replace").splitlines()
    return _objects(head_lines), _objects(tail_lines[1:] if start else tail_lines)


def _objects(lines: Iterable[str], path: str | Path | None = None) -> list[dict[str, Any]]:
    """The JSON objects among ``lines``; the others are skipped, with a warning naming ``path``
    and the line when a path is given (a tail read starts mid-line: its first fragment is expected)."""
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if path is not None:
                log.warning(
                    "%s:%d: skipping a line that is not complete JSON (torn by a crash?)", path, number
                )
            continue
        if isinstance(record, dict):
            out.append(record)
        elif path is not None:
            log.warning("%s:%d: skipping a JSON value that is not an object", path, number)
    return out


def _open_for_append(path: Path) -> IO[str]:
    handle = open(path, "a", encoding="utf-8")
    # A previous writer that crashed mid-line left no trailing newline; start on a fresh line
    # so our first record is not glued onto its fragment (read_jsonl then skips the fragment).
    if path.stat().st_size > 0:
        with open(path, "rb") as check:
            check.seek(-1, 2)
            if check.read(1) != b"\n":
                handle.write("\n")
                handle.flush()
    return handle


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch raises ImportError when the tensorboard package is absent
        raise ConfigError(
            "RunLog(tensorboard=True) needs the 'tensorboard' package, which is not installed: "
            "run `pip install taiji[tensorboard]` (or `pip install tensorboard`), or pass "
            "tensorboard=False to write only the JSONL files"
        ) from exc
    return SummaryWriter


class RunLog:
    """Writes ``metrics.jsonl`` and ``events.jsonl`` (and optionally TensorBoard scalars).

    Used by rank 0 only. Thread-safe, so a background monitor may log events while the
    training loop logs metrics.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False) -> None:
        self.run_dir = Path(run_dir)
        # Check the optional dependency before creating anything, so a misconfigured run
        # leaves no half-made directory behind.
        writer_class = _summary_writer_class() if tensorboard else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.events_path = self.run_dir / EVENTS_FILE
        # TensorBoard is a viewing aid, not the record: its own periodic flush is enough.
        self._tensorboard = (
            writer_class(log_dir=str(self.run_dir / "tensorboard"), flush_secs=10) if writer_class else None
        )
        self._lock = threading.Lock()
        self._metrics = _open_for_append(self.metrics_path)
        self._events = _open_for_append(self.events_path)
        self.closed = False

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one step's metrics. ``step`` is required; ``time`` defaults to now."""
        if "step" not in record:
            raise ConfigError(
                f"RunLog.log_metrics: the record has no 'step' key (keys: "
                f"{sorted(record)}); pass the committed step number"
            )
        given_time = record.get("time")
        line = json_safe({**record, "time": time.time() if given_time is None else given_time})
        line["time"], line["step"] = float(line["time"]), int(line["step"])
        # Put time and step first so the files read naturally with `head` or `jq`.
        line = {"time": line.pop("time"), "step": line.pop("step"), **line}
        self._write(self._metrics, line)
        if self._tensorboard is not None:
            for key, value in line.items():
                if (
                    key not in ("time", "step")
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):  # json_safe already removed NaN/inf
                    self._tensorboard.add_scalar(f"taiji/{key}", value, line["step"], walltime=line["time"])

    def log_event(self, kind: str, step: int, **details: Any) -> None:
        """Append one event, e.g. ``log_event("resize", 120, size=3, old_size=2)``."""
        if not kind:
            raise ConfigError(
                f"RunLog.log_event: kind must be a non-empty string such as one of {EVENT_KINDS}"
            )
        if kind not in EVENT_KINDS:
            log.debug("event kind %r is not one of the standard kinds %s", kind, EVENT_KINDS)
        # Details may carry their own 'time' (e.g. when the event happened, not when logged).
        event_time = float(details.pop("time", None) or time.time())
        line = {"time": event_time, "kind": kind, "step": int(step), **details}
        self._write(self._events, line)
        if self._tensorboard is not None:
            self._tensorboard.add_text("taiji/events", _dumps(line), int(step), walltime=float(line["time"]))

    def _write(self, handle: IO[str], line: dict[str, Any]) -> None:
        text = _dumps(line) + "\n"
        with self._lock:
            if self.closed:
                raise ConfigError(f"RunLog for {self.run_dir} is closed; create a new one to keep logging")
            handle.write(text)
            handle.flush()  # a crash right after must not lose this line

    def close(self) -> None:
        """Close the files (idempotent)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._metrics.close()
            self._events.close()
            if self._tensorboard is not None:
                self._tensorboard.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunLog({str(self.run_dir)!r}{', closed' if self.closed else ''})"
