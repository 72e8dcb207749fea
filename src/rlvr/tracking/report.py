"""`rlvr report RUN`: one self-contained HTML page describing a run.

Curves are an embedded base64 PNG, so the file can be mailed or attached with nothing beside it; no
scripts, no external fonts or styles. A long per-step curve is drawn smoothed over its raw values
(`plots.report_window`); a metric that never changed is a table row, not a flat panel. Sections:
summary, curves, rollouts (a sample of steps, each a collapsible table of prompt / completion /
reward), config, manifest.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from rlvr.inputs import read_text
from rlvr.safe_io import atomic_write_text, check_output_file
from rlvr.tracking.plots import (
    PANELS,
    SMOOTH_FROM,
    SMOOTH_SHARE,
    constant_metrics,
    report_metrics,
    run_curves_png,
)
from rlvr.tracking.run_files import read_records
from rlvr.tracking.runs import Run, load_run
from rlvr.yaml_io import MAX_BYTES

GENERATOR = "<meta name=generator content=rlvr-report>"
"""In every page rlvr writes: a file at the output path without it is the user's, kept unless `--force`."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde3}
.meta{color:#5a6570} section{background:#fff;border:1px solid #e1e5ea;border-radius:6px;padding:12px 16px}
table{border-collapse:collapse;width:100%} td,th{border-bottom:1px solid #eceff2;padding:4px 8px;text-align:left;
vertical-align:top} th{background:#f2f4f6;font-weight:600}
pre,code,.mono{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap}
pre{max-height:420px;overflow:auto;background:#f8f9fa;padding:8px;margin:0}
img{max-width:100%} details{margin:4px 0} summary{cursor:pointer;padding:3px 0}
table.kv th{width:240px}
.r1{background:#dff3e3} .r0{background:#fbe4e4} .rm{background:#fff4d6}
"""


def _reward_class(reward) -> str:
    if not isinstance(reward, (int, float)) or math.isnan(reward):
        return ""
    return "r1" if reward >= 1.0 else "r0" if reward <= 0.0 else "rm"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def pick_steps(steps: list[int], most: int) -> list[int]:
    """At most `most` steps, evenly spaced, always keeping the first and the last."""
    steps = sorted(set(steps))
    if len(steps) <= most:
        return steps
    if most == 1:
        return [steps[-1]]
    return sorted({steps[round(i * (len(steps) - 1) / (most - 1))] for i in range(most)})


def _summary(run: Run) -> str:
    rows = [("status", run.manifest.get("status", "?")), ("steps", f"{run.last_step} / "
            f"{(run.config.get('trainer') or {}).get('steps', '?')}"), ("seed", run.seed),
            ("git", f"{run.manifest.get('git_sha') or '-'}{' (dirty)' if run.manifest.get('git_dirty') else ''}"),
            ("started", run.manifest.get("started", "-")), ("ended", run.manifest.get("ended", "-"))]
    ending = [(key, str(run.manifest[key])) for key in ("exit_status", "signal", "error") if key in run.manifest]
    rows[1:1] = ending  # how a failed or interrupted run ended, next to its status
    latest = {}
    for line in run.metrics:
        latest.update({k: (line["step"], v) for k, v in line.items() if k != "step"})
    for key in report_metrics(run, limit=10):
        step, value = latest[key]
        rows.append((key, f"{_fmt(value)}  (step {step})"))
    cells = "".join(f"<tr{' id=error' if k == 'error' else ''}><th>{html.escape(k)}</th>"
                    f"<td>{html.escape(v) if isinstance(v, str) else _fmt(v)}</td></tr>" for k, v in rows)
    return f"<table class=kv>{cells}</table>"


def _rollouts(samples: list[dict], most_steps: int) -> str:
    by_step: dict[int, list[dict]] = {}
    for record in samples:
        by_step.setdefault(record.get("step", -1), []).append(record)
    if not by_step:
        return "<p class=meta>No samples.jsonl in this run.</p>"
    shown = pick_steps(list(by_step), most_steps)
    parts = [f"<p class=meta>{len(shown)} of {len(by_step)} steps shown; rewards: "
             "<span class=r1>1</span> <span class=rm>partial</span> <span class=r0>0</span></p>"]
    for i, step in enumerate(shown):
        records = by_step[step]
        rewards = [r.get("reward") for r in records if isinstance(r.get("reward"), (int, float))]
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        rows = "".join(
            f"<tr class='{_reward_class(r.get('reward'))}'><td class=mono>{html.escape(str(r.get('prompt', '')))}</td>"
            f"<td class=mono>{html.escape(str(r.get('completion', '')))}</td><td>{_fmt(r.get('reward', ''))}</td></tr>"
            for r in records)
        is_open = " open" if i in (0, len(shown) - 1) else ""
        parts.append(f"<details class=step data-step={step}{is_open}><summary>step {step} — {len(records)} rollouts, "
                     f"mean reward {mean}</summary><table><tr><th>prompt</th><th>completion</th><th>reward</th></tr>"
                     f"{rows}</table></details>")
    return "".join(parts)


def async_summary(metrics: list[dict]) -> list[tuple[str, str]]:
    """Rows of the asynchronous-rollout table (runs with `trainer.max_staleness`): how many steps
    trained on a batch of each staleness, the mean idle shares of learner and rollout side, the
    queue depth the learner found, and the seconds spent moving weights. Empty for a synchronous run."""
    steps = [m for m in metrics if "async/staleness" in m]
    if not steps:
        return []

    def mean(key: str) -> float:
        values = [m[key] for m in steps if isinstance(m.get(key), (int, float))]
        return sum(values) / len(values) if values else float("nan")

    histogram: dict[int, int] = {}
    for m in steps:
        histogram[int(m["async/staleness"])] = histogram.get(int(m["async/staleness"]), 0) + 1
    return [("steps", str(len(steps))),
            ("staleness histogram (steps)", ", ".join(f"{k}: {n}" for k, n in sorted(histogram.items()))),
            ("mean staleness", f"{mean('async/staleness'):.3g}"),
            ("trainer idle fraction (mean)", f"{mean('async/trainer_idle_frac'):.3g}"),
            ("rollout idle fraction (mean)", f"{mean('async/rollout_idle_frac'):.3g}"),
            ("queue depth (mean)", f"{mean('async/queue_depth'):.3g}"),
            ("weight sync seconds (total)", f"{sum(m.get('async/weight_sync_s', 0.0) for m in steps):.3g}")]


def _async_section(run: Run) -> str:
    rows = async_summary(run.metrics)
    if not rows:
        return ""
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<h2>Asynchronous rollouts</h2><section id=async><table class=kv>{cells}</table></section>"


def constants_table(constants: dict[str, float], where: str) -> str:
    """The metrics that never changed, as rows of a table instead of flat panels ('' when none)."""
    if not constants:
        return ""
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in constants.items())
    return (f"<p class=meta>The same value at every logged step {where}, so not drawn:</p>"
            f"<table class=kv id=constants>{cells}</table>")


SMOOTHING_NOTE = (f"<p class=meta id=smoothing>A curve of {SMOOTH_FROM} or more points is drawn as its moving average "
                  f"over about 1/{SMOOTH_SHARE} of them (window in the panel's title) over the raw values, faint; "
                  f"shorter ones (evaluations every few steps) as logged.</p>")


def render_report(run: Run, *, max_sample_steps: int = 40) -> str:
    every = report_metrics(run, limit=None)
    constants = constant_metrics([run], every)
    metrics = [m for m in every if m not in constants][:PANELS]
    if metrics:
        png = base64.b64encode(run_curves_png(run, metrics)).decode()
        curves = (f"<img id=curves alt='learning curves of {html.escape(run.name)}' src='data:image/png;base64,{png}'>"
                  f"{SMOOTHING_NOTE}")
    else:
        curves = "<p class=meta>No metrics logged yet.</p>"
    curves += constants_table(constants, "of this run")
    config_text = read_text(run.path / "config.yaml", "run file", MAX_BYTES)  # load_run has checked it
    manifest_text = json.dumps(run.manifest, indent=2, default=str)
    title = f"rlvr report · {run.name}"
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8>{GENERATOR}<meta name=viewport content="width=device-width,initial-scale=1">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body><main>
<h1>{html.escape(title)}</h1><div class=meta>{html.escape(str(run.path))}</div>
<h2>Summary</h2><section>{_summary(run)}</section>
{_async_section(run)}<h2>Learning curves</h2><section>{curves}</section>
<h2>Rollouts</h2><section id=rollouts>{_rollouts(read_records(run.path / 'samples.jsonl'), max_sample_steps)}</section>
<h2>Config</h2><section><pre id=config>{html.escape(config_text)}</pre></section>
<h2>Manifest</h2><section><pre id=manifest>{html.escape(manifest_text)}</pre></section>
</main></body></html>
"""


def write_report(run_path: str | Path, out: str | Path | None = None, *, max_sample_steps: int = 40) -> Path:
    """Render the report of the run at `run_path` to `out` (default RUN/report.html)."""
    run = load_run(run_path)
    path = Path(out) if out else run.path / "report.html"
    check_output_file(path, "--out" if out else "report")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_report(run, max_sample_steps=max_sample_steps))
    return path
