"""Shared driver of the learning benchmarks: run recipes × seeds from one warm start, then table + plot.

Each run is a separate `rlvr train` process (a clean interpreter per run, as a user would run
it); results are read back from the run directories with `rlvr.tracking.runs`, so the table is
exactly what `rlvr runs compare` would print.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rlvr.tracking.plots import plot_groups
from rlvr.tracking.runs import Group, find_runs, markdown_table, summarize
from rlvr.tracking.stats import mean_ci

REPO = Path(__file__).resolve().parent.parent


def run_sweep(recipes: list[str], seeds: list[int], overrides: list[str], out: Path, *, echo=print) -> None:
    """Train every recipe with every seed into out/<recipe>/s<seed> (skipping finished runs)."""
    for recipe in recipes:
        for seed in seeds:
            run = out / Path(recipe).stem / f"s{seed}"
            if (run / "run.json").exists() and '"finished"' in (run / "run.json").read_text():
                continue
            cmd = [sys.executable, "-m", "rlvr.cli", "train", str(REPO / recipe), f"seed={seed}",
                   f"trainer.out_dir={run.parent}", f"trainer.name={run.name}", *overrides]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{recipe} seed {seed} failed:\n{done.stderr[-2000:]}")
            echo(f"{Path(recipe).stem:<32} seed {seed}  {time.perf_counter() - t0:6.1f}s")


def _extra_columns(group) -> list[str]:
    """Wall time per run and final response length / entropy, mean ± 95% CI over seeds."""
    def cell(values):
        mean, half = mean_ci(values)
        return f"{mean:.3g} ± {half:.2g}" if half == half else f"{mean:.3g}"

    walls = [r.manifest.get("duration_s", float("nan")) for r in group.runs]
    last = [r.metrics[-1] for r in group.runs]
    return [cell(walls), cell([m.get("response/length_mean", float("nan")) for m in last]),
            cell([m.get("actor/entropy", float("nan")) for m in last])]


def train_seconds(run) -> list[tuple[int, float]]:
    """(step, training seconds up to it) for every step that logged `time/step_s` (evaluation excluded)."""
    elapsed, points = 0.0, []
    for m in run.metrics:
        if "time/step_s" in m:
            elapsed += m["time/step_s"]
            points.append((m["step"], elapsed))
    return points


def accuracy_within(run, budget_s: float, metric: str = "eval/heldout_accuracy") -> tuple[int, float]:
    """(step, value) of the last evaluation whose step the run reached within `budget_s` training seconds."""
    reached = {step for step, seconds in train_seconds(run) if seconds <= budget_s} | {0}
    steps, values = run.series(metric)
    return max((s, v) for s, v in zip(steps, values) if s in reached)


def equal_time_table(groups, metric: str = "eval/heldout_accuracy") -> str:
    """Each recipe's gain over its step-0 evaluation per training minute, and its accuracy at the last
    evaluation it reached within the fastest recipe's training time (mean over seeds): measured points
    only, nothing extrapolated past a run's end."""
    def cell(values, digits=3):
        mean, half = mean_ci(values)
        return f"{mean:.{digits}f} ± {half:.{digits}f}" if half == half else f"{mean:.{digits}f}"

    totals = {g.label: [train_seconds(r)[-1][1] for r in g.runs] for g in groups}
    budget = min(sum(t) / len(t) for t in totals.values())
    rows = [f"| recipe | train s/run | {metric} gain | gain per train minute | "
            f"steps reached in {budget:.0f} s | {metric} at {budget:.0f} s |", "|---|---|---|---|---|---|"]
    for g in groups:
        gains = [r.series(metric)[1][-1] - r.series(metric)[1][0] for r in g.runs]
        at_budget = [accuracy_within(r, budget, metric) for r in g.runs]
        rows.append(f"| {g.label} | {cell(totals[g.label], 0)} | {cell(gains)} | "
                    f"{cell([60 * d / t for d, t in zip(gains, totals[g.label])])} | "
                    f"{'/'.join(str(s) for s, _ in at_budget)} | {cell([v for _, v in at_budget])} |")
    return "\n".join(rows) + "\n"


def recipe_groups(out: Path) -> list[Group]:
    """One group per recipe directory (out/<recipe>/s<seed>), labelled by the recipe's name."""
    by_recipe: dict[str, list] = {}
    for run in find_runs([out]):
        by_recipe.setdefault(run.path.parent.name, []).append(run)
    return [Group(label=name, runs=runs) for name, runs in sorted(by_recipe.items())]


def report(out: Path, metrics: list[str], plot_metrics: list[str]) -> str:
    """Markdown table (mean ± 95% CI over seeds) of every run under `out`, and curves.png."""
    groups = recipe_groups(out)
    table = markdown_table(groups, metrics, summarize(groups, metrics))
    extra = ["| recipe | wall s/run | response length (final) | entropy (final) |", "|---|---|---|---|"]
    extra += [f"| {g.label} | " + " | ".join(_extra_columns(g)) + " |" for g in groups]
    plot = plot_groups(groups, plot_metrics, out / "curves.png", window=10)
    return f"{table}\n" + "\n".join(extra) + f"\n\ncurves: {plot}\n"
