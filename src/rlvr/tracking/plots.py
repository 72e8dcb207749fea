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


def report_metrics(run: Run, limit: int = 18) -> list[str]:
    """The metrics a report shows: accuracy, reward and the usual debugging keys first, wall-clock last."""
    keys = sorted({k for m in run.metrics for k, v in m.items() if k != "step" and isinstance(v, (int, float))})
    first = [k for k in PREFERRED if k in keys]
    rest = [k for k in keys if k not in first and not k.startswith(WALL_CLOCK_PREFIXES)]
    timing = [k for k in keys if k.startswith(WALL_CLOCK_PREFIXES) and k not in first]
    return (first + rest + timing)[:limit]


def run_curves_png(run: Run, metrics: list[str], *, window: int = 1) -> bytes:
    """PNG bytes: one small panel per metric of a single run."""
    fig, axes = _figure(max(len(metrics), 1), columns=3)
    for ax, metric in zip(axes, metrics):
        steps, values = run.series(metric)
        ax.plot(steps, smooth(values, window) if window > 1 else values, color="C0", lw=1.5,
                marker="o" if len(steps) < 30 else None, ms=3)
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def runs_curves_png(runs: list[Run], metrics: list[str], *, window: int = 1) -> bytes:
    """PNG bytes: one panel per metric with every run's curve overlaid, one colour per run, one legend."""
    fig, axes = _figure(max(len(metrics), 1), columns=3, extra_height=0.25 * math.ceil(len(runs) / 3) + 0.2)
    handles = {}
    for ax, metric in zip(axes, metrics):
        for index, run in enumerate(runs):
            steps, values = run.series(metric)
            if steps:
                (handles[index],) = ax.plot(steps, smooth(values, window) if window > 1 else values,
                                            color=f"C{index % 10}", lw=1.5, marker="o" if len(steps) < 30 else None,
                                            ms=3)
        ax.set_title(metric, fontsize=9)
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
