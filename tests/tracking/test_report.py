"""`rlvr report RUN`: a self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_runs import make_run

from rlvr.tracking.plots import _draw, constant_metrics, report_window, smooth
from rlvr.tracking.report import pick_steps, write_report
from rlvr.tracking.runs import load_run

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
# Test-only probe appended to a copy of the page: after load, record each image's decoded width.
PROBE = ("<script>window.addEventListener('load',()=>{document.body.dataset.imageWidths="
         "[...document.images].map(i=>i.naturalWidth).join(',')})</script>")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def test_pick_steps_keeps_ends_and_spreads():
    assert pick_steps(list(range(1, 101)), 5) == [1, 26, 51, 75, 100]
    assert pick_steps([3, 1, 2], 10) == [1, 2, 3]


def test_report_is_self_contained(tmp_path):
    run = make_run(tmp_path, "grpo_s0", seed=0, steps=120)
    page = write_report(run, max_sample_steps=7).read_text()
    assert page.count("<details class=step") == 7
    assert not re.search(r"(src|href)=['\"]?(https?:|//|file:)", page)  # nothing fetched from outside
    assert "&lt;bad 120&gt;" in page  # completions are escaped, not interpreted as markup


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs it: apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    run = make_run(tmp_path, "grpo_s0", seed=0, steps=60)
    page = write_report(run)
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))

    dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<title>rlvr report · grpo_s0</title>" in dom.stdout
    widths = re.search(r'data-image-widths="([\d,]*)"', dom.stdout)
    assert widths and all(int(w) > 500 for w in widths.group(1).split(",")), "curve image did not decode"
    assert "3*4" in dom.stdout and "step 60 — 4 rollouts" in dom.stdout  # a rollout and its step

    screenshot = tmp_path / "report.png"
    shot = _chromium(tmp_path, "--window-size=1200,1600", f"--screenshot={screenshot}", page.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:4] == b"\x89PNG" and screenshot.stat().st_size > 30_000


def test_report_summarises_async_rollouts(tmp_path):
    import json

    from rlvr.tracking.report import async_summary

    run = make_run(tmp_path, "async_s0", seed=0, steps=4)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for line, staleness in zip(lines[1:], (0, 1, 1, 0)):
        line.update({"async/staleness": staleness, "async/trainer_idle_frac": 0.25 * staleness,
                     "async/rollout_idle_frac": 0.5, "async/queue_depth": staleness, "async/weight_sync_s": 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert dict(async_summary(lines)) == {
        "steps": "4", "staleness histogram (steps)": "0: 2, 1: 2", "mean staleness": "0.5",
        "trainer idle fraction (mean)": "0.125", "rollout idle fraction (mean)": "0.5",
        "queue depth (mean)": "0.5", "weight sync seconds (total)": "2"}
    page = write_report(run).read_text()
    assert "<section id=async>" in page and "0: 2, 1: 2" in page
    assert async_summary(lines[:1]) == []
    assert "id=async" not in write_report(make_run(tmp_path, "sync_s0", seed=0)).read_text()


def _add_metric(run: Path, key: str, value_of) -> None:
    """Log `key` (value_of(step)) on every line after step 0 of `run`'s metrics."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for line in lines[1:]:
        line[key] = value_of(line["step"])
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_long_curves_are_smoothed_and_constant_metrics_are_a_table(tmp_path):
    from matplotlib.figure import Figure

    run = make_run(tmp_path, "long_s0", seed=0, steps=500, eval_every=50)
    _add_metric(run, "algo/kl_coef", lambda step: 0.04)  # a knob logged every step, never changing
    page = write_report(run).read_text()
    constants = page.split("<table class=kv id=constants>")[1].split("</table>")[0]
    assert "<th>algo/kl_coef</th><td>0.04</td>" in constants and "reward/mean" not in constants
    assert "id=smoothing" in page

    loaded = load_run(run)
    assert constant_metrics([loaded], ["algo/kl_coef", "reward/mean", "eval/heldout_accuracy"]) == {
        "algo/kl_coef": 0.04}
    steps, values = loaded.series("reward/mean")  # 500 noisy per-step points: a 25-step moving average
    ax = Figure().add_subplot()
    drawn = _draw(ax, steps, values, "C0")
    assert report_window(len(steps)) == 25 and len(ax.lines) == 2  # faint raw beneath the average
    assert list(drawn.get_ydata()) == pytest.approx(smooth(values, 25)) and list(ax.lines[0].get_ydata()) == values
    evals = loaded.series("eval/heldout_accuracy")  # 11 evaluations: drawn as logged
    ax = Figure().add_subplot()
    assert list(_draw(ax, *evals, "C0").get_ydata()) == evals[1] and len(ax.lines) == 1


def test_a_metric_constant_in_each_run_but_not_across_them_is_drawn(tmp_path):
    from rlvr.tracking.report_runs import shown_metrics

    runs = [make_run(tmp_path, f"r_s{seed}", seed=seed, steps=60) for seed in (0, 1)]
    for seed, run in enumerate(runs):
        _add_metric(run, "algo/kl_coef", lambda step: 0.04)
        _add_metric(run, "optim/lr", lambda step, seed=seed: 1e-4 * (seed + 1))
    drawn, constants = shown_metrics([load_run(r) for r in runs])
    assert constants == {"algo/kl_coef": 0.04} and "optim/lr" in drawn and "algo/kl_coef" not in drawn
