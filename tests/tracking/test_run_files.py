"""A run folder edited by hand, copied or damaged: every tool that reads it answers with one line
naming the file (and the line) and the fix, never a traceback. The tools that only read (`runs
list`, `runs compare`, `report`) skip a bad metrics line or an unreadable run.json with a warning
and go on; the commands that continue a run (`train --resume`) stop, and change nothing.

One real 2-step run (a checkpoint per step) is trained once and copied per test."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from fake_runs import tiny_run_args

from rlvr.cli import main

TINY = tiny_run_args(steps=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    assert main(["train", *TINY, f"trainer.out_dir={root}", "trainer.name=r"]) == 0
    return root / "r"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "r")
    return tmp_path / "r"


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def _checksums_string(run: Path) -> None:
    for step in run.glob("checkpoints/step_*"):
        (step / "checksums.json").write_text('"not a mapping"')


def _tear_middle_line(run: Path) -> None:
    """Line 2 cut short, lines after it whole: not a last line being written, so it is reported."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")


def _replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE = {  # name -> how a user (or a crash, or a copy) left the run
    "torn_middle_line": _tear_middle_line,
    "json_array_line": lambda r: _append(r / "metrics.jsonl", b"[1, 2]\n" + json.dumps({"step": 3}).encode() + b"\n"),
    "non_utf8_line": lambda r: _append(r / "metrics.jsonl", b'{"step": 3, "note": "\xff\xfe"}\n'),
    "string_step": lambda r: _append(r / "metrics.jsonl", b'{"step": "x", "reward/mean": "high"}\n'),
    "empty_run_json": lambda r: (r / "run.json").write_text(""),
    "run_json_array": lambda r: (r / "run.json").write_text("[1]"),
    "run_json_directory": lambda r: _replace_with_directory(r / "run.json"),
    "metrics_directory": lambda r: _replace_with_directory(r / "metrics.jsonl"),
    "empty_config": lambda r: (r / "config.yaml").write_text(""),
    "config_list": lambda r: (r / "config.yaml").write_text("- 1\n"),
    "config_not_utf8": lambda r: (r / "config.yaml").write_bytes(b"seed: \xff\n"),
    "lock_directory": lambda r: (r / ".lock").mkdir(),
    "checksums_string": _checksums_string,
    "checkpoints_file": lambda r: (shutil.rmtree(r / "checkpoints"), (r / "checkpoints").write_text("x")),
}

# (damage, command) -> (exit code, what stderr's line must say). Exit 0: a warning, then the tool's output.
LIST, COMPARE, REPORT, RESUME, EVAL, EXPORT = "list", "compare", "report", "resume", "eval", "export"
EXPECTED = {
    **{(d, c): (0, "metrics.jsonl' line 4 is a JSON list, not an object; skipped") for d, c in
       [("json_array_line", LIST), ("json_array_line", COMPARE), ("json_array_line", REPORT)]},
    ("torn_middle_line", COMPARE): (0, "metrics.jsonl' line 2 is not valid JSON; skipped"),
    ("torn_middle_line", RESUME): (2, "metrics.jsonl' line 2 is not valid JSON; repair or remove that line"),
    ("json_array_line", RESUME): (2, "metrics.jsonl' line 4 is a JSON list, not an object; repair or remove"),
    ("non_utf8_line", COMPARE): (0, "metrics.jsonl' line 4 is not UTF-8 text"),
    ("non_utf8_line", RESUME): (2, "metrics.jsonl' line 4 is not UTF-8 text"),
    ("string_step", LIST): (0, "metrics.jsonl' line 4 has step 'x', not an integer"),
    ("string_step", RESUME): (2, "metrics.jsonl' line 4 has step 'x', not an integer"),
    ("empty_run_json", LIST): (0, "run.json' is empty; restore it"),
    ("empty_run_json", REPORT): (0, "run.json' is empty; restore it"),
    ("empty_run_json", RESUME): (2, "run.json' is empty; restore it"),
    ("run_json_array", COMPARE): (0, "run.json' is a JSON list, not an object"),
    ("run_json_array", RESUME): (2, "run.json' is a JSON list, not an object"),
    ("run_json_directory", LIST): (0, "run.json' is a directory, not a regular file"),
    ("run_json_directory", RESUME): (2, "run.json' is a directory, not a regular file"),
    ("metrics_directory", LIST): (2, "metrics.jsonl' is a directory, not a regular file"),
    ("metrics_directory", RESUME): (2, "metrics.jsonl' is a directory, not a regular file"),
    ("empty_config", LIST): (2, "config.yaml' is empty"),
    ("empty_config", RESUME): (2, "config.yaml' is empty"),
    ("config_list", COMPARE): (2, "config.yaml' is a list, not a mapping"),
    ("config_not_utf8", REPORT): (2, "config.yaml' is not UTF-8 text"),
    ("lock_directory", RESUME): (2, ".lock' is a directory; rlvr locks only a file it creates: remove it"),
    ("checksums_string", RESUME): (2, "is corrupt (missing or unreadable checksums.json)"),
    ("checkpoints_file", RESUME): (2, "checkpoints' is not a folder; move it away"),
    ("checkpoints_file", EVAL): (2, "checkpoints' is not a folder; move it away"),
    ("checkpoints_file", EXPORT): (2, "checkpoints' is not a folder; move it away"),
    ("empty_config", EVAL): (2, "config.yaml' is empty"),
    ("run_json_array", EVAL): (0, "run.json' is a JSON list, not an object"),
    ("empty_run_json", EXPORT): (0, "run.json' is empty; restore it"),
}


def _argv(command: str, run: Path, tmp: Path) -> list[str]:
    return {LIST: ["runs", "list", str(run)], COMPARE: ["runs", "compare", str(run), "--out", str(tmp / "cmp")],
            REPORT: ["report", str(run), "--out", str(tmp / "report.html")],
            RESUME: ["train", "--resume", str(run), "trainer.steps=3"], EVAL: ["eval", str(run), "--n", "1"],
            EXPORT: ["export", str(run), str(tmp / "exported")]}[command]


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("damage", "command"), list(EXPECTED), ids=[f"{d}-{c}" for d, c in EXPECTED])
def test_damage_is_one_line(damage, command, run, tmp_path, capsys):
    DAMAGE[damage](run)
    before = _snapshot(run)
    capsys.readouterr()
    code = main(_argv(command, run, tmp_path))
    out, err = capsys.readouterr()
    want_code, text = EXPECTED[(damage, command)]
    assert "Traceback" not in out + err
    assert code == want_code, (out, err)
    mine = [line for line in err.splitlines() if text in line]
    assert len(mine) == 1, err
    if want_code == 2:
        assert err.count("\n") == 1 and err.startswith("error: ") and str(run) in err, err
        assert _snapshot(run) == before  # a refused command changes nothing
    else:
        assert mine[0].startswith("warning: ") and str(run) in mine[0]
        assert out.strip()  # and the tool went on to print its table or path


def test_a_skipped_line_leaves_the_others_in_the_tables(run, capsys):
    """The lines around the bad one still count: the line after it (step 3) is the run's last step."""
    DAMAGE["json_array_line"](run)
    capsys.readouterr()
    assert main(["runs", "list", str(run)]) == 0
    out, err = capsys.readouterr()
    assert " 3/2 " in out, out


def test_a_damaged_run_in_a_folder_of_runs_is_skipped_with_a_warning(run, trained, tmp_path, capsys):
    shutil.copytree(trained, tmp_path / "r2")
    (run / "config.yaml").write_text("")
    capsys.readouterr()
    assert main(["runs", "list", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "config.yaml' is empty" in err and "that run is skipped" in err
    assert str(tmp_path / "r2") in out and str(run) + " " not in out


def test_a_copy_beside_the_checkpoints_is_ignored_and_kept(run, capsys):
    """`step_000002.bak` once crashed a resume (`int('000002.bak')`); pruning could have deleted it."""
    shutil.copytree(run / "checkpoints" / "step_000002", run / "checkpoints" / "step_000002.bak")
    (run / "checkpoints" / "notes.txt").write_text("mine")
    kept = _snapshot(run / "checkpoints" / "step_000002.bak")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 0  # keeps the last 2
    _, err = capsys.readouterr()
    assert "ignoring notes.txt, step_000002.bak in" in err and "Traceback" not in err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["notes.txt", "step_000002.bak", "step_000003",
                                                                      "step_000004"]
    assert _snapshot(run / "checkpoints" / "step_000002.bak") == kept
    assert (run / "checkpoints" / "notes.txt").read_text() == "mine"
