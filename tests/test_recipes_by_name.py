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
