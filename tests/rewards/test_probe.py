"""Reward functions probed once on a real row when `rlvr.Trainer` is built, before any model loads:
mistakes are one line with the fix for the convention in use; the run's first lines say what
accuracy counts and what each function returned; a warning when accuracy cannot count anything."""

from __future__ import annotations

import re

import pytest

from rlvr.errors import ConfigError
from rlvr.rewards.probe import accuracy_meaning, probe_rewards

ROW = {"prompt": "2 3 1>6:", "ground_truth": "6", "numbers": [2, 3, 1]}


def _probe(*fns):
    return probe_rewards(list(fns), [getattr(fn, "__name__", "f") for fn in fns], ROW, "prompt")


def test_functions_that_fit_are_described():
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    def exact(completions, ground_truth, **kwargs):
        return [float(c == gt) for c, gt in zip(completions, ground_truth)]

    def starts(prompt, completion, numbers, **columns):
        return float(completion.startswith(str(numbers[0])))

    assert _probe(reward_len, exact, starts) == [
        "reward reward_len: trl form, reads no column by name and **kwargs; returned -20, -19 for completions "
        "['', '0']",
        "reward exact: trl form, reads ground_truth and **kwargs; returned 0.0, 0.0 for completions ['', '0']",
        "reward starts: sample form, reads numbers and **kwargs; returned 0.0, 0.0 for completions ['', '0']"]


@pytest.mark.parametrize(("fn", "message"), [
    (lambda completions, **kw: 1.0,
     "reward_funcs: f returned float for 2 completions; TRL's convention returns one value per completion"),
    (lambda completions, **kw: [1.0],
     "reward_funcs: f returned 1 values for 2 completions; TRL's convention returns one value per completion"),
    (lambda completions, solution, **kw: [0.0] * len(completions),
     "reward_funcs: f reads column 'solution', which the rows lack (their columns: ground_truth, numbers)"),
    (lambda completions, **kw: [float(c == s) for c, s in zip(completions, kw["solution"])],
     "reward_funcs: f reads 'solution', which the rows lack (their columns: ground_truth, numbers)"),
    (lambda prompt, completion, **cols: [1.0, 0.0],
     "reward_funcs: f returned list ([1.0, 0.0]) for a completion; rlvr's per-sample convention returns one number"),
    (lambda prompt, completion, **cols: "1",
     "reward_funcs: f returned str (1) for a completion; return a number, None (not scorable) or a dict"),
])
def test_mistakes_are_one_line_with_the_fix_for_the_convention(fn, message):
    fn.__name__ = "f"
    with pytest.raises(ConfigError) as err:
        _probe(fn)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_function_that_cannot_score_the_probe_completion_is_said_not_refused():
    def answer(completions, **kwargs):  # TRL docs' style: assumes a match
        return [float(re.search(r"=(\d+)", c).group(1) == "6") for c in completions]

    line, = _probe(answer)
    assert line.startswith("reward answer: trl form") and "raised on the probe completions (AttributeError" in line


def test_accuracy_is_stated():
    assert accuracy_meaning(["reward_len", "exact"], [0.1, 1.0], 1.1, None, None) == (
        "accuracy: a completion is correct when its weighted reward 0.1*reward_len + 1*exact reaches 1.1 (every "
        "function at 1 by default); pass correct_fn= or correct_threshold= to count otherwise")


def test_a_run_states_accuracy_and_warns_when_no_completion_can_reach_it(tmp_path):
    from rlvr import Trainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    rows = [{"prompt": f"{a} {a + 1} 1>{2 * a + 2}:"} for a in range(1, 21)]
    said = []
    Trainer("rlvr:countdown-warmstart", reward_len, rows, echo=said.append,
            overrides={"trainer.steps": 3, "trainer.eval_every": 0, "trainer.save_every": 0, "trainer.threads": 1,
                       "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 6,
                       "trainer.out_dir": str(tmp_path)}).train()
    assert said[1:3] == [
        "accuracy: a completion is correct when its weighted reward 1*user reaches 1 (every function at 1 by "
        "default); pass correct_fn= or correct_threshold= to count otherwise",
        "reward user: trl form, reads no column by name and **kwargs; returned -20, -19 for completions ['', '0']"]
    warnings = [line for line in said if line.startswith("warning: accuracy is 0")]
    assert len(warnings) == 1 and "reaches 1, and the highest in 3 steps is -" in warnings[0]
