"""`rlvr rm preference.process=true`: step labels from Countdown's shown work (a solution, and a
copy wrong at one step, cut there), binary cross-entropy on every step prefix, held-out step
accuracy; the export scores steps as a `ProcessRewardModel` with the same separator."""

from __future__ import annotations

import json
import random

import pytest

from rlvr.errors import ConfigError
from rlvr.preference.process import _prefixes, load_step_labels, verifier_step_labels
from rlvr.tasks.countdown import Countdown


def test_step_labels_from_the_verifier():
    task = Countdown(heldout_size=10, show_work=True)
    examples = task.sample(10, random.Random(0))
    rows = verifier_step_labels(task, examples, random.Random(1))
    assert len(rows) == 20
    for ex, right, wrong in zip(examples, rows[::2], rows[1::2]):
        fields = {"answer": ex.answer, "meta": ex.meta}
        assert task.reward(ex.prompt, ",".join(right.steps), **fields) == 1.0 and set(right.labels) == {1}
        k = len(wrong.steps) - 1
        assert wrong.labels == (1,) * k + (0,) and wrong.steps[:k] == right.steps[:k]
        assert wrong.steps[k] != right.steps[k] and wrong.steps[k].split("=")[0] == right.steps[k].split("=")[0]
    prompts, texts, labels = _prefixes(rows[:2], ",")
    assert texts[:len(rows[0].steps)] == [",".join(rows[0].steps[:k]) for k in range(1, len(rows[0].steps) + 1)]
    assert labels.tolist() == [1.0] * len(rows[0].steps) + [1.0] * (len(rows[1].steps) - 1) + [0.0]


def test_a_bad_step_labelled_row_is_a_one_line_error(tmp_path):
    data = tmp_path / "steps.jsonl"
    data.write_text(json.dumps({"prompt": "q", "steps": ["a", "b"], "labels": [1]}) + "\n")
    with pytest.raises(ConfigError, match=r"steps.jsonl:1: a step-labelled row is"):
        load_step_labels(str(data))


def test_rlvr_rm_trains_a_prm_that_reward_fn_loads(tmp_path, capsys):
    from rlvr.cli import main
    from rlvr.rewards.reward_model import ProcessRewardModel
    from rlvr.rewards.runner import load_reward_fn

    args = ["rm", "preference.process=true", "task.countdown.show_work=true", "preference.steps=40",
            "preference.lr=1e-3", "preference.eval_every=20", "preference.pairs=256", "trainer.threads=1",
            f"trainer.out_dir={tmp_path}"]
    assert main(args) == 0
    run = tmp_path / "prm_countdown_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    first, last = lines[0]["eval/heldout_step_accuracy"], lines[-1]["eval/heldout_step_accuracy"]
    assert last > first + 0.05, (first, last)
    assert main(["export", str(run), str(tmp_path / "prm")]) == 0
    prm = load_reward_fn(str(tmp_path / "prm"), model_options={"aggregate": "min", "separator": ","})
    assert isinstance(prm, ProcessRewardModel)
    (scored,) = prm(["3 5 2>13:"], ["5*2=10,10+3=13"])
    assert scored["steps"] == 2 and scored["reward"] == pytest.approx(
        min(prm.step_scores(["3 5 2>13:"], ["5*2=10,10+3=13"])[0]))
