"""Reward models as reward functions: scores equal a direct `transformers` forward of the text
the reward model's own chat template renders; batch whitening and clipping; weighted against
the task's verifier through `reward.fn`, each component logged; in-memory models through the
API; a process reward model scores each step's prefix."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _reward_models import save_tiny_reward_model, tiny_reward_model
from transformers import AutoModelForSequenceClassification

from rlvr.errors import ConfigError
from rlvr.models.tokenizer import char_tokenizer
from rlvr.rewards.forms import TASK_VERIFIER, with_task
from rlvr.rewards.reward_model import ProcessRewardModel, RewardModel, render_pair
from rlvr.rewards.runner import RewardSum, load_reward_fn, load_reward_spec

PROMPTS = ["1 2 3>6:", "4 5>9:", "7 8 9 1>23:"]
COMPLETIONS = ["1+2+3", "4+5 and more text", "7"]



@pytest.fixture
def saved_rm(tmp_path):
    return save_tiny_reward_model(tmp_path / "rm")


def _direct(path, prompts, completions) -> list[float]:
    """One unpadded forward per text, straight through transformers."""
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = char_tokenizer()
    out = []
    for p, c in zip(prompts, completions):
        ids = tokenizer(f"[user]{p}[assistant]{c}", add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out.append(float(model(input_ids=ids).logits[0, 0]))
    return out


def test_scores_equal_a_direct_transformers_forward_in_batches(saved_rm):
    fn = load_reward_fn(str(saved_rm), model_options={"batch_size": 2})  # 3 pairs: a batch of 2 (padded), then 1
    assert isinstance(fn, RewardModel) and fn.batched and fn.__name__ == "reward_model"
    assert render_pair(fn.tokenizer, "q", "a") == "[user]q[assistant]a"
    got = fn(PROMPTS, COMPLETIONS)
    expected = _direct(saved_rm, PROMPTS, COMPLETIONS)
    assert [g["raw"] for g in got] == pytest.approx(expected, abs=1e-5)
    assert [g["reward"] for g in got] == pytest.approx(expected, abs=1e-5)
    assert len(set(round(e, 4) for e in expected)) == 3  # three different texts, three different scores


def test_batch_whitening_then_clipping_on_a_hand_vector():
    model, tokenizer = tiny_reward_model()
    raw = torch.tensor([1.0, 2.0, 3.0, 10.0])  # mean 4, Bessel std sqrt(50/3) = 4.0825
    white = RewardModel(model, tokenizer, normalize="batch").rewards(raw)
    assert white.tolist() == pytest.approx([-0.73485, -0.48990, -0.24495, 1.46969], abs=1e-4)
    clipped = RewardModel(model, tokenizer, normalize="batch", clip=1.0).rewards(raw)
    assert clipped.tolist() == pytest.approx([-0.73485, -0.48990, -0.24495, 1.0], abs=1e-4)
    assert RewardModel(model, tokenizer, clip=2.5).rewards(raw).tolist() == [1.0, 2.0, 2.5, 2.5]


def test_weighted_against_the_verifier_with_each_component_logged(saved_rm):
    class Task:
        def reward(self, prompt, completion, **example):
            return float(completion.startswith("7"))

    spec = load_reward_spec(f"task, 0.5*{saved_rm}")
    assert spec[0][0] is TASK_VERIFIER  # bound to the run's task by the builder
    fns = with_task([fn for fn, _ in spec], Task())
    out = RewardSum(fns, [w for _, w in spec])(PROMPTS, COMPLETIONS, [{}] * 3)
    scores = _direct(saved_rm, PROMPTS, COMPLETIONS)
    assert out.rewards == pytest.approx([0.5 * scores[0], 0.5 * scores[1], 1 + 0.5 * scores[2]], abs=1e-5)
    assert out.components["reward_model"] == pytest.approx(scores, abs=1e-5)
    assert out.metrics["task/mean"] == pytest.approx(1 / 3)
    assert out.metrics["reward_model/raw"] == pytest.approx(sum(scores) / 3, abs=1e-5)


def test_a_causal_lm_folder_and_bad_options_are_one_line_errors(tmp_path):
    from rlvr.models.causal_lm import tiny_llama

    tiny_llama(100, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=32,
               seed=0).save_pretrained(tmp_path / "lm")
    with pytest.raises(ConfigError, match="holds a LlamaForCausalLM, whose score head would be random"):
        load_reward_fn(str(tmp_path / "lm"))
    model, tokenizer = tiny_reward_model()
    with pytest.raises(ConfigError, match="reward.model_normalize: unknown 'group'"):
        RewardModel(model, tokenizer, normalize="group")
    with pytest.raises(ConfigError, match="passed without its tokenizer"):
        RewardModel(model)


def test_a_run_weighs_a_saved_reward_model_against_the_task(tmp_path, saved_rm):
    from rlvr.cli import main

    out = tmp_path / "runs"
    assert main(["train", "trainer.steps=1", f"trainer.out_dir={out}",
                 f"reward.fn=task, 0.5*{saved_rm}", "reward.model_normalize=batch", "reward.model_clip=2",
                 "trainer.eval_every=0", "trainer.save_every=0", "trainer.threads=1", "rollout.prompts_per_step=2",
                 "rollout.group_size=2", "rollout.max_new_tokens=8", "algo.dynamic_sampling=false"]) == 0
    (run,) = out.iterdir()
    line = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert abs(line["reward/reward_model/mean"]) < 1e-5  # whitened over the batch: mean 0
    assert math.isfinite(line["reward/reward_model/raw"]) and "reward/task/mean" in line
    assert line["reward/mean"] == pytest.approx(line["reward/task/mean"] + 0.5 * line["reward/reward_model/mean"],
                                                abs=1e-5)


def test_the_api_takes_an_in_memory_reward_model(tmp_path, saved_rm):
    from rlvr import Trainer

    model = AutoModelForSequenceClassification.from_pretrained(saved_rm)  # its folder holds the tokenizer
    rows = [{"prompt": f"{a} {a + 1}>{2 * a + 1}:"} for a in range(1, 11)]
    overrides = {"trainer.steps": 1, "trainer.eval_every": 0, "trainer.save_every": 0, "trainer.threads": 1,
                 "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 8,
                 "trainer.out_dir": str(tmp_path / "runs"), "algo.dynamic_sampling": False}
    trainer = Trainer("rlvr:countdown-warmstart", model, rows, overrides=overrides, echo=lambda *a: None)
    assert isinstance(trainer.reward_funcs[0], RewardModel)
    as_prm = Trainer("rlvr:countdown-warmstart", model, rows, overrides={**overrides, "reward.model_steps": "min"},
                     echo=lambda *a: None)
    assert isinstance(as_prm.reward_funcs[0], ProcessRewardModel) and as_prm.reward_funcs[0].aggregate == "min"
    final = trainer.train()
    samples = [json.loads(x) for x in (trainer.run_dir / "samples.jsonl").read_text().splitlines()]
    scores = _direct(saved_rm, [s["prompt"] for s in samples], [s["completion"] for s in samples])
    assert [s["reward"] for s in samples] == pytest.approx(scores, abs=1e-4)
    assert math.isfinite(final["reward/user/raw"])


def test_a_prm_scores_each_step_prefix():
    model, tokenizer = tiny_reward_model()
    prm = ProcessRewardModel(model, tokenizer, aggregate="min", separator="\n", batch_size=2)
    completions = ["2+3=5\n5*4=20", "9", ""]
    got = prm(["q:"] * 3, completions)
    @torch.no_grad()
    def direct(text):
        ids = tokenizer(f"[user]q:[assistant]{text}", add_special_tokens=False, return_tensors="pt")["input_ids"]
        return float(model(input_ids=ids).logits[0, 0])

    steps = [direct("2+3=5"), direct("2+3=5\n5*4=20")]
    assert prm.step_scores(["q:"], completions[:1]) == [pytest.approx(steps, abs=1e-5)]
    assert got[0]["reward"] == pytest.approx(min(steps), abs=1e-5) and got[0]["steps"] == 2
    assert got[1]["reward"] == pytest.approx(direct("9"), abs=1e-5)
    assert got[2] == {"reward": None, "steps": 0}  # no step: not scorable


def test_reward_model_steps_make_the_named_model_a_prm(saved_rm):
    from rlvr.builder.build import build_reward
    from rlvr.config import load_config

    reward = build_reward(load_config(None, [f"reward.fn={saved_rm}", "reward.model_steps=last"]), task=None)
    (runner,) = reward.runners
    assert isinstance(runner.fn, ProcessRewardModel) and runner.fn.separator == "\n\n"
    out = reward(["q:"], ["2+3=5\n\n5*4=20"], [{}])
    assert out.rewards == pytest.approx(_direct(saved_rm, ["q:"], ["2+3=5\n\n5*4=20"]), abs=1e-5)  # the last prefix
    assert out.metrics["user/steps"] == 2.0
    with pytest.raises(ConfigError, match="reward.model_steps: unknown aggregation 'max'"):
        build_reward(load_config(None, [f"reward.fn={saved_rm}", "reward.model_steps=max"]), task=None)


def test_batch_whitening_over_several_reward_workers_is_a_one_line_error(saved_rm):
    from rlvr.builder.build import build_reward
    from rlvr.config import load_config

    with pytest.raises(ConfigError, match=r"reward.model_normalize=batch: each of trainer.reward_workers=2 would "
                                          r"whiten its own share"):
        load_config(None, [f"reward.fn={saved_rm}", "reward.model_normalize=batch", "trainer.backend=ray",
                           "trainer.reward_workers=2"])
    one = load_config(None, [f"reward.fn={saved_rm}", "reward.model_normalize=batch", "trainer.backend=ray"])
    assert build_reward(one, task=None).runners[0].fn.normalize == "batch"  # one worker whitens the whole batch
