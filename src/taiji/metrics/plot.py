"""A run's timeline PNG: cluster size, batch size, GNS, throughput and loss over wall time.

Events (resizes, failures, recoveries, policy decisions) are vertical lines across all panels,
labelled in a narrow band above them. The figure is drawn with matplotlib's object API on an
Agg canvas: no pyplot, so the caller's global backend (a notebook's, say) is neither needed
nor changed.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .runlog import EVENTS_FILE, METRICS_FILE, read_jsonl

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
LABEL_LEVELS = 3            # staggered heights for event labels that are close in time
LABEL_CHAR_WIDTH = 0.0068   # width of one 8 pt character as a fraction of the time axis
LABEL_PRIORITY = ("failure", "recovery", "resize", "strategy", "policy")
MAX_LABELS_PER_KIND = 12
PAUSE_FACTOR = 5            # a gap this many times the recent step time is a pause, not a step
PAUSE_WINDOW = 20           # how many recent gaps define "the recent step time"
PANELS = (  # metrics key, title, y label, colour; top to bottom
    ("size", "cluster size", "workers", "tab:blue"),
    ("batch_size", "global batch size", "samples", "tab:cyan"),
    ("gns", "gradient noise scale (B_noise = tr Σ / |G|²)", "B_noise", "tab:orange"),
    ("samples_per_s", "throughput", "samples/s", "tab:green"),
    ("loss", "training loss", "loss", "tab:brown"),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _series(records: list[dict[str, Any]], key: str, t0: float) -> tuple[list[float], list[float]]:
    """(seconds since t0, value) for records whose ``key`` is a finite number."""
    points = [(float(r["time"]) - t0, float(r[key])) for r in records if _is_number(r.get(key))]
    return [x for x, _ in points], [y for _, y in points]


def _pauses(times: list[float]) -> list[tuple[float, float]]:
    """Intervals with no record for much longer than the steps just before (a failure, a long
    state sync). Judged against the recent step time, since that changes with batch size."""
    pauses: list[tuple[float, float]] = []
    gaps = [b - a for a, b in zip(times, times[1:])]
    for i, gap in enumerate(gaps):
        recent = sorted(gaps[max(i - PAUSE_WINDOW, 0):i]) or sorted(gaps)
        if gap > PAUSE_FACTOR * recent[len(recent) // 2]:
            pauses.append((times[i], times[i + 1]))
    return pauses


def _gapped(xs: list[float], ys: list[float], pauses: list[tuple[float, float]],
            window: int = 1) -> tuple[list[float], list[float]]:
    """The series with a NaN (left blank by matplotlib) at each pause, so lines do not bridge
    time without training; ``window > 1`` gives a moving average that restarts after a pause."""
    out_x: list[float] = []
    out_y: list[float] = []
    segment: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i and any(xs[i - 1] <= a and b <= x for a, b in pauses):
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
    return [(float(e["time"]) - t0, float(e["size"])) for e in events
            if e.get("kind") in ("resize", "recovery") and isinstance(e.get("size"), int)]


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no data ({what} not logged)", transform=ax.transAxes,
            ha="center", va="center", color="gray", fontsize=10,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9})


def _step_panel(ax: Any, xs: list[float], ys: list[float], colour: str) -> None:
    ax.step(xs, ys, where="post", color=colour, linewidth=2)
    lo, hi = min(ys), max(ys)
    pad = max((hi - lo) * 0.25, 0.5 if hi < 20 else hi * 0.1)
    ax.set_ylim(max(lo - pad, 0), hi + pad)


def _gns_panel(ax: Any, xs: list[float], ys: list[float], pauses: list[tuple[float, float]],
               colour: str) -> None:
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
    ax.plot(*_gapped(xs, ys, pauses), color=colour, linewidth=1, marker=".", markersize=3)


def _noisy_panel(ax: Any, xs: list[float], ys: list[float], pauses: list[tuple[float, float]],
                 colour: str) -> None:
    """Raw values faintly, plus a moving average so the trend reads through the noise."""
    ax.plot(*_gapped(xs, ys, pauses), color=colour, linewidth=0.8, alpha=0.35)
    window = max(len(ys) // 40, 1)
    if window > 1:
        ax.plot(*_gapped(xs, ys, pauses, window), color=colour, linewidth=1.8,
                label=f"mean of {window}")
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


def _draw_events(band: Any, axes: list[Any], events: list[dict[str, Any]], t0: float,
                 span: float) -> None:
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
            ax.axvline(float(event["time"]) - t0, color=colour, linestyle=style,
                       linewidth=1.0 if bracket else 1.4, alpha=0.35 if bracket else 0.85,
                       label=legend if ax is band else None)
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
        level = next((i for i in range(LABEL_LEVELS) if all(
            extent[1] <= lo or hi <= extent[0] for lo, hi in placed[i])), None)
        if level is None:
            continue
        placed[level].append(extent)
        band.text(x, 0.8 - 0.3 * level, f" {label} ", fontsize=8, va="center",
                  color=EVENT_STYLE.get(event["kind"], OTHER_STYLE)[0],
                  ha="right" if right_aligned else "left",
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 0.5})


def _load_run(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(metrics, events) with a numeric time each, metrics in time order."""
    metrics_path, events_path = run_dir / METRICS_FILE, run_dir / EVENTS_FILE
    if not run_dir.is_dir():
        raise ConfigError(f"plot: run directory {run_dir} does not exist; expected the directory "
                          f"a run wrote with RunLog, containing {METRICS_FILE}")
    if not metrics_path.is_file():
        raise ConfigError(f"plot: {metrics_path} not found; expected {METRICS_FILE} (and "
                          f"optionally {EVENTS_FILE}) written by RunLog in {run_dir}")
    metrics = [r for r in read_jsonl(metrics_path) if isinstance(r.get("time"), (int, float))]
    # Records are appended in time order, but a new rank 0 after a failure runs on another
    # host's clock; sorting keeps a small skew from drawing the lines backwards.
    metrics.sort(key=lambda r: float(r["time"]))
    events = ([e for e in read_jsonl(events_path) if isinstance(e.get("time"), (int, float))]
              if events_path.is_file() else [])
    if not metrics and not events:
        raise ConfigError(f"plot: {metrics_path} holds no records with a 'time'; nothing to plot")
    return metrics, events


def _draw_panels(axes: list[Any], metrics: list[dict[str, Any]], events: list[dict[str, Any]],
                 t0: float) -> None:
    pauses = _pauses([float(r["time"]) - t0 for r in metrics])
    steps = [int(r["step"]) for r in metrics if isinstance(r.get("step"), int)]
    for ax, (key, title, ylabel, colour) in zip(axes, PANELS):
        xs, ys = _series(metrics, key, t0)
        if key == "size" and xs:  # event sizes refine a logged series; alone they'd be a guess
            # Stable sort with events last: an event at the same time as a record comes after
            # it (events happen at the boundary after the step that was logged), so it wins.
            points = sorted([*zip(xs, ys), *_size_changes(events, t0)], key=lambda p: p[0])
            xs, ys = [x for x, _ in points], [y for _, y in points]
        if not xs:
            _no_data(ax, key)
        elif key in ("size", "batch_size"):
            _step_panel(ax, xs, ys, colour)
        elif key == "gns":
            _gns_panel(ax, xs, ys, pauses, colour)
        else:
            _noisy_panel(ax, xs, ys, pauses, colour)
        if key == "loss" and steps:
            title += f" — steps {min(steps)}..{max(steps)}"
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
        raise ConfigError("plot: matplotlib is not installed; run `pip install taiji[plot]`"
                          ) from exc
    times = [float(r["time"]) for r in metrics + events]
    t0 = min(times)
    span = max(max(times) - t0, 1.0)  # a one-record run still gets a usable axis

    figure = Figure(figsize=(10, 11), dpi=110)
    FigureCanvasAgg(figure)  # attaches the Agg canvas explicitly; savefig then renders with it
    marked = [e for e in events if e.get("kind") not in BRACKET_KINDS]
    # A narrow band on top holds the event labels, so they never cover data.
    ratios = [0.45] * bool(marked) + [1.0] * len(PANELS)
    axes = list(figure.subplots(len(ratios), 1, sharex=True, height_ratios=ratios))
    band = axes.pop(0) if marked else None
    _draw_panels(axes, metrics, events, t0)
    for ax in axes[:2]:  # worker counts and batch sizes are whole numbers
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    axes[-1].set_xlim(-0.01 * span, span * 1.01)
    if band is not None:
        _draw_events(band, axes, events, t0, span)
        band.set(ylim=(0, 1), yticks=[])
        band.tick_params(axis="x", length=0)
        for side in ("left", "right", "top"):
            band.spines[side].set_visible(False)
        band.set_title("events (label @step)", loc="left", fontsize=10)
        # Above the band, so the legend never hides data or event labels.
        band.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=8,
                    frameon=False)
    else:
        _draw_events(axes[0], axes[1:], events, t0, span)  # only faint start/end lines
    figure.suptitle(f"taiji run {run_dir.resolve().name}: {len(metrics)} records, "
                    f"{len(events)} events, {span:.0f} s", fontsize=12, x=0.01, ha="left")
    figure.tight_layout()

    output = Path(output) if output is not None else run_dir / "timeline.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    return output
