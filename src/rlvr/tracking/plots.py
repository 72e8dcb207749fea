"""Learning-curve figures (PNG) for `rlvr runs plot|compare` and `rlvr report`.

Uses matplotlib's object API with the Agg canvas directly (never pyplot), so nothing here
touches the process-wide backend or needs a display.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

from rlvr.safe_io import atomic_write_bytes
from rlvr.tracking.runs import Group, Run, aligned_curves
from rlvr.tracking.stats import clipped_interval, mean_ci, metric_bounds

WALL_CLOCK_PREFIXES = ("time/", "perf/")
LEGEND_WIDTH = 90  # characters per legend line before a label wraps


def _figure(panels: int, columns: int = 2, extra_height: float = 0.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(columns, panels)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(5.2 * cols, 3.4 * rows + extra_height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]
    return fig, axes


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (1 = unchanged)."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_groups(groups: list[Group], metrics: list[str], path: str | Path, *, window: int = 1,
                confidence: float = 0.95) -> Path:
    """One panel per metric; per group the mean over seeds with a shaded Student-t CI band. One
    legend for all panels, below them, its labels wrapped: a long label never narrows the axes."""
    labels = [textwrap.fill(f"{g.label} (n={len(g.runs)})", LEGEND_WIDTH) for g in groups]
    columns = 1 if any(len(label) > LEGEND_WIDTH // 2 for label in labels) else 2
    legend_lines = sum(label.count("\n") + 1 for label in labels[::columns])
    fig, axes = _figure(len(metrics), extra_height=0.2 * legend_lines + 0.2)
    colors = [f"C{i % 10}" for i in range(len(groups))]
    handles: dict[int, object] = {}
    for ax, metric in zip(axes, metrics):
        for index, (group, color) in enumerate(zip(groups, colors)):
            steps, per_run = aligned_curves(group, metric)
            if not steps:
                continue
            # Sparse series (evaluations every N steps) are drawn raw: a moving average over a
            # handful of points would hide the final value the tables report.
            span = window if len(steps) >= 10 * window else 1
            per_run = [smooth(v, span) for v in per_run]
            stats = [mean_ci([run[i] for run in per_run], confidence) for i in range(len(steps))]
            mean = [m for m, _ in stats]
            (handles[index],) = ax.plot(steps, mean, color=color, lw=1.8)
            if len(per_run) > 1:
                low, high = zip(*(clipped_interval(m, h, metric_bounds(metric)) for m, h in stats))
                ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)
        smoothed = window > 1 and any(len(aligned_curves(g, metric)[0]) >= 10 * window for g in groups)
        ax.set_title(metric + (f" (moving avg {window})" if smoothed else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not ax.has_data():
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    if handles:
        shown = sorted(handles)
        fig.legend([handles[i] for i in shown], [labels[i] for i in shown], loc="outside lower center",
                   ncols=columns, fontsize=8, frameon=False)
    fig.suptitle(f"mean ± {round(confidence * 100)}% CI over seeds", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix[1:] or None)  # written whole, never through a link at `path`
    atomic_write_bytes(path, buffer.getvalue())
    return path


PREFERRED = ("eval/heldout_accuracy", "eval/train_accuracy", "reward/mean", "reward/accuracy", "reward/std",
             "batch/zero_variance_group_frac", "response/length_mean", "response/truncation_rate", "loss/policy",
             "actor/entropy", "actor/grad_norm", "actor/kl", "actor/clip_frac_low", "actor/clip_frac_high")


PANELS = 18  # curves a report draws at most


def report_metrics(run: Run, limit: int | None = PANELS) -> list[str]:
    """The metrics a report shows: accuracy, reward and the usual debugging keys first, wall-clock last
    (`limit` None: all of them)."""
    keys = sorted({k for m in run.metrics for k, v in m.items() if k != "step" and isinstance(v, (int, float))})
    first = [k for k in PREFERRED if k in keys]
    rest = [k for k in keys if k not in first and not k.startswith(WALL_CLOCK_PREFIXES)]
    timing = [k for k in keys if k.startswith(WALL_CLOCK_PREFIXES) and k not in first]
    return (first + rest + timing)[:limit]


SMOOTH_FROM = 40  # points: a shorter series (an evaluation every N steps, a short run) is drawn as logged
SMOOTH_SHARE = 20  # a longer one's moving average spans about 1/SMOOTH_SHARE of its points


def report_window(points: int) -> int:
    """The moving-average window of a report panel of `points` points: 1 (raw) below `SMOOTH_FROM`,
    else about a twentieth of the series, so a 500-step run's per-step noise does not hide its trend.

    >>> report_window(21), report_window(40), report_window(500)
    (1, 2, 25)
    """
    return 1 if points < SMOOTH_FROM else max(2, points // SMOOTH_SHARE)


def constant_metrics(runs: list[Run], metrics: list[str]) -> dict[str, float]:
    """{metric: value} of the `metrics` logged with one and the same value at every step of every run:
    a panel of a flat line says less than the number does, in a table."""
    out = {}
    for metric in metrics:
        values = {v for run in runs for v in run.series(metric)[1]}
        if len(values) == 1:
            out[metric] = values.pop()
    return out


def _draw(ax, steps: list[int], values: list[float], color: str) -> object:
    """One curve: raw as logged when short; else faint raw points under their moving average."""
    window = report_window(len(steps))
    if window == 1:
        return ax.plot(steps, values, color=color, lw=1.5, marker="o" if len(steps) < 30 else None, ms=3)[0]
    ax.plot(steps, values, color=color, lw=0.6, alpha=0.25)
    return ax.plot(steps, smooth(values, window), color=color, lw=1.6)[0]


def _title(metric: str, lengths: list[int]) -> str:
    windows = {report_window(n) for n in lengths if n} - {1}
    return metric + (f" (moving avg {max(windows)})" if windows else "")


def run_curves_png(run: Run, metrics: list[str]) -> bytes:
    """PNG bytes: one small panel per metric of a single run (long series smoothed: `report_window`)."""
    fig, axes = _figure(max(len(metrics), 1), columns=3)
    for ax, metric in zip(axes, metrics):
        steps, values = run.series(metric)
        _draw(ax, steps, values, "C0")
        ax.set_title(_title(metric, [len(steps)]), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def runs_curves_png(runs: list[Run], metrics: list[str]) -> bytes:
    """PNG bytes: one panel per metric with every run's curve overlaid, one colour per run, one legend."""
    fig, axes = _figure(max(len(metrics), 1), columns=3, extra_height=0.25 * math.ceil(len(runs) / 3) + 0.2)
    handles = {}
    for ax, metric in zip(axes, metrics):
        lengths = []
        for index, run in enumerate(runs):
            steps, values = run.series(metric)
            lengths.append(len(steps))
            if steps:
                handles[index] = _draw(ax, steps, values, f"C{index % 10}")
        ax.set_title(_title(metric, lengths), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if not ax.has_data():
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    if handles:
        shown = sorted(handles)
        fig.legend([handles[i] for i in shown], [textwrap.shorten(runs[i].name, LEGEND_WIDTH // 3) for i in shown],
                   loc="outside lower center", ncols=min(3, len(shown)), fontsize=8, frameon=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
