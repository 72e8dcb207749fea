"""User reward functions: loading by path, the four call forms, None/dict/errors, all-fail stop."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlvr.rewards
from rlvr.errors import ConfigError, RewardError
from rlvr.rewards.runner import RewardRunner, batched, load_reward_fn

PROMPTS, COMPLETIONS = ["q1", "q2", "q3"], ["4", "x", "boom"]
EXAMPLES = [{"answer": "4", "meta": {}}, {"answer": "4", "meta": {}}, {"answer": "4", "meta": {}}]


def score(prompt, completion, **ex):
    if completion == "boom":
        raise ValueError("cannot score boom\nsecond line")
    if completion == "x":
        return None
    return {"reward": float(completion == ex["answer"]), "len": len(completion), "flag": True}


def test_per_sample_none_dict_and_errors():
    out = RewardRunner(score, name="user")(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[0] == 1.0 and math.isnan(out.rewards[1]) and math.isnan(out.rewards[2])
    assert out.errors == [None, None, "ValueError: cannot score boom"]
    assert out.metrics == {"user/errors": 1.0, "user/unscorable": 1.0, "user/mean": 1.0, "user/len": 1.0,
                           "user/flag": 1.0}


def test_all_samples_failing_stops_with_one_line():
    def broken(prompt, completion, **ex):
        return 1 / 0
    with pytest.raises(RewardError) as err:
        RewardRunner(broken)(PROMPTS, COMPLETIONS, EXAMPLES)
    message = str(err.value)
    assert "\n" not in message and "broken" in message and "all 3 samples" in message and "ZeroDivisionError" in message
    assert isinstance(err.value, ConfigError)


def test_bad_return_types_are_errors():
    out = RewardRunner(lambda p, c, **e: "1.0" if c == "4" else 0.5)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert math.isnan(out.rewards[0]) and out.rewards[1:] == [0.5, 0.5] and out.errors[0].startswith("TypeError")
    out = RewardRunner(lambda p, c, **e: {"score": 1.0} if c == "4" else 0.0, name="f")(PROMPTS, COMPLETIONS, EXAMPLES)
    assert "without a 'reward' key" in out.errors[0] and out.metrics["f/errors"] == 1.0


def test_batched_and_async_forms():
    @batched
    def batch_fn(prompts, completions, answer, meta):
        return [float(c == a) for c, a in zip(completions, answer)]

    assert RewardRunner(batch_fn)(PROMPTS, COMPLETIONS, EXAMPLES).rewards == [1.0, 0.0, 0.0]

    async def async_fn(prompt, completion, **ex):
        if completion == "boom":
            raise RuntimeError("async boom")
        return float(completion == ex["answer"])

    out = RewardRunner(async_fn)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[:2] == [1.0, 0.0] and out.errors[2] == "RuntimeError: async boom"

    async def async_batch(prompts, completions, **cols):
        return [0.5] * len(completions)
    async_batch.batched = True
    assert RewardRunner(async_batch)(PROMPTS, COMPLETIONS, EXAMPLES).rewards == [0.5] * 3

    @batched
    def wrong_length(prompts, completions, **cols):
        return [1.0]
    with pytest.raises(RewardError, match="returned 1 values for 3 samples"):
        RewardRunner(wrong_length)(PROMPTS, COMPLETIONS, EXAMPLES)


def test_load_by_path(tmp_path: Path):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def score(prompt, completion, **example):
            return float(completion.strip() == example["answer"])
    """))
    fn = load_reward_fn("my_rewards.py:score", base_dir=tmp_path)
    assert RewardRunner(fn)(["q"], ["4 "], [{"answer": "4"}]).rewards == [1.0]
    assert load_reward_fn(f"{tmp_path}/my_rewards.py:score")("q", "5", answer="4") == 0.0
    assert load_reward_fn("rlvr.rewards.math:math_reward") is rlvr.rewards.math_reward
    with pytest.raises(ConfigError, match="no 'nope'.*callables there: score"):
        load_reward_fn("my_rewards.py:nope", base_dir=tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        load_reward_fn("missing.py:score", base_dir=tmp_path)
    with pytest.raises(ConfigError, match="FILE.py:NAME"):
        load_reward_fn("my_rewards.py")
    (tmp_path / "bad.py").write_text("import does_not_exist\n")
    with pytest.raises(ConfigError, match="importing .* failed: ModuleNotFoundError"):
        load_reward_fn("bad.py:score", base_dir=tmp_path)


def test_rewards_and_tasks_never_import_torch_or_the_trainer():
    code = ("import sys, rlvr.rewards, rlvr.rewards.code, rlvr.rewards.sandbox, rlvr.tasks.files, rlvr.tasks\n"
            "bad = [m for m in sys.modules if m == 'torch' or "
            "m.startswith(('torch.', 'rlvr.trainer', 'transformers'))]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_doctests():
    import doctest

    from rlvr.rewards import code, combine, format, math, runner
    from rlvr.tasks import files

    for module in (code, combine, format, math, runner, files):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__


def test_example_dicts_with_a_prompt_field_work_with_plain_signatures():
    import dataclasses

    from rlvr.types import Example

    ex = dataclasses.asdict(Example("q", "4", {}))  # what the trainer passes: includes "prompt"
    runner = RewardRunner(lambda prompt, completion, **e: float(completion == e["answer"]))
    assert runner(["q"], ["4"], [ex]).rewards == [1.0]
