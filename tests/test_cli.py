"""Bad input: one line on stderr naming the field and the fix, exit code 2, no traceback."""

import pytest

from rlvr.cli import main


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


def test_unknown_key_suggests_the_closest(capsys):
    assert "did you mean 'algo.clip_high'" in _error(capsys, ["train", "algo.clip_hihg=0.3"])


def test_wrong_type(capsys):
    assert "trainer.steps: expected int" in _error(capsys, ["train", "trainer.steps=many"])


def test_negative_learning_rate(capsys):
    assert "optim.lr" in _error(capsys, ["train", "optim.lr=-1e-5"])


def test_group_size_below_two(capsys):
    assert "rollout.group_size" in _error(capsys, ["train", "rollout.group_size=1"])


def test_model_path_missing(capsys, tmp_path):
    err = _error(capsys, ["train", f"model.path={tmp_path / 'nope'}", f"trainer.out_dir={tmp_path}"])
    assert "model.path" in err


def test_malformed_recipe(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  clip_high: [0.2\n")
    assert "not valid YAML" in _error(capsys, ["train", str(bad)])


def test_missing_recipe(capsys, tmp_path):
    assert "does not exist" in _error(capsys, ["train", str(tmp_path / "missing.yaml")])


def test_unknown_registry_name_lists_valid_ones(capsys, tmp_path):
    err = _error(capsys, ["train", "algo.advantage=nope", f"trainer.out_dir={tmp_path}"])
    assert "algo.advantage" in err and "grpo" in err


@pytest.mark.parametrize("recipe_text", ["- a\n- b\n", "model: 3\n"])
def test_recipe_with_wrong_shape(capsys, tmp_path, recipe_text):
    bad = tmp_path / "shape.yaml"
    bad.write_text(recipe_text)
    _error(capsys, ["train", str(bad)])


def test_config_prints_resolved_values(capsys):
    assert main(["config", "algo.clip_high=0.28", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert "clip_high: 0.28" in out and "seed: 3" in out


@pytest.mark.parametrize("override, field", [
    ("rollout.prompt_selection=best", "rollout.prompt_selection"),
    ("rollout.selection_candidates=0.5", "rollout.selection_candidates"),
    ("rollout.selection_decay=1.5", "rollout.selection_decay"),
    ("task.countdown.partial_credit=loose", "task.countdown.partial_credit"),
    ("trainer.eval_samples=-1", "trainer.eval_samples"),
])
def test_selection_and_credit_choices_are_checked(capsys, override, field):
    assert field in _error(capsys, ["config", override])
