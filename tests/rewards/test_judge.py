"""Generative judges: score parsing on well-formed and malformed verdicts; an unparsable verdict
is that sample's error through the reward runner, never a crash; verdicts are cached per sample;
the verdict-token probability equals a direct forward's softmax over the two verdict tokens."""

from __future__ import annotations

import math

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
