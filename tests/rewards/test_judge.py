"""Generative judges: score parsing on well-formed and malformed verdicts; an unparsable verdict
is that sample's error through the reward runner, never a crash; verdicts are cached per sample;
the verdict-token probability equals a direct forward's softmax over the two verdict tokens."""

from __future__ import annotations

import math
import re

import pytest
import torch

from rlvr.batch import Rollouts
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer
from rlvr.rewards.judge import GenerativeJudge, JudgeParseError, parse_score
from rlvr.rewards.runner import RewardRunner

RUBRIC = "Q:{prompt} A:{completion} Right?"


@pytest.mark.parametrize("text, expected", [
    ("Score: 7", 0.7), ("score=10", 1.0), ("SCORE 0", 0.0), ("first Score: 2, on reflection Score: 6", 0.6),
    ("I give it 3/4", 0.75), ("Score: 2.5", 0.25),
])
def test_parse_score(text, expected):
    assert parse_score(text, low=0, high=10) == pytest.approx(expected)


@pytest.mark.parametrize("text, message", [
    ("looks fine to me", "no score in verdict"), ("Score: 11", "score 11 outside"), ("Score: -1", "score -1 outside"),
    ("5/0", "score out of 0"), ("", "no score in verdict"),
])
def test_malformed_verdicts_raise_a_parse_error(text, message):
    with pytest.raises(JudgeParseError, match=message):
        parse_score(text)


class _ScriptedEngine:
    """A RolloutEngine that answers each judge prompt with a scripted verdict (and counts its rows)."""

    def __init__(self, tokenizer, verdicts: dict[str, str]):
        self.tokenizer, self.verdicts, self.rows = tokenizer, verdicts, 0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature):
        texts = [self.tokenizer.decode(row[m.bool()], skip_special_tokens=True)
                 for row, m in zip(prompt_ids, prompt_mask)]
        self.rows += len(texts)
        answers = [self.tokenizer(self.verdicts[t.split("A:")[1].removesuffix(" Right?")],
                                  add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                   for t in texts]
        width = max(len(a) for a in answers)
        ids = torch.tensor([a + [self.tokenizer.pad_token_id] * (width - len(a)) for a in answers])
        mask = torch.tensor([[1.0] * len(a) + [0.0] * (width - len(a)) for a in answers])
        return Rollouts(prompt_ids, prompt_mask, ids, mask, torch.zeros_like(mask),
                        torch.zeros(len(texts), dtype=torch.bool))


def test_unparsable_verdicts_are_per_sample_errors_and_verdicts_are_cached():
    tokenizer = char_tokenizer()
    engine = _ScriptedEngine(tokenizer, {"good": "Score: 9", "bad": "Score: 1", "odd": "no idea"})
    judge = GenerativeJudge(None, tokenizer, RUBRIC, mode="score", engine=engine, batch_size=2)
    runner = RewardRunner(judge, name="judge")
    out = runner(["q"] * 4, ["good", "odd", "bad", "good"], [{}] * 4)
    assert out.rewards[0] == pytest.approx(0.9) and out.rewards[2] == pytest.approx(0.1)
    assert out.rewards[3] == pytest.approx(0.9) and math.isnan(out.rewards[1])
    assert out.errors == [None, "JudgeParseError: no score in verdict 'no idea'", None, None]
    assert out.metrics["judge/errors"] == 1.0
    assert engine.rows == 3  # "good" twice in the batch: judged once
    runner(["q"], ["bad"], [{}])
    assert engine.rows == 3  # and once only across batches


def test_verdict_probability_equals_a_direct_forward():
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=96, seed=0).eval()
    judge = GenerativeJudge(model, tokenizer, RUBRIC, verdicts=("Y", "N"))
    cases = [("1 2>3:", "1+2"), ("4>4:", "4 and more")]
    got = judge([p for p, _ in cases], [c for _, c in cases])  # different lengths: left-padded together
    y, n = tokenizer.convert_tokens_to_ids(["Y", "N"])
    for value, (p, c) in zip(got, cases):
        ids = [tokenizer.bos_token_id] + tokenizer(f"Q:{p} A:{c} Right?", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert value == pytest.approx(float(torch.softmax(logits[[y, n]], -1)[0]), abs=1e-5)
    with pytest.raises(ConfigError, match="'Yes' is 3 tokens"):
        GenerativeJudge(model, tokenizer, RUBRIC)
    with pytest.raises(ConfigError, match="no {completion} slot"):
        GenerativeJudge(model, tokenizer, "Rate {prompt}", verdicts=("Y", "N"))


@pytest.fixture
def saved_judge(tmp_path):
    tokenizer = char_tokenizer()
    tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_len=96,
               seed=0).save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    return tmp_path / "judge"


def _build(overrides):
    from rlvr.builder.build import build_reward
    from rlvr.config import load_config

    class Task:
        def reward(self, prompt, completion, **example):
            return float(completion == "1+2")

    return build_reward(load_config(None, overrides), task=Task())


def test_a_judge_named_in_reward_fn_is_weighed_against_the_task(saved_judge):
    from transformers import AutoModelForCausalLM

    reward = _build([f"reward.fn=task, 0.5*judge:{saved_judge}", "reward.judge_verdicts=Y,N",
                     f"reward.judge_rubric={RUBRIC}"])
    cases = [("1 2>3:", "1+2"), ("4>4:", "4 and more")]
    out = reward([p for p, _ in cases], [c for _, c in cases], [{}, {}])
    model = AutoModelForCausalLM.from_pretrained(saved_judge).eval()  # straight through transformers
    tokenizer = char_tokenizer()
    y, n = tokenizer.convert_tokens_to_ids(["Y", "N"])
    direct = []
    for p, c in cases:
        ids = [tokenizer.bos_token_id] + tokenizer(f"Q:{p} A:{c} Right?", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            direct.append(float(torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1, [y, n]], -1)[0]))
    assert out.components["judge"] == pytest.approx(direct, abs=1e-5)
    assert out.rewards == pytest.approx([1 + 0.5 * direct[0], 0.5 * direct[1]], abs=1e-5)
    assert out.metrics["judge/mean"] == pytest.approx(sum(direct) / 2, abs=1e-5)


def test_a_score_judge_from_the_config_writes_its_verdict_greedily_and_errs_per_sample(saved_judge):
    from transformers import AutoModelForCausalLM

    from rlvr.builder.build import judge_options
    from rlvr.config import load_config
    from rlvr.rewards.runner import load_reward_fn

    config = load_config(None, ["reward.judge_mode=score", "reward.judge_max_new_tokens=6",
                                f"reward.judge_rubric={RUBRIC}"])
    judge = load_reward_fn(f"judge:{saved_judge}", judge_options=judge_options(config))
    got = judge(["1 2>3:", "4>4:"], ["1+2", "9"])
    # A random tiny judge writes no "Score: N": each sample is its own error, carrying the verdict it wrote,
    # which is the judge's greedy continuation of the rubric (straight through transformers' generate).
    model, tokenizer = AutoModelForCausalLM.from_pretrained(saved_judge).eval(), char_tokenizer()
    for value, (p, c) in zip(got, [("1 2>3:", "1+2"), ("4>4:", "9")]):
        ids = [tokenizer.bos_token_id] + tokenizer(f"Q:{p} A:{c} Right?", add_special_tokens=False)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        verdict = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
        assert isinstance(value, JudgeParseError) and str(value) == f"no score in verdict {verdict[:60]!r}"


@pytest.mark.parametrize("override, message", [
    ("reward.judge_mode=vote", "reward.judge_mode: must be one of 'verdict', 'score', got 'vote'"),
    ("reward.judge_verdicts=Y", "reward.judge_verdicts: must be two different verdicts, the good one first"),
    ("reward.judge_verdicts=Yes,No", "reward.judge_verdicts: 'Yes' is 3 tokens"),
    ("reward.judge_rubric=Rate {prompt}", "reward.judge_rubric: it has no {completion} slot"),
    ("reward.judge_score_max=0", "reward.judge_score_max: must be > 0"),
])
def test_bad_judge_fields_are_one_line_errors(saved_judge, override, message):
    base = {"reward.fn": f"judge:{saved_judge}", "reward.judge_verdicts": "Y,N", "reward.judge_rubric": RUBRIC}
    key, _, value = override.partition("=")
    with pytest.raises(ConfigError, match=re.escape(message)):
        _build([f"{k}={v}" for k, v in {**base, key: value}.items()])


def test_a_judge_folder_that_is_not_a_model_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="reward.fn: judge: '.*nowhere' has no config.json"):
        _build([f"reward.fn=judge:{tmp_path / 'nowhere'}"])
