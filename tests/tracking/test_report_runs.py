"""`rlvr report RUN1 RUN2 ...`: several runs on one self-contained page, curves overlaid, the config
keys that differ, rendered in headless Chromium when it is installed."""

from __future__ import annotations

import re

import pytest
from fake_runs import make_run
from test_report import CHROMIUM, PROBE, _chromium

from rlvr.cli import main
from rlvr.tracking.report_runs import config_differences, write_runs_report
from rlvr.tracking.runs import load_run


def _runs(tmp_path):
    return [make_run(tmp_path, "grpo_s0", seed=0, steps=30),
            make_run(tmp_path, "dapo_s1", seed=1, steps=30, overrides=("algo.clip_high=0.28",), rate=0.1)]


def test_the_page_sets_runs_side_by_side(tmp_path):
    runs = _runs(tmp_path)
    page = write_runs_report(runs, tmp_path / "out" / "both.html").read_text()
    assert "<title>rlvr report · 2 runs</title>" in page
    summary = page.split("<section id=summary>")[1].split("</section>")[0]
    assert summary.count("<th>grpo_s0</th>") == 1 and summary.count("<th>dapo_s1</th>") == 1
    assert "eval/heldout_accuracy" in summary and summary.count("(step 30)") >= 4  # 2 runs x 2 metrics at least
    assert page.count("data:image/png;base64,") == 1  # one figure, the curves overlaid
    assert not re.search(r"(src|href)=['\"]?(https?:|//|file:)", page)
    diff = config_differences([load_run(r) for r in runs])
    assert diff["algo.clip_high"] == [0.2, 0.28] and diff["seed"] == [0, 1]
    assert "trainer.steps" not in diff  # the same in both
    assert "<th>algo.clip_high</th>" in page.split("<section id=config-diff>")[1]


def test_the_cli_takes_several_runs(tmp_path, capsys):
    runs = _runs(tmp_path)
    assert main(["report", *map(str, runs)]) == 0
    assert (tmp_path / "report.html").is_file() and "wrote" in capsys.readouterr().out  # beside the first run
    assert main(["report", str(runs[0]), str(runs[1]), "--out", str(runs[1] / "report.html")]) == 2
    assert "inside the run directory" in capsys.readouterr().err
    assert main(["report", str(runs[0])]) == 0 and (runs[0] / "report.html").is_file()  # one run: its own page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs it: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium(tmp_path):
    page = write_runs_report(_runs(tmp_path), tmp_path / "both.html")
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    widths = re.search(r'data-image-widths="([\d,]*)"', dom.stdout)
    assert widths and all(int(w) > 500 for w in widths.group(1).split(",")), "curve image did not decode"
    screenshot = tmp_path / "runs.png"
    shot = _chromium(tmp_path, "--window-size=1200,1600", f"--screenshot={screenshot}", page.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:4] == b"\x89PNG" and screenshot.stat().st_size > 30_000
