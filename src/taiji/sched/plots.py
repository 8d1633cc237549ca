"""PNG plots of scheduler simulations: JCT CDF per policy, cluster utilisation over time, and each
job's GPU allocation over time under one policy.

The functions take plain numbers (no simulator types), draw with matplotlib's object API on an Agg
canvas (no pyplot: a caller's global backend is neither needed nor changed) and return the path
they wrote. matplotlib is the optional extra ``taiji[plot]``; importing this module without it
raises ImportError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure

HOUR = 3600.0
WAITING_COLOUR = "0.85"  # a submitted job that holds no GPUs


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)
    return path


def plot_jct_cdf(jcts: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Fraction of completed jobs with a JCT at most x, one line per policy; x on a log scale
    because JCTs span minutes to days."""
    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    for policy, values in jcts.items():
        ordered = np.sort(np.asarray(values, dtype=float))
        if ordered.size:
            fraction = np.arange(1, ordered.size + 1) / ordered.size
            axes.step(
                ordered / HOUR,
                fraction,
                where="post",
                label=f"{policy} (avg {ordered.mean() / HOUR:.2f} h, n={ordered.size})",
            )
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (h)")
    axes.set_ylabel("fraction of completed jobs")
    axes.set_ylim(0, 1.02)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("JCT CDF")
    figure.tight_layout()
    return _save(figure, Path(path))


def plot_utilization(
    timelines: Mapping[str, Sequence[tuple[float, int]]], total_gpus: int, path: str | Path
) -> Path:
    """Fraction of the cluster's GPUs allocated over time, one step line per policy (each timeline
    is (time, GPUs allocated from then on), as the simulator records it)."""
    figure = Figure(figsize=(9, 4))
    axes = figure.add_subplot()
    for policy, points in timelines.items():
        if points:
            times = np.array([t for t, _ in points]) / HOUR
            used = np.array([gpus for _, gpus in points], dtype=float) / total_gpus
            axes.step(times, used, where="post", linewidth=1.0, label=policy)
    axes.set_xlabel("simulated time (h)")
    axes.set_ylabel(f"GPUs allocated (of {total_gpus})")
    axes.set_ylim(0, 1.05)
    axes.yaxis.set_major_formatter(lambda value, _: f"{value:.0%}")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("cluster utilisation")
    figure.tight_layout()
    return _save(figure, Path(path))


def plot_allocations(
    allocations: Mapping[str, Sequence[tuple[float, int]]],
    lifetimes: Mapping[str, tuple[float, float | None]],
    path: str | Path,
    policy: str,
    unit: tuple[str, float] = ("simulated time (h)", HOUR),
    held: str = "GPUs",
    suspensions: Mapping[str, Sequence[float]] | None = None,
) -> Path:
    """One lane per job of ``lifetimes`` (job -> (submitted, completed or None); submission order,
    first at the top): grey while it waits or is preempted, coloured by its GPU count while it
    holds GPUs, nothing after it completes. ``allocations`` maps a job to its (time, GPUs from
    then on) steps; a job missing from it never ran. ``suspensions``: when a job was suspended
    (a red mark on its lane)."""
    label, scale = unit
    jobs = sorted(lifetimes, key=lambda job: (lifetimes[job][0], job))
    most = max((gpus for steps in allocations.values() for _, gpus in steps), default=1)
    bounds, ticks = _colour_bins(max(most, 1))
    colours = ScalarMappable(norm=BoundaryNorm(bounds, 256), cmap="viridis")
    horizon = max(
        [t for steps in allocations.values() for t, _ in steps]
        + [t for lifetime in lifetimes.values() for t in lifetime if t is not None]
        + [1.0]
    )
    figure = Figure(figsize=(10, min(max(3.0, 0.06 * len(jobs) + 1.5), 30.0)))
    axes = figure.add_subplot()
    for lane, job in enumerate(jobs):
        y = len(jobs) - 1 - lane
        submitted, completed = lifetimes[job]
        end = horizon if completed is None else completed
        steps = [(t, gpus) for t, gpus in allocations.get(job, []) if t < end]
        changes = [(submitted, 0)] + steps + [(end, 0)]
        for (start, gpus), (stop, _) in zip(changes, changes[1:]):
            if stop > start:
                axes.broken_barh(
                    [(start / scale, (stop - start) / scale)],
                    (y - 0.4, 0.8),
                    facecolors=colours.to_rgba(gpus) if gpus else WAITING_COLOUR,
                )
        marks = [t / scale for t in (suspensions or {}).get(job, ())]
        if marks:
            axes.plot(
                marks,
                [y] * len(marks),
                linestyle="none",
                marker="v",
                color="tab:red",
                label="suspended" if not axes.get_legend_handles_labels()[0] else None,
            )
    axes.set_ylim(-1, max(len(jobs), 1))
    axes.set_yticks([])
    axes.set_ylabel(f"{len(jobs)} jobs, in submission order")
    axes.set_xlabel(label)
    axes.set_xlim(0, horizon / scale)
    axes.grid(True, axis="x", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper right")
    figure.colorbar(
        colours, ax=axes, ticks=ticks, label=f"{held} held (grey: waiting or preempted)", pad=0.01
    )
    axes.set_title(f"allocation per job under {policy}")
    figure.tight_layout()
    return _save(figure, Path(path))


def _colour_bins(most: int) -> tuple[list[float], list[int]]:
    """Bin edges and tick labels of the colours for 1..most GPUs: one bin per count up to 8, then
    one per doubling (9-16, 17-32, ...), so a 64-GPU job does not wash out the common 1-8 range."""
    top = min(most, 8)
    edges, ticks = [count + 0.5 for count in range(top + 1)], list(range(1, top + 1))
    while edges[-1] < most:
        ticks.append(2 * ticks[-1])
        edges.append(ticks[-1] + 0.5)
    return edges, ticks
