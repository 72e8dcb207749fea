"""Reward functions written in TRL's convention (`fn(completions, **kwargs) -> list`), run unchanged:
TRL's documented examples (a length reward, a regex format reward on chat completions, a reward
reading a dataset column, a multi-task reward returning None), several of them weighted, the
conversational format, `trainer_state`, and the one-line refusal of a signature fitting neither form."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from rlvr.errors import ConfigError
from rlvr.rewards.runner import RewardRunner, RewardSum, reward_form

# ---- TRL's documented examples, verbatim (GRPOTrainer docs, "Using a custom reward function") ----


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def check_math_solution(prompt, completion):  # the docs leave it to the reader
    return completion == str(eval(prompt))


def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards

# ---------------------------------------------------------------------------------------------------


def test_trl_functions_are_recognised_by_signature():
    assert [reward_form(f) for f in (reward_len, format_reward_func, reward_func, math_reward_func)] == ["trl"] * 4
    assert reward_form(lambda prompt, completion, **columns: 1.0) == "sample"


def test_length_and_column_rewards_weighted_as_trl_sums_them():
    completions = ["x" * 20, "x" * 25, r"so \boxed{7}"]
    columns = [{"meta": {"ground_truth": "7"}}] * 3  # an Example's fields: the row's columns ride in meta
    out = RewardSum([reward_len, reward_func], [0.5, 2.0], columns=True)(["p"] * 3, completions, columns)
    # reward_len: -|20-20| = 0, -|20-25| = -5, -|20-12| = -8;  reward_func: 0, 0, 1
    assert out.components == {"reward_len": [0.0, -5.0, -8.0], "reward_func": [0.0, 0.0, 1.0]}
    assert out.rewards == [0.0, -2.5, 0.5 * -8.0 + 2.0 * 1.0]


def test_chat_rows_give_messages_and_completions_as_trl_does():
    seen = {}

    def spy(prompts, completions, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, step=trainer_state.global_step, columns=kwargs)
        return [0.0] * len(completions)

    chat = [{"role": "user", "content": "think, then answer"}]
    rows = [{"meta": {"prompt": chat, "level": 1}}, {"meta": {"prompt": chat, "level": 2}}]  # as DatasetTask makes
    reward = RewardSum([format_reward_func, spy], columns=True)
    reward.on_step_begin(3, 10)
    out = reward(["rendered"] * 2, ["<think>a</think><answer>b</answer>", "no tags"], rows)
    assert out.components["format_reward_func"] == [1.0, 0.0]
    assert seen["prompts"] == [chat, chat] and seen["step"] == 2  # two optimizer steps done before step 3
    assert seen["completions"][0] == [{"role": "assistant", "content": "<think>a</think><answer>b</answer>"}]
    assert seen["columns"] == {"level": [1, 2]}


def test_none_means_not_scorable_and_a_function_gets_only_what_it_names():
    out = RewardRunner(math_reward_func)(["2+2"] * 3, ["4", "5", "4"],
                                         [{"task": "math"}, {"task": "math"}, {"task": "code"}])
    assert out.rewards[:2] == [1.0, -1.0] and math.isnan(out.rewards[2])
    assert out.metrics["math_reward_func/unscorable"] == 1.0

    def strict(completions, ground_truth):  # no **kwargs: only the keywords it names
        return [float(c == g) for c, g in zip(completions, ground_truth)]
    assert RewardRunner(strict)(["p", "p"], ["7", "8"], [{"ground_truth": "7", "x": 1}] * 2).rewards == [1.0, 0.0]


def _rows(n: int = 20) -> list[dict]:
    return [{"prompt": f"{a} {a + 1} 1>{2 * a + 2}:", "ground_truth": str(2 * a + 2)} for a in range(1, n + 1)]


def test_trl_rewards_train_through_the_trainer(tmp_path):
    from rlvr import Trainer

    overrides = {"trainer.steps": 2, "trainer.eval_every": 0, "trainer.save_every": 0, "trainer.threads": 1,
                 "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 8,
                 "algo.dynamic_sampling": False, "trainer.out_dir": str(tmp_path),
                 "reward.workers": 0}  # `steps` and `pairs` are this process's lists, not a reward worker's
    steps, pairs = [], []

    def at_step(completions, trainer_state, completion_ids, **kwargs):
        steps.append((trainer_state.global_step, trainer_state.max_steps))
        pairs.extend(zip(completions, completion_ids))
        return [0.0] * len(completions)

    final = Trainer("rlvr:countdown-warmstart", [reward_len, reward_func, at_step], _rows(),
                    reward_weights=[0.1, 1.0, 1.0], overrides=overrides, echo=lambda *a: None).train()
    assert final["step"] == 2
    assert final["reward/mean"] == pytest.approx(0.1 * final["reward/reward_len/mean"]
                                                 + final["reward/reward_func/mean"])
    assert final["reward/reward_len/mean"] < 0 and final["reward/reward_len/errors"] == 0
    assert pairs[:2] == [("", []), ("0", [])] and steps[0] == (0, 2)  # the probe on the first row, when built
    steps, pairs = steps[1:], pairs[2:]
    assert {s for s, _ in steps} == {0, 1} and {m for _, m in steps} == {2}
    from rlvr.models.causal_lm import load_causal_lm
    _, tok = load_causal_lm("rlvr:countdown-warmstart", seed=0)
    assert len(pairs) == 8 and all(ids and len(ids) <= 8 for _, ids in pairs)
    for text, ids in pairs:  # the tokens the completion was decoded from, its EOS included when it stopped
        assert tok.decode(ids, skip_special_tokens=True) == text
        assert tok.eos_token_id not in ids[:-1]
    samples = [json.loads(line) for line in (tmp_path / "grpo_dataset_s0" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(set(s["rewards"]) == {"reward_len", "reward_func", "at_step"} for s in samples)
    for s in samples:  # each function's own score beside the weighted sum
        parts = s["rewards"]
        assert s["reward"] == pytest.approx(0.1 * parts["reward_len"] + parts["reward_func"] + parts["at_step"])
        assert parts["reward_len"] == -abs(20 - len(s["completion"]))


def test_a_signature_fitting_neither_form_is_refused_before_the_model_loads(tmp_path):
    from rlvr import Trainer

    def score(text):
        return 1.0
    with pytest.raises(ConfigError) as err:  # a model path that does not exist: refused before it is read
        Trainer(str(tmp_path / "no-model"), score, _rows())
    message = str(err.value)
    assert "\n" not in message and message.startswith("reward_funcs: score(text) fits neither")
    assert "fn(prompt, completion, **columns)" in message and "fn(completions, **kwargs)" in message

    (tmp_path / "r.py").write_text("def score(text):\n    return 1.0\n")
    run = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", f"reward.fn={tmp_path / 'r.py'}:score",
                          f"trainer.out_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "fits neither reward convention" in run.stderr
    assert "Traceback" not in run.stderr and not list(tmp_path.glob("grpo_*"))


def test_chat_rows_reach_trl_functions_as_messages_through_the_dataset_task(tokenizer):
    from rlvr.tasks.dataset import DatasetTask

    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}>"
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "level": i} for i in range(5)]
    seen = []

    def spy(prompts, completions, level, **kwargs):
        seen.append((prompts, completions, level))
        return [1.0] * len(completions)

    reward = RewardSum([spy], columns=True)
    task = DatasetTask(rows, reward=reward, tokenizer=tokenizer, correct_fn=lambda p, c, level: c == str(level))
    example = next(e for e in task.sample(5) if e.meta["level"] == 3)
    assert example.prompt == "<user>q3>" and example.meta["prompt"] == rows[3]["prompt"]
    assert task.reward(example.prompt, "x", meta=example.meta) == 1.0
    assert seen[-1] == ([rows[3]["prompt"]], [[{"role": "assistant", "content": "x"}]], [3])
    assert task.is_correct("3", example) and not task.is_correct("4", example)  # correct_fn gets the columns only


def test_completion_ids_reach_trl_functions_only():
    from rlvr.rewards.forms import COMPLETION_IDS

    got = {}

    def lengths(completions, completion_ids, **kwargs):  # TRL's keyword: each completion's token ids
        got.update(ids=completion_ids, columns=kwargs)
        return [float(len(ids)) for ids in completion_ids]

    def exact(prompt, completion, ground_truth):  # per-sample, no **kwargs: must not get the ids
        return float(completion == ground_truth)

    rows = [{"meta": {"ground_truth": "7"}, COMPLETION_IDS: [5, 9, 2]},
            {"meta": {"ground_truth": "7"}, COMPLETION_IDS: [4]}]
    out = RewardSum([lengths, exact], columns=True)(["p", "p"], ["7", "8"], rows)
    assert out.components == {"lengths": [3.0, 1.0], "exact": [1.0, 0.0]} and out.errors == [None, None]
    assert got["ids"] == [[5, 9, 2], [4]] and COMPLETION_IDS not in got["columns"]
    plain = RewardSum([lengths])
    plain(["p"], ["7"], [{"answer": "7", COMPLETION_IDS: [1, 2]}])
    got.clear()  # the per-sample question right after the batch is answered from it, without the ids
    assert plain.score_one("p", "7", {"answer": "7"}) == 2.0 and not got
    # without ids (a caller that has only text) the keyword is absent, as a function reading it finds
    out = RewardRunner(lambda completions, **kw: [float(COMPLETION_IDS in kw)] * len(completions))(
        ["p"], ["7"], [{"ground_truth": "7"}])
    assert out.rewards == [0.0]


def test_completion_token_ids_stop_at_the_first_eos():
    import torch

    from rlvr.batch import Rollouts
    from rlvr.codec import completion_token_ids
    from rlvr.models.tokenizer import char_tokenizer

    tok = char_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ids = torch.tensor([[7, 8, eos, pad], [7, eos, 9, eos], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).float()  # row 1: a full diffusion window
    rollouts = Rollouts(ids[:, :1], torch.ones(3, 1), ids, mask, torch.zeros(3, 4), torch.tensor([False, False, True]))
    assert completion_token_ids(tok, rollouts) == [[7, 8, eos], [7, eos], [5, 6, 7, 8]]
