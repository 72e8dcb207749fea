"""`rlvr report RUN1 RUN2 ...`: several runs side by side on one self-contained HTML page.

Sections: a summary table with one column per run (status, steps, seed, git, each shown metric's
latest value), the learning curves overlaid (one colour per run, an embedded PNG), and the config
keys whose values differ between the runs. Each run's own page (`rlvr report RUN`) has its rollouts.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from rlvr.safe_io import atomic_write_text, check_output_file
from rlvr.tracking.plots import PANELS, constant_metrics, report_metrics, runs_curves_png
from rlvr.tracking.report import GENERATOR, SMOOTHING_NOTE, STYLE, _fmt, constants_table
from rlvr.tracking.runs import Run, flatten, load_run


def config_differences(runs: list[Run]) -> dict[str, list[object]]:
    """{dotted key: each run's value} for the keys whose values are not all the same (absent = None)."""
    trees = [flatten(run.config) for run in runs]
    keys = sorted({k for tree in trees for k in tree})
    return {k: [tree.get(k) for tree in trees] for k in keys if len({repr(tree.get(k)) for tree in trees}) > 1}


def shown_metrics(runs: list[Run], limit: int = PANELS) -> tuple[list[str], dict[str, float]]:
    """(the metrics drawn: the first run's report order, then those only other runs log, up to `limit`;
    {metric: value} of those with one value at every step of every run, shown as numbers instead)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in report_metrics(run, limit=None) if k not in keys]
    constants = constant_metrics(runs, keys)
    return [k for k in keys if k not in constants][:limit], constants


def _latest(run: Run, metric: str) -> str:
    steps, values = run.series(metric)
    return f"{_fmt(values[-1])} <span class=meta>(step {steps[-1]})</span>" if steps else "-"


def _table(header: list[str], rows: list[tuple[str, list[str]]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(f"<tr><th>{html.escape(key)}</th>{''.join(f'<td>{cell}</td>' for cell in cells)}</tr>"
                   for key, cells in rows)
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def render_runs_report(runs: list[Run]) -> str:
    names = [run.name for run in runs]
    metrics, constants = shown_metrics(runs)
    summary = [("status", [html.escape(str(r.manifest.get("status", "?"))) for r in runs]),
               ("steps", [f"{r.last_step} / {(r.config.get('trainer') or {}).get('steps', '?')}" for r in runs]),
               ("seed", [html.escape(str(r.seed)) for r in runs]),
               ("git", [html.escape(str(r.manifest.get("git_sha") or "-"))[:12] for r in runs]),
               ("path", [f"<span class=mono>{html.escape(str(r.path))}</span>" for r in runs])]
    summary += [(m, [_latest(r, m) for r in runs]) for m in metrics]
    if metrics:
        png = base64.b64encode(runs_curves_png(runs, metrics)).decode()
        curves = (f"<img id=curves alt='learning curves of {len(runs)} runs' src='data:image/png;base64,{png}'>"
                  f"{SMOOTHING_NOTE}")
    else:
        curves = "<p class=meta>No metrics logged yet.</p>"
    curves += constants_table(constants, "of every run")
    differences = config_differences(runs)
    diff = (_table(names, [(k, [html.escape(repr(v)) for v in values]) for k, values in differences.items()])
            if differences else "<p class=meta>The runs' configs are the same.</p>")
    title = f"rlvr report · {len(runs)} runs"
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8>{GENERATOR}<meta name=viewport content="width=device-width,initial-scale=1">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body><main>
<h1>{html.escape(title)}</h1><div class=meta>{html.escape(", ".join(names))}</div>
<h2>Summary</h2><section id=summary>{_table(names, summary)}</section>
<h2>Learning curves</h2><section>{curves}</section>
<h2>Config differences</h2><section id=config-diff>{diff}</section>
</main></body></html>
"""


def write_runs_report(run_paths: list[str | Path], out: str | Path | None = None) -> Path:
    """Render the page of the runs at `run_paths` to `out` (default: report.html beside the first run)."""
    runs = [load_run(p) for p in run_paths]
    path = Path(out) if out else runs[0].path.parent / "report.html"
    check_output_file(path, "--out" if out else "report")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_runs_report(runs))
    return path
