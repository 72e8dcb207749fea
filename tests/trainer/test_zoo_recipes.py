"""The DRO and DPPO-Binary-KL recipes train end to end: a few steps each, from the shipped warm start."""

import json
import math
from pathlib import Path

import pytest
import yaml

from rlvr.cli import main

ROOT = Path(__file__).resolve().parents[2]
FAST = ["trainer.steps=3", "trainer.eval_every=0", "trainer.save_every=0", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "trainer.threads=1", "algo.dynamic_sampling=false", "task.heldout_size=4",
        "rollout.decode_engine=eager", "trainer.kernels=eager"]


@pytest.mark.parametrize("recipe,objective,advantage", [("dro", "dro", "dr_grpo"), ("dppo_kl", "dppo_kl", "grpo")])
def test_recipe_runs_a_few_steps(recipe, objective, advantage, tmp_path, capsys):
    code = main(["train", str(ROOT / "recipes" / f"{recipe}_countdown.yaml"), f"trainer.out_dir={tmp_path}",
                 f"trainer.name={recipe}", *FAST])
    assert code == 0, capsys.readouterr().err
    run = tmp_path / recipe
    algo = yaml.safe_load((run / "config.yaml").read_text())["algo"]
    assert (algo["objective"], algo["advantage"], algo["clip_low" if recipe == "dppo_kl" else "dro_beta"]) == (
        objective, advantage, 0.2 if recipe == "dppo_kl" else 0.05)
    steps = [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "actor/grad_norm" in m]
    assert len(steps) == 3
    for m in steps:
        assert math.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0
        # two minibatches: the second trains against an old policy the first has moved away from
        assert m["actor/old_policy_kl"] != 0  # a k1 estimate: either sign
