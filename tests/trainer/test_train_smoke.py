"""End-to-end runs through `rlvr train` (in-process, tiny budgets)."""

import json
import math
import platform
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.cli import main

WARM_START = Path(__file__).resolve().parents[2] / "src" / "rlvr" / "assets" / "countdown-warmstart"
STEP_AREAS = {"actor", "adv", "batch", "loss", "perf", "response", "reward", "time"}  # on every step's line


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_run_dir(run_dir: Path, steps: int) -> None:
    """What every finished run leaves behind: the resolved config, a finished manifest, one metrics
    line per step (after the step-0 evaluation) with every area and finite losses, samples of every
    step, and a verified checkpoint of the trained weights that loads."""
    from transformers import AutoModelForCausalLM

    from rlvr.config import load_config
    from rlvr.trainer.checkpoint import verify_checkpoint

    assert load_config(run_dir / "config.yaml").trainer.steps == steps  # the resolved config loads back
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "finished" and manifest["exit_status"] == 0 and manifest["final"]["step"] == steps

    lines = _metrics(run_dir)
    assert [m["step"] for m in lines] == list(range(steps + 1))  # line 0: the evaluation before step 1
    assert {k.split("/")[0] for k in lines[0] if k != "step"} == {"eval", "time"}
    for m in lines[1:]:
        assert STEP_AREAS <= {k.split("/")[0] for k in m if k != "step"}, sorted(m)
        assert all(math.isfinite(m[k]) for k in ("loss/policy", "actor/grad_norm", "actor/entropy")), m
    assert manifest["final"] == lines[-1]

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == set(range(1, steps + 1))
    assert all(isinstance(s["prompt"], str) and isinstance(s["completion"], str) and "reward" in s for s in samples)

    (checkpoint,) = sorted((run_dir / "checkpoints").iterdir())
    assert checkpoint.name == f"step_{steps:06d}" and verify_checkpoint(checkpoint) is None
    trained = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    start = load_file(str(WARM_START / "model.safetensors"))
    assert start.keys() <= trained.keys() and all(trained[k].shape == v.shape for k, v in start.items())
    assert all(torch.isfinite(v).all() for v in trained.values())
    assert any(not torch.equal(trained[k], v) for k, v in start.items())  # the steps moved the weights


def test_user_reward_loaded_by_path_drives_a_real_run(tmp_path, capsys):
    # A user reward that pays for short completions and reports an extra metric; it raises on
    # completions containing '9' (those samples are excluded and counted, the run continues).
    (tmp_path / "my_rewards.py").write_text(
        "def score(prompt, completion, **example):\n"
        "    if '9' in completion:\n"
        "        raise ValueError('no nines')\n"
        "    return {'reward': 1.0 / (1 + len(completion)), 'has_plus': float('+' in completion)}\n")
    code = main(["train", f"reward.fn={tmp_path / 'my_rewards.py'}:score", "trainer.steps=2",
                 "trainer.eval_every=0", f"trainer.out_dir={tmp_path}", "trainer.name=user",
                 "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.eval_samples=2"])
    assert code == 0, capsys.readouterr().err
    _check_run_dir(tmp_path / "user", steps=2)
    last = _metrics(tmp_path / "user")[-1]
    assert 0 < last["reward/mean"] <= 1.0
    assert "reward/user/has_plus" in last and "reward/user/errors" in last
    assert 0 <= last["eval/heldout_sampled_accuracy"] <= last["eval/heldout_pass_at_k"] <= 1  # avg@2 <= pass@2
    # run.json says which decode engine ran, not only which one the config asked for.
    runtime = json.loads((tmp_path / "user" / "run.json").read_text())["runtime"]
    assert runtime["decode_engine"] == "cpp" and isinstance(runtime["decode_engine_fallbacks"], list)
    # glibc was told to keep freed memory mapped (allocation only: no computed value changes).
    assert runtime["heap_kept"] is (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")


def test_every_recipe_loads_and_builds(tmp_path):
    from rlvr.builder import build
    from rlvr.config import REGISTRY, load_config

    def entry(fn):  # the registry entry under its bound hyperparameters
        while hasattr(fn, "func"):
            fn = fn.func
        return fn

    recipes = sorted(ROOT.glob("recipes/*.yaml"))
    assert len(recipes) >= 40, recipes
    for recipe in recipes:
        config = load_config(recipe)
        loss, advantage = build.build_loss(config), build.build_advantage(config)
        for key, built in (("algo.objective", loss.objective), ("algo.aggregation", loss.aggregation),
                           ("algo.advantage", advantage.estimate)):
            section, field = key.split(".")
            assert entry(built) is REGISTRY[key].get(getattr(getattr(config, section), field)), (recipe.name, key)


ROOT = Path(__file__).resolve().parents[2]
# model.path=??? (the user's model): run on a tiny Qwen2 by tests/models/test_real_model_recipe.py.
USER_MODEL = {"gsm8k_real_model.yaml", "gsm8k_tiny_qwen2.yaml"}
FAST_RECIPES = {"gsm8k_fixture.yaml", "code_fixture.yaml"}  # fresh models: seconds each
EXTRA = {"grpo_countdown_ray.yaml": pytest.mark.ray}


def _recipe_case(recipe: Path):
    marks = [EXTRA[recipe.name]] if recipe.name in EXTRA else []
    if recipe.name not in FAST_RECIPES:
        marks.append(pytest.mark.slow)
    return pytest.param(recipe, id=recipe.name, marks=marks)


@pytest.mark.parametrize("recipe", [_recipe_case(r) for r in sorted(ROOT.glob("recipes/*.yaml"))
                                    if r.name not in USER_MODEL])
def test_every_recipe_trains_a_step_as_shipped(recipe, tmp_path, monkeypatch, capsys):
    # As shipped (with the model it names), into an empty folder: only the length, the folder and the
    # thread count are set. Data files are named relative to the repository, as the README runs them.
    monkeypatch.chdir(ROOT)
    code = main(["train", str(recipe), "trainer.steps=1", f"trainer.out_dir={tmp_path}", "trainer.name=run",
                 "trainer.threads=1"])
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "run"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert [m["step"] for m in _metrics(run)][-1] == 1


def test_short_run_on_an_easy_reward_raises_it(tmp_path, capsys):
    # Easy setting: pay for '+' signs. The warm start uses + - * about equally, so a working
    # policy-gradient loop must push the share of '+' (and the reward) up within a few dozen steps.
    (tmp_path / "plus.py").write_text(
        "def score(prompt, completion, **example):\n"
        "    return completion.count('+') / max(1, len(completion))\n")
    code = main(["train", f"reward.fn={tmp_path / 'plus.py'}:score", "trainer.steps=30", "optim.lr=1e-3",
                 "optim.warmup_steps=1", "trainer.eval_every=0", f"trainer.out_dir={tmp_path}", "trainer.name=easy",
                 "rollout.prompts_per_step=4", "rollout.group_size=8", "trainer.save_every=0"])
    assert code == 0, capsys.readouterr().err
    rewards = [m["reward/mean"] for m in _metrics(tmp_path / "easy") if "reward/mean" in m]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.05, (first, last)
