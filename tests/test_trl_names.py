"""TRL's GRPOConfig names: accepted bare and resolved to the rlvr fields with the same meaning;
suggestions by meaning for the same names inside a section; a value the chosen methods do not read
refused naming who reads it; docs/migrating-from-trl.md current, its commands and script run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr.cli import main
from rlvr.config import load_config, load_with_sources
from rlvr.config.reference import trl_page
from rlvr.config.registries import _get
from rlvr.config.trl_names import TRL_NAMES
from rlvr.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "migrating-from-trl.md"
NEEDS = {"algo.tau_pos": ["loss_type=sapo"], "algo.tau_neg": ["loss_type=sapo"]}  # read by sapo only


def test_the_migration_table_is_current():
    assert trl_page(PAGE.read_text()) == PAGE.read_text(), "python -m rlvr.config --trl-page docs/migrating-from-trl.md"


def test_every_trl_name_resolves_to_its_rlvr_fields():
    for t in TRL_NAMES.values():
        if t.key:
            value = {int: 2, bool: True, str: "out"}.get(type(_get(load_config(), t.key)), 0.37)
            config = load_config(overrides=[f"{t.trl}={json.dumps(value)}", *NEEDS.get(t.key, [])])
            assert _get(config, t.key) == value, t.trl
        for option, fields in t.choices.items():
            config = load_config(overrides=[f"{t.trl}={json.dumps(option)}"])
            assert {k: _get(config, k) for k in fields} == dict(fields), (t.trl, option)
        if not t.key and not t.choices:
            with pytest.raises(ConfigError, match=f"^{t.trl} \\(TRL's GRPOConfig\\) has no rlvr field: "):
                load_config(overrides=[f"{t.trl}=4"])


def test_trl_defaults_in_the_table_are_trls():
    trl = pytest.importorskip("trl")
    import dataclasses

    fields = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    wrong = {t.trl: (t.trl_default, fields.get(t.trl, "absent")) for t in TRL_NAMES.values()
             if fields.get(t.trl, "absent") != t.trl_default}
    assert not wrong, f"(table, trl {trl.__version__}): {wrong}"


def test_epsilon_sets_both_clips_unless_epsilon_high_is_given_and_recipes_accept_the_names():
    both = load_config(overrides=["epsilon=0.3"])
    assert (both.algo.clip_low, both.algo.clip_high) == (0.3, 0.3)
    apart = load_config(overrides=["epsilon_high=0.28", "epsilon=0.3"])
    assert (apart.algo.clip_low, apart.algo.clip_high) == (0.3, 0.28)
    recipe = load_config({"num_generations": 4, "loss_type": "dr_grpo", "rollout": {"prompts_per_step": 2}})
    assert recipe.rollout.group_size == 4 and recipe.algo.aggregation == "seq_mean_token_sum_norm"
    _, sources = load_with_sources(None, ["num_generations=4"])
    assert sources["rollout.group_size"] == "override num_generations=4"


@pytest.mark.parametrize("override, hint", [
    ("algo.beta=0.04", "did you mean 'algo.kl_coef' (TRL's beta"),
    ("rollout.num_generations=4", "did you mean 'rollout.group_size' (TRL's num_generations"),
    ("algo.loss_type=dapo", "did you mean 'algo.aggregation' / 'algo.objective' (TRL's loss_type"),
    ("trainer.gradient_accumulation_steps=4", "has no rlvr field: rlvr accumulates by itself"),
    ("algo.max_completion_length=64", "did you mean 'rollout.max_new_tokens'"),
])
def test_trl_names_inside_a_section_are_suggested_by_meaning(override, hint):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert hint in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, message", [
    (["algo.tau_pos=2.0"], "algo.tau_pos=2.0: read only by algo.objective=sapo (algo.objective is 'ppo_clip')"),
    (["estimator.beta=0.04"], "estimator.beta=0.04: read only by estimator.name=spg (estimator.name is "
                              "'mean_field'; likelihood estimators run with model.kind=diffusion only)"),
    (["algo.correction_cap=2.0"], "algo.correction_cap=2.0: read only by algo.rollout_correction=true"),
    (["model.kind=diffusion", "estimator.n=4"], "estimator.n=4: read only by estimator.name=elbo_mc"),
])
def test_a_value_the_chosen_methods_do_not_read_is_refused_naming_who_reads_it(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert str(err.value).startswith(message)


def test_values_the_chosen_methods_read_are_kept():
    assert load_config(overrides=["algo.objective=sapo", "algo.tau_pos=2.0"]).algo.tau_pos == 2.0
    config = load_config(overrides=["model.kind=diffusion", "estimator.name=spg", "estimator.beta=0.5"])
    assert config.estimator.beta == 0.5
    assert load_config(overrides=["algo.norm_length=8", "algo.aggregation=token_mean"]).algo.norm_length == 8.0


def test_the_pages_commands_run(capsys):
    lines = re.search(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL).group(1).splitlines()
    outputs = []
    for line in lines:
        assert line.startswith("rlvr ")
        assert main(line.split()[1:]) == 0, line
        outputs.append(capsys.readouterr().out)
    assert "group_size: 4" in outputs[0] and "aggregation: seq_mean_token_sum_norm" in outputs[0]
    assert "kl_coef: 0.04" in outputs[0] and "std_normalize: false" in outputs[0]
    assert re.search(r"algo\.clip_high\s+0\.28\s+override epsilon_high=0\.28", outputs[1])


def test_the_pages_script_runs_trl_rewards_with_trl_names(tmp_path):
    script = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL).group(1)
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1])})
    assert run.returncode == 0, run.stderr[-2000:]
    length, right = map(float, run.stdout.split()[-2:])
    assert length < 0 and 0 <= right <= 1
    config = (tmp_path / "runs" / "grpo_dataset_s0" / "config.yaml").read_text()
    assert "group_size: 4" in config and "kl_coef: 0.04" in config and "steps: 4" in config
