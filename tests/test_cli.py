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


def test_config_explain_shows_the_field_value_and_source_of_each_keyword(capsys):
    recipe = "recipes/dapo_countdown.yaml"
    assert main(["config", "--explain", recipe, "algo.clip_low=0.1", "rollout.group_size=4"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    starts = [header.index(name) for name in ("entry", "keyword", "field", "value", "source")]
    assert header.split() == ["entry", "keyword", "field", "value", "source"]
    lines = [[row[a:b].strip() for a, b in zip(starts, [*starts[1:], None])] for row in rows]  # aligned columns
    objective = [line[1:] for line in lines if line[0] == "algo.objective=ppo_clip"]
    assert objective == [["clip_low", "algo.clip_low", "0.1", "override algo.clip_low=0.1"],
                         ["clip_high", "algo.clip_high", "0.28", f"recipe {recipe}"],
                         ["dual_clip", "(entry default)", "null", "entry default"],
                         ["log_ratio_clamp", "algo.log_ratio_clamp", "20.0", "entry default"]]
    assert ["algo.aggregation=token_mean", "num_tokens", "(data)", "-", "-"] in lines
    assert ["task.name=countdown", "seed", "seed", "0", "config default"] in lines


@pytest.mark.parametrize("argv", [["algo.clip_hihg=0.3"], ["algo.objective=nope"], ["rollout.group_size=1"],
                                  ["recipes/missing.yaml"], ["algo.clip_high"]])
def test_config_explain_reports_bad_input_as_config_does(capsys, argv):
    assert _error(capsys, ["config", "--explain", *argv]) == _error(capsys, ["config", *argv])


@pytest.mark.parametrize("override, field", [
    ("sampler.name=best", "sampler.name"),
    ("sampler.candidates=0.5", "sampler.candidates"),
    ("sampler.decay=1.5", "sampler.decay"),
    ("task.countdown.partial_credit=loose", "task.countdown.partial_credit"),
    ("trainer.eval_samples=-1", "trainer.eval_samples"),
])
def test_selection_and_credit_choices_are_checked(capsys, override, field):
    assert field in _error(capsys, ["config", override])


def test_options_and_overrides_in_any_order():
    from rlvr.cli import parse_args

    args = parse_args(["sft", "model.path=", "--out", "w", "sft.steps=300"])
    assert args.out == "w" and args.args == ["model.path=", "sft.steps=300"]
    args = parse_args(["train", "seed=3", "--resume", "runs/x", "trainer.steps=4"])
    assert args.resume == "runs/x" and args.args == ["seed=3", "trainer.steps=4"]
    args = parse_args(["train", "recipes/grpo_countdown.yaml", "--resume", "r", "seed=1"])
    assert args.args == ["recipes/grpo_countdown.yaml", "seed=1"]


@pytest.mark.parametrize("argv", [["train", "seed=3", "--bogus"], ["eval", "runs/x", "seed=3"]])
def test_unknown_options_and_stray_words_are_still_errors(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_train_is_the_python_api(monkeypatch):
    import rlvr.api

    made = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            made.append((args, kwargs))

        def train(self):
            return {}

    monkeypatch.setattr(rlvr.api, "Trainer", Recorder)
    assert main(["train", "recipes/grpo_countdown.yaml", "seed=3", "trainer.steps=2"]) == 0
    (_, kwargs), = made
    assert kwargs["config"] == "recipes/grpo_countdown.yaml" and kwargs["overrides"] == ["seed=3", "trainer.steps=2"]


def test_resume_with_overrides_after_the_option(tmp_path, capsys):
    import json

    base = ["trainer.eval_every=0", "task.heldout_size=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "trainer.threads=1", f"trainer.out_dir={tmp_path}", "trainer.name=r"]
    assert main(["train", "trainer.steps=2", *base]) == 0
    assert main(["train", "--resume", str(tmp_path / "r"), "trainer.steps=3"]) == 0, capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    assert "resume: " in _error(capsys, ["train", "--resume", str(tmp_path / "nothing")])


@pytest.mark.parametrize("module", ["rlvr", "rlvr.cli"])
def test_python_m_rlvr_is_the_command(module):
    """`python -m rlvr` (what `torchrun ... -m rlvr train` runs) is the `rlvr` command, and the older
    `-m rlvr.cli` still works: same config printed, same one-line error and exit code 2."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    ok = subprocess.run([sys.executable, "-m", module, "config", "rollout.group_size=3"], capture_output=True,
                        text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "group_size: 3" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", module, "config", "rollout.group_size=1"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: rollout.group_size") and bad.stderr.count("\n") == 1
