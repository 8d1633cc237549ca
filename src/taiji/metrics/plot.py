"""A run's timeline PNG: cluster size, batch size, GNS, throughput and loss over wall time.

Events (resizes, failures, recoveries, policy decisions) are vertical lines across all panels,
labelled in a narrow band above them; pauses (``job.pause()``) are shaded spans. The batch panel
shows the decided batch size, with an epoch's short last batch as a marker, not a change of size.
``timeline`` computes what is drawn, as data; ``plot_run`` draws it. The figure is drawn with matplotlib's
object API on an Agg canvas: no pyplot, so the caller's global backend (a notebook's, say) is neither needed
nor changed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .runlog import EVENTS_FILE, METRICS_FILE, PAUSE_EVENT, read_jsonl

Series = tuple[list[float], list[float]]  # (seconds since the run's first record, value)
Span = tuple[float, float]  # (start, end) in seconds since the first record

# Kinds drawn as event lines, with their colour and line style. Start/stop/end only bracket
# the run, so they are drawn faint and unlabelled.
EVENT_STYLE: dict[str, tuple[str, str]] = {
    "resize": ("tab:blue", "--"),
    "failure": ("tab:red", "-"),
    "recovery": ("tab:green", "-."),
    "policy": ("tab:purple", ":"),
    "strategy": ("tab:brown", "-"),
}
BRACKET_KINDS = ("start", "stop", "end")
OTHER_STYLE = ("tab:gray", ":")
LABEL_LEVELS = 3  # staggered heights for event labels that are close in time
LABEL_CHAR_WIDTH = 0.0068  # width of one 8 pt character as a fraction of the time axis
LABEL_PRIORITY = ("failure", "recovery", "resize", "strategy", "policy")
MAX_LABELS_PER_KIND = 12
PAUSE_FACTOR = 5  # a gap this many times the recent step time is a pause, not a step
PAUSE_WINDOW = 20  # how many recent gaps define "the recent step time"
PAUSE_STYLE = {"color": "0.55", "alpha": 0.25, "linewidth": 0}
SHORT_BATCH_STYLE = {"linestyle": "none", "marker": "v", "markersize": 4, "color": "tab:gray"}
PANELS = (  # metrics key, title, y label, colour; top to bottom
    ("size", "cluster size", "workers", "tab:blue"),
    ("batch_size", "global batch size", "samples", "tab:cyan"),
    ("gns", "gradient noise scale (B_noise = tr Σ / |G|²)", "B_noise", "tab:orange"),
    ("samples_per_s", "throughput", "samples/s", "tab:green"),
    ("allreduce_wait_ms", "wait for the gradients' allreduce after backward", "ms", "tab:purple"),
    ("loss", "training loss", "loss", "tab:brown"),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Timeline:
    """What the panels draw, as data (so it is testable without drawing)."""

    series: dict[str, Series]  # PANELS key -> its points
    pauses: list[Span]  # recorded pauses (``pause`` events): shaded
    breaks: list[Span]  # where lines must not bridge: the pauses and unrecorded gaps
    short_batches: Series  # (time, samples) of steps that trained on less than the decided batch
    steps: tuple[int, int] | None  # the first and last logged step


def _series(records: list[dict[str, Any]], key: str, t0: float) -> Series:
    """(seconds since t0, value) for records whose ``key`` is a finite number."""
    points = [(float(r["time"]) - t0, float(r[key])) for r in records if _is_number(r.get(key))]
    return [x for x, _ in points], [y for _, y in points]


def _gaps_before(times: list[float]) -> list[int]:
    """Indices ``i`` with no record between ``times[i - 1]`` and ``times[i]`` for much longer
    than the steps just before (a failure, a long state sync, user code outside
    ``job.pause()``). Judged against the recent step time, since that changes with batch size."""
    ends: list[int] = []
    gaps = [b - a for a, b in zip(times, times[1:])]
    for i, gap in enumerate(gaps):
        recent = sorted(gaps[max(i - PAUSE_WINDOW, 0) : i]) or sorted(gaps)
        if gap > PAUSE_FACTOR * recent[len(recent) // 2]:
            ends.append(i + 1)
    return ends


def _recorded_pauses(events: list[dict[str, Any]], t0: float) -> list[Span]:
    return [
        (float(e["time"]) - t0, float(e["time"]) - t0 + float(e["seconds"]))
        for e in events
        if e.get("kind") == PAUSE_EVENT and _is_number(e.get("seconds"))
    ]


def _throughput(metrics: list[dict[str, Any]], gaps_before: list[int], t0: float) -> Series:
    """samples/s, leaving out a row whose step was timed across an unrecorded gap (its rate is
    the gap's length, not training; a step after a recorded pause was timed from its end)."""
    gap_seconds = {i: float(metrics[i]["time"]) - float(metrics[i - 1]["time"]) for i in gaps_before}
    points: list[tuple[float, float]] = []
    for i, record in enumerate(metrics):
        rate, samples = record.get("samples_per_s"), record.get("samples", record.get("batch_size"))
        if not _is_number(rate):
            continue
        if i in gap_seconds and not (
            _is_number(samples) and rate > 0 and samples / rate < gap_seconds[i] / 2
        ):
            continue
        points.append((float(record["time"]) - t0, float(rate)))
    return [x for x, _ in points], [y for _, y in points]


def _short_batches(metrics: list[dict[str, Any]], t0: float) -> Series:
    """Steps that trained on fewer samples than the decided batch size (an epoch's last batch)."""
    points = [
        (float(r["time"]) - t0, float(r["samples"]))
        for r in metrics
        if _is_number(r.get("samples")) and _is_number(r.get("batch_size")) and r["samples"] < r["batch_size"]
    ]
    return [x for x, _ in points], [y for _, y in points]


def timeline(metrics: list[dict[str, Any]], events: list[dict[str, Any]], t0: float) -> Timeline:
    """The panels' series, pauses and line breaks from a run's records (metrics in time order)."""
    times = [float(r["time"]) - t0 for r in metrics]
    gaps_before = _gaps_before(times)
    pauses = _recorded_pauses(events, t0)
    series = {key: _series(metrics, key, t0) for key, *_ in PANELS}
    series["samples_per_s"] = _throughput(metrics, gaps_before, t0)
    if series["size"][0]:  # event sizes refine a logged series; alone they'd be a guess
        # Stable sort with events last: an event at the same time as a record comes after
        # it (events happen at the boundary after the step that was logged), so it wins.
        points = sorted([*zip(*series["size"]), *_size_changes(events, t0)], key=lambda p: p[0])
        series["size"] = ([x for x, _ in points], [y for _, y in points])
    steps = [int(r["step"]) for r in metrics if isinstance(r.get("step"), int)]
    return Timeline(
        series,
        pauses,
        sorted(pauses + [(times[i - 1], times[i]) for i in gaps_before]),
        _short_batches(metrics, t0),
        (min(steps), max(steps)) if steps else None,
    )


def _gapped(xs: list[float], ys: list[float], breaks: list[Span], window: int = 1) -> Series:
    """The series with a NaN (left blank by matplotlib) where a break ended between two points,
    so lines do not bridge time without training; ``window > 1`` gives a moving average that
    restarts after a break."""
    out_x: list[float] = []
    out_y: list[float] = []
    segment: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i and any(xs[i - 1] < end <= x for _, end in breaks):
            out_x.append((xs[i - 1] + x) / 2)
            out_y.append(math.nan)
            segment = []
        segment.append(y)
        recent = segment[-window:]
        out_x.append(x)
        out_y.append(sum(recent) / len(recent))
    return out_x, out_y


def _size_changes(events: list[dict[str, Any]], t0: float) -> list[tuple[float, float]]:
    """(time, new size) from resize and recovery events: the cluster has that size from the
    event on, before the first step at the new size is logged (which may be seconds later)."""
    return [
        (float(e["time"]) - t0, float(e["size"]))
        for e in events
        if e.get("kind") in ("resize", "recovery") and isinstance(e.get("size"), int)
    ]


def _no_data(ax: Any, what: str) -> None:
    ax.text(
        0.5,
        0.5,
        f"no data ({what} not logged)",
        transform=ax.transAxes,
        ha="center",
        va="center",
        color="gray",
        fontsize=10,
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9},
    )


def _step_panel(ax: Any, xs: list[float], ys: list[float], colour: str) -> None:
    ax.step(xs, ys, where="post", color=colour, linewidth=2)
    lo, hi = min(ys), max(ys)
    pad = max((hi - lo) * 0.25, 0.5 if hi < 20 else hi * 0.1)
    ax.set_ylim(max(lo - pad, 0), hi + pad)


def _batch_panel(ax: Any, decided: Series, short_batches: Series, colour: str) -> None:
    """The decided batch size as the line; an epoch's short last batch is a marker beneath it,
    since the next step trains on the decided size again."""
    _step_panel(ax, *decided, colour)
    if short_batches[0]:
        ax.plot(*short_batches, **SHORT_BATCH_STYLE, label="short last batch of an epoch")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8, framealpha=0.8)


def _draw_pauses(axes: list[Any], pauses: list[Span]) -> None:
    """Shade each recorded pause on every axis; the first axis's first span names it."""
    for ax in axes:
        for i, (start, end) in enumerate(pauses):
            ax.axvspan(start, end, **PAUSE_STYLE, label="pause" if ax is axes[0] and not i else None)


def _gns_panel(ax: Any, xs: list[float], ys: list[float], breaks: list[Span], colour: str) -> None:
    positive = sorted(y for y in ys if y > 0)
    # A log axis suits B_noise growing over orders of magnitude, but it cannot show the
    # non-positive values the unbiased estimator gives when it is noisy, and a few outliers
    # near zero must not trigger it: require almost all values positive and a robust span.
    if len(positive) >= 0.95 * len(ys):
        low, high = positive[len(positive) // 20], positive[-1 - len(positive) // 20]
        if high > 10 * low:
            ax.set_yscale("log")
            pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    ax.plot(*_gapped(xs, ys, breaks), color=colour, linewidth=1, marker=".", markersize=3)


def _noisy_panel(ax: Any, xs: list[float], ys: list[float], breaks: list[Span], colour: str) -> None:
    """Raw values faintly, plus a moving average so the trend reads through the noise."""
    ax.plot(*_gapped(xs, ys, breaks), color=colour, linewidth=0.8, alpha=0.35)
    window = max(len(ys) // 40, 1)
    if window > 1:
        ax.plot(*_gapped(xs, ys, breaks, window), color=colour, linewidth=1.8, label=f"mean of {window}")
        ax.legend(loc="upper right", fontsize=8, framealpha=0.8)


def _short_decision(text: str) -> str:
    """``SetBatchSize(batch_size=632)`` -> ``SetBatchSize(632)``: the value is what matters."""
    return re.sub(r"\b\w+=", "", text)


def _event_label(event: dict[str, Any]) -> str:
    kind = event["kind"]
    if kind == "resize" and event.get("size") is not None:
        text = f"resize→{event['size']}"
    elif kind == "policy" and event.get("decision"):
        text = f"policy: {_short_decision(str(event['decision']))[:24]}"
    elif kind == "strategy" and event.get("strategy"):
        text = f"strategy→{event['strategy']}"
    else:
        text = kind
    return f"{text} @{event['step']}" if isinstance(event.get("step"), int) else text


def _label_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events to label, most important kinds first so they get a slot when labels are crowded.
    A kind with very many events (a policy deciding every few steps) is left to the legend."""
    counts = Counter(e["kind"] for e in events)
    rank = {kind: i for i, kind in enumerate(LABEL_PRIORITY)}
    wanted = [e for e in events if counts[e["kind"]] <= MAX_LABELS_PER_KIND]
    return sorted(wanted, key=lambda e: (rank.get(e["kind"], len(rank)), float(e["time"])))


def _draw_events(band: Any, axes: list[Any], events: list[dict[str, Any]], t0: float, span: float) -> None:
    """Vertical lines on every panel; labels in the narrow ``band`` above them."""
    events = [{**e, "kind": str(e.get("kind", "?"))} for e in events]
    seen_kinds: set[str] = set()
    for event in sorted(events, key=lambda e: float(e["time"])):
        kind = event["kind"]
        bracket = kind in BRACKET_KINDS
        colour, style = EVENT_STYLE.get(kind, OTHER_STYLE)
        # One legend entry per kind: only the first line of each carries the label.
        legend = kind if kind not in seen_kinds and not bracket else None
        seen_kinds.add(kind)
        for ax in [band, *axes]:
            ax.axvline(
                float(event["time"]) - t0,
                color=colour,
                linestyle=style,
                linewidth=1.0 if bracket else 1.4,
                alpha=0.35 if bracket else 0.85,
                label=legend if ax is band else None,
            )
    # Labels that would overlap go on different rows of the band; one that fits on no row
    # is dropped (its line and the legend colour still tell the kind).
    placed: list[list[tuple[float, float]]] = [[] for _ in range(LABEL_LEVELS)]
    for event in _label_order([e for e in events if e["kind"] not in BRACKET_KINDS]):
        x = float(event["time"]) - t0
        label = _event_label(event)
        width = (len(label) + 2) * LABEL_CHAR_WIDTH * span
        # Right of its line, unless that would run past the right edge.
        right_aligned = x + width > span * 1.01
        extent = (x - width, x) if right_aligned else (x, x + width)
        level = next(
            (
                i
                for i in range(LABEL_LEVELS)
                if all(extent[1] <= lo or hi <= extent[0] for lo, hi in placed[i])
            ),
            None,
        )
        if level is None:
            continue
        placed[level].append(extent)
        band.text(
            x,
            0.8 - 0.3 * level,
            f" {label} ",
            fontsize=8,
            va="center",
            color=EVENT_STYLE.get(event["kind"], OTHER_STYLE)[0],
            ha="right" if right_aligned else "left",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 0.5},
        )


def _load_run(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(metrics, events) with a numeric time each, metrics in time order."""
    metrics_path, events_path = run_dir / METRICS_FILE, run_dir / EVENTS_FILE
    if not run_dir.is_dir():
        raise ConfigError(
            f"plot: run directory {run_dir} does not exist; expected the directory "
            f"a run wrote with RunLog, containing {METRICS_FILE}"
        )
    if not metrics_path.is_file():
        raise ConfigError(
            f"plot: {metrics_path} not found; expected {METRICS_FILE} (and "
            f"optionally {EVENTS_FILE}) written by RunLog in {run_dir}"
        )
    metrics = [r for r in read_jsonl(metrics_path) if isinstance(r.get("time"), (int, float))]
    # Records are appended in time order, but a new rank 0 after a failure runs on another
    # host's clock; sorting keeps a small skew from drawing the lines backwards.
    metrics.sort(key=lambda r: float(r["time"]))
    events = (
        [e for e in read_jsonl(events_path) if isinstance(e.get("time"), (int, float))]
        if events_path.is_file()
        else []
    )
    if not metrics and not events:
        raise ConfigError(f"plot: {metrics_path} holds no records with a 'time'; nothing to plot")
    return metrics, events


def _draw_panels(axes: list[Any], data: Timeline) -> None:
    for ax, (key, title, ylabel, colour) in zip(axes, PANELS):
        xs, ys = data.series[key]
        if not xs:
            _no_data(ax, key)
        elif key == "size":
            _step_panel(ax, xs, ys, colour)
        elif key == "batch_size":
            _batch_panel(ax, (xs, ys), data.short_batches, colour)
        elif key == "gns":
            _gns_panel(ax, xs, ys, data.breaks, colour)
        else:
            _noisy_panel(ax, xs, ys, data.breaks, colour)
        if key == "loss" and data.steps:
            title += f" — steps {data.steps[0]}..{data.steps[1]}"
        ax.set_title(title, loc="left", fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("wall time since start (s)")


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the run's timeline PNG (default ``run_dir/timeline.png``) and return its path."""
    run_dir = Path(run_dir)
    metrics, events = _load_run(run_dir)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ConfigError("plot: matplotlib is not installed; run `pip install taiji[plot]`") from exc
    times = [float(r["time"]) for r in metrics + events]
    t0 = min(times)
    span = max(max(times) - t0, 1.0)  # a one-record run still gets a usable axis

    figure = Figure(figsize=(10, 12.5), dpi=110)
    FigureCanvasAgg(figure)  # attaches the Agg canvas explicitly; savefig then renders with it
    marked = [e for e in events if e.get("kind") not in BRACKET_KINDS]
    # A narrow band on top holds the event labels, so they never cover data.
    ratios = [0.45] * bool(marked) + [1.0] * len(PANELS)
    axes = list(figure.subplots(len(ratios), 1, sharex=True, height_ratios=ratios))
    band = axes.pop(0) if marked else None
    data = timeline(metrics, events, t0)
    _draw_panels(axes, data)
    _draw_pauses([*([band] if band is not None else []), *axes], data.pauses)
    lines = [e for e in events if e.get("kind") != PAUSE_EVENT]
    for ax in axes[:2]:  # worker counts and batch sizes are whole numbers
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    axes[-1].set_xlim(-0.01 * span, span * 1.01)
    if band is not None:
        _draw_events(band, axes, lines, t0, span)
        band.set(ylim=(0, 1), yticks=[])
        band.tick_params(axis="x", length=0)
        for side in ("left", "right", "top"):
            band.spines[side].set_visible(False)
        band.set_title("events (label @step)", loc="left", fontsize=10)
        # Above the band, so the legend never hides data or event labels.
        band.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=8, frameon=False)
    else:
        _draw_events(axes[0], axes[1:], lines, t0, span)  # only faint start/end lines
    figure.suptitle(
        f"taiji run {run_dir.resolve().name}: {len(metrics)} records, {len(events)} events, {span:.0f} s",
        fontsize=12,
        x=0.01,
        ha="left",
    )
    figure.tight_layout()

    output = Path(output) if output is not None else run_dir / "timeline.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    return output
