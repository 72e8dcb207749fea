"""`reward.fn="0.1*my.py:digits, task"`: a shaping term on top of the task's own verifier."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlvr.cli import main
from rlvr.errors import ConfigError
from rlvr.rewards.forms import TASK_VERIFIER, with_task
from rlvr.rewards.runner import RewardSum, load_reward_spec
from rlvr.tasks.countdown import Countdown

SHORT = ["trainer.steps=2", "trainer.eval_every=0", "task.heldout_size=4", "rollout.prompts_per_step=2",
         "rollout.group_size=4", "trainer.threads=1", "algo.dynamic_sampling=false"]


def test_task_in_the_spec_is_the_tasks_verifier_weighted_with_the_others(tmp_path):
    (tmp_path / "d.py").write_text("def digits(prompt, completion, **example):\n"
                                   "    return sum(ch.isdigit() for ch in completion) / 16\n")
    spec = load_reward_spec("0.1*d.py:digits, 2*task", base_dir=tmp_path)
    assert [w for _, w in spec] == [0.1, 2.0] and spec[1][0] is TASK_VERIFIER
    task = Countdown(heldout_size=4)
    example = task.sample(1)[0]
    fns = with_task([fn for fn, _ in spec], task)
    completions = ["12 + 3", "no digits", "(1+2)*3"]
    fields = [dataclasses.asdict(example)] * 3
    out = RewardSum(fns, [0.1, 2.0])([example.prompt] * 3, completions, fields)
    verdicts = [task.reward(example.prompt, c, answer=example.answer, meta=example.meta) for c in completions]
    verdicts = [v["reward"] if isinstance(v, dict) else v for v in verdicts]
    assert out.components["task"] == verdicts and out.components["digits"] == [3 / 16, 0.0, 3 / 16]
    assert out.rewards == pytest.approx([0.1 * d + 2 * v for d, v in zip([3 / 16, 0.0, 3 / 16], verdicts)])


def test_rlvr_train_adds_a_shaping_term_to_the_task(tmp_path):
    (tmp_path / "d.py").write_text("def digits(prompt, completion, **example):\n"
                                   "    return sum(ch.isdigit() for ch in completion) / 16\n")
    assert main(["train", f"reward.fn=0.1*{tmp_path / 'd.py'}:digits, task", *SHORT,
                 f"trainer.out_dir={tmp_path}"]) == 0
    last = json.loads((tmp_path / "grpo_countdown_s0" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["reward/mean"] == pytest.approx(0.1 * last["reward/digits/mean"] + last["reward/task/mean"])
    assert last["reward/digits/mean"] > 0 and "reward/accuracy" in last


def test_task_with_rows_is_refused():
    from rlvr import Trainer

    rows = [{"prompt": f"q{i}", "target": i} for i in range(10)]
    with pytest.raises(ConfigError, match="'task' names a task's own verifier, and rows passed as train_dataset"):
        Trainer(None, None, rows, overrides={"reward.fn": "task"})
