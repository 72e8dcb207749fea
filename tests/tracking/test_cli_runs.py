"""`rlvr runs list|compare|plot`: fake 2 recipes × 3 seeds, no training."""

from __future__ import annotations

import argparse
import csv

import pytest
from fake_runs import make_run

from rlvr.cli_runs import register
from rlvr.errors import ConfigError

# Labels name the keys in which the groups' resolved configs differ, less those that follow the
# objective (its own clip widths), by their last part.
PPO = "objective=ppo_clip"
GSPO = "objective=gspo"


def run_cli(argv: list[str]) -> int:
    """What `rlvr.cli.main` does once its parser() calls register(sub)."""
    parser = argparse.ArgumentParser(prog="rlvr")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as err:
        print(f"error: {err}")
        return 2


def test_compare_groups_by_recipe_prints_table_and_writes_plot(fake_runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run_cli(["runs", "compare", str(fake_runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table[0].startswith("| recipe | seeds | steps | eval/heldout_accuracy (final)")
    rows = {line.split("|")[1].strip(): line for line in table[2:]}
    assert set(rows) == {PPO, GSPO}  # seeds grouped, not 6 rows
    assert all("| 3 |" in row and "±" in row for row in rows.values())

    with open(out / "compare.csv") as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == 2 * 2 * 2  # groups × metrics × (final, auc)
    gspo = next(r for r in records if r["recipe"] == GSPO and r["metric"] == "eval/heldout_accuracy"
                and r["statistic"] == "auc")
    ppo = next(r for r in records if r["recipe"] == PPO and r["metric"] == "eval/heldout_accuracy"
               and r["statistic"] == "auc")
    assert gspo["n"] == "3" and gspo["seeds"] == "0 1 2"
    assert float(gspo["mean"]) > float(ppo["mean"])  # synthetic gspo curves rise faster
    assert float(gspo["ci95_low"]) < float(gspo["mean"]) < float(gspo["ci95_high"])
    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_single_recipe_gets_its_run_name_and_a_note(tmp_path, capsys):
    for seed in (0, 1):
        make_run(tmp_path / "r", f"grpo_countdown_s{seed}", seed=seed)
    assert run_cli(["runs", "compare", str(tmp_path / "r"), "--out", str(tmp_path / "c"),
                    "--metric", "reward/mean"]) == 0
    printed = capsys.readouterr().out
    assert "| grpo_countdown | 2 |" in printed


def test_plot_with_smoothing(fake_runs, tmp_path, capsys):
    path = tmp_path / "p" / "reward.png"
    argv = ["runs", "plot", str(fake_runs), "--metric", "reward/mean", "--smooth", "5", "--out", str(path)]
    assert run_cli(argv) == 0
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_list_shows_each_run(fake_runs, capsys):
    make_run(fake_runs, "crashed_s9", seed=9, steps=12, status="running")
    assert run_cli(["runs", "list", str(fake_runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "status", "step", "seed"]
    assert len(lines) == 1 + 7
    crashed = next(line for line in lines if "crashed_s9" in line)
    assert "running" in crashed and "12/12" in crashed and "01234567" in crashed


@pytest.mark.parametrize("argv, message", [
    (["runs", "compare", "MISSING"], "does not exist"),
    (["runs", "list", "."], "no run directories"),
    (["runs", "compare", "RUNS", "--metric", "reward/meen"], "'reward/meen' is not logged"),
])
def test_user_mistakes_are_one_line_errors(fake_runs, tmp_path, monkeypatch, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    argv = [str(fake_runs) if a == "RUNS" else a for a in argv]
    assert run_cli(argv) == 2
    assert message in capsys.readouterr().out
