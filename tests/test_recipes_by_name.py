"""Packaged recipes: `rlvr recipes` lists what the package ships (recipes/ through src/rlvr/recipes),
`rlvr train NAME` runs one from any directory, and paths still work."""

from __future__ import annotations

import tomllib
from pathlib import Path

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.config.recipes import packaged_recipe, packaged_recipes

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["trainer.steps=1", "trainer.eval_every=0", "task.heldout_size=4", "rollout.prompts_per_step=2",
         "rollout.group_size=2", "trainer.threads=1", "rollout.max_new_tokens=4"]


def test_the_package_ships_every_recipe_of_the_repository():
    shipped = packaged_recipes()
    assert sorted(shipped) == sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert all(p.read_text() == (ROOT / "recipes" / p.name).read_text() for p in shipped.values())
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "recipes/*.yaml" in package_data["rlvr"]  # what a wheel copies from src/rlvr/recipes


def test_rlvr_recipes_lists_names_with_their_header_line(capsys):
    assert main(["recipes"]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == set(packaged_recipes())
    assert lines["dapo_countdown"].startswith("DAPO: clip-higher, token-level loss")


def test_names_and_paths_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ here
    by_path = load_config(ROOT / "recipes" / "dapo_countdown.yaml")
    assert load_config("dapo_countdown") == by_path and load_config("dapo_countdown.yaml") == by_path
    assert load_config("recipes/dapo_countdown.yaml") == by_path  # the README's path, from anywhere
    assert packaged_recipe("other/dapo_countdown.yaml") is None and packaged_recipe("nope") is None
    (tmp_path / "dapo_countdown.yaml").write_text("seed: 7\n")  # a file that exists is read as it is
    assert load_config("dapo_countdown.yaml").seed == 7


def test_rlvr_train_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "dapo_countdown", *SHORT]) == 0
    run = tmp_path / "runs" / "dapo_countdown_s0"
    assert (run / "config.yaml").is_file() and "aggregation: token_mean" in (run / "config.yaml").read_text()
    assert main(["train", "no_such_recipe"]) == 2
    assert "packaged recipe's name, e.g. grpo_countdown (`rlvr recipes` lists them)" in capsys.readouterr().err


def _files(config) -> list[str]:
    """Every file or folder a config names: data and model paths (packaged `rlvr:` checkpoints too)."""
    import dataclasses

    from rlvr.config.paths import RECIPE_RELATIVE
    from rlvr.models.causal_lm import ASSETS, BUILTIN_PREFIX, REQUIRED

    out, stack = [], [config]
    while stack:
        node = stack.pop()
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                stack.append(value)
            elif f.name in RECIPE_RELATIVE and isinstance(value, str) and value and value != REQUIRED:
                out.append(str(ASSETS / value[len(BUILTIN_PREFIX):]) if value.startswith(BUILTIN_PREFIX) else value)
    return out


def test_every_packaged_recipe_finds_its_files_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/, no recipes/, no tests/ here
    checked = 0
    for name, path in packaged_recipes().items():
        files = _files(load_config(name))
        missing = [f for f in files if not Path(f).exists()]
        assert not missing, f"{name}: {missing} not found from an empty folder"
        assert "python tests/" not in path.read_text(), f"{name} runs a script of the repository's tests/"
        checked += len(files)
    assert checked >= 60  # the packaged checkpoints of most recipes, the fixtures of the file tasks
    fixture = load_config("gsm8k_fixture").task.math_file.path
    assert Path(fixture).parent == packaged_recipe("gsm8k_fixture").parent / "data"


def test_a_file_task_recipe_trains_by_name_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "gsm8k_fixture", *SHORT]) == 0
    assert (tmp_path / "runs" / "gsm8k_fixture_s0" / "checkpoints" / "step_000001").is_dir()
    (tmp_path / "data").mkdir()  # a recipe of the user's own reads its data beside itself, not the cwd's
    own = tmp_path / "mine"
    (own / "data").mkdir(parents=True)
    (own / "data" / "rows.jsonl").write_text((ROOT / "data" / "gsm8k_fixture.jsonl").read_text())
    (own / "r.yaml").write_text("task:\n  name: math_file\n  math_file:\n    path: data/rows.jsonl\n")
    assert load_config(own / "r.yaml").task.math_file.path == str(own / "data" / "rows.jsonl")
