"""Run folders and output paths as a user's disk holds them: a report never replaces a file rlvr did not
write (without --force), and a run config of another shape is one line from every command that reads it."""

from __future__ import annotations

import pytest
from cli_lines import cli, one_line
from fake_runs import make_run


@pytest.fixture
def two_runs(tmp_path):
    return [make_run(tmp_path, f"r{seed}", seed=seed, steps=5) for seed in (0, 1)]


@pytest.mark.parametrize("where", ["beside the first run", "--out"])
def test_a_report_keeps_a_file_the_user_had(where, two_runs, tmp_path, capsys):
    mine = tmp_path / ("report.html" if where == "beside the first run" else "notes.html")
    mine.write_text("my notes\n")
    argv = ["report", *map(str, two_runs)] + (["--out", str(mine)] if where == "--out" else [])
    one_line(*cli(argv, capsys), "is not a report rlvr wrote", "--force")
    assert mine.read_text() == "my notes\n"
    assert cli([*argv, "--force"], capsys)[0] == 0 and "rlvr report" in mine.read_text()
    assert cli(argv, capsys)[0] == 0  # a page rlvr wrote is rewritten as before


def test_a_single_runs_own_report_is_rewritten(two_runs, capsys):
    (two_runs[0] / "report.html").write_text("stale\n")  # inside the run: the run's own page
    assert cli(["report", str(two_runs[0])], capsys)[0] == 0
    assert "rlvr report" in (two_runs[0] / "report.html").read_text()


@pytest.mark.parametrize("argv", [["runs", "list"], ["report"], ["runs", "compare"]])
def test_a_config_section_of_another_shape_is_one_line(argv, two_runs, tmp_path, capsys):
    (two_runs[0] / "config.yaml").write_text("seed: 0\ntrainer: [1, 2]\n")
    extra = ["--out", str(tmp_path / "cmp")] if argv[-1] == "compare" else []
    one_line(*cli([*argv, *map(str, two_runs), *extra], capsys), "'trainer' is a list, not a section or a value")


@pytest.mark.parametrize("how", ["name_too_long", "file_in_the_path"])
@pytest.mark.parametrize("command", ["report", "compare", "plot"])
def test_an_output_path_the_os_refuses_is_one_line(command, how, two_runs, tmp_path, capsys):
    (tmp_path / "plain").write_text("x\n")
    out = tmp_path / ("b" * 300 if how == "name_too_long" else "plain/out")
    argv = {"report": ["report", *map(str, two_runs), "--out", f"{out}.html"],
            "compare": ["runs", "compare", *map(str, two_runs), "--out", str(out)],
            "plot": ["runs", "plot", *map(str, two_runs), "--out", f"{out}.png"]}[command]
    says = "longer than the file system allows" if how == "name_too_long" else "a part of it is a file, not a folder"
    one_line(*cli(argv, capsys), "cannot use the path", says, "choose another path")
    assert (tmp_path / "plain").read_text() == "x\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from fake_runs import tiny_run_args

    from rlvr.cli import main

    root = tmp_path_factory.mktemp("trained")
    assert main(["train", *tiny_run_args(steps=1), f"trainer.out_dir={root}", "trainer.name=run"]) == 0
    return root / "run"


def test_a_killed_export_leaves_no_temp_folder(trained, tmp_path, capsys, monkeypatch):
    import os
    import signal

    import rlvr.tracking.export as export

    def mark_then_term(folder, command):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(export, "mark_made", mark_then_term)
    code, err = cli(["export", str(trained), str(tmp_path / "out")], capsys)
    assert code == 143 and "SIGTERM" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the export nor its temp folder


def test_two_exports_to_one_folder_do_not_both_succeed(trained, tmp_path, capsys, monkeypatch):
    """The other export renames its folder into place while this one writes: this one says so and
    leaves that one as it is (once it silently replaced it, and both exited 0)."""
    import rlvr.tracking.export as export

    out = tmp_path / "out"
    made = export.mark_made

    def the_other_finishes_first(folder, command):
        made(folder, command)
        out.mkdir()
        (out / "theirs.txt").write_text("the other export\n")

    monkeypatch.setattr(export, "mark_made", the_other_finishes_first)
    one_line(*cli(["export", str(trained), str(out)], capsys), "was written by another command while this export ran")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
