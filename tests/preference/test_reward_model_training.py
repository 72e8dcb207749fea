"""`rlvr rm`: Bradley–Terry training on Countdown pairs made from the verifier, held-out pairwise
accuracy, a run directory whose export `reward.fn` loads and scores as a direct forward does."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlvr.preference.pairs import Pair, verifier_pairs
from rlvr.preference.reward_model import _margins
from rlvr.tasks.countdown import Countdown


def test_verifier_pairs_rank_a_solution_over_a_wrong_expression():
    task = Countdown(heldout_size=10)
    examples = task.sample(20, random.Random(0))
    pairs = verifier_pairs(task, examples, random.Random(1))
    assert len(pairs) == 20
    for ex, pair in zip(examples, pairs):
        fields = {"answer": ex.answer, "meta": ex.meta}
        assert pair.prompt == ex.prompt
        assert task.reward(ex.prompt, pair.chosen, **fields) == 1.0
        assert task.reward(ex.prompt, pair.rejected, **fields) == 0.1  # well-formed, wrong
        assert sorted(pair.rejected.replace("+", " ").replace("-", " ").replace("*", " ").split()) == sorted(
            str(n) for n in ex.meta["numbers"])  # over the problem's own numbers


def test_a_pairs_own_margin_else_the_configs():
    pairs = [Pair("q", "a", "b", margin=2.0), Pair("q", "a", "b")]
    assert _margins(pairs, 0.5).tolist() == [2.0, 0.5]


def test_rlvr_rm_learns_and_its_export_is_a_reward_function(tmp_path, capsys):
    from rlvr.cli import main
    from rlvr.rewards.reward_model import RewardModel, encode_pairs, sequence_scores
    from rlvr.rewards.runner import load_reward_fn

    args = ["rm", "preference.steps=60", "preference.pairs=256", "preference.heldout_pairs=64",
            "preference.batch_size=16", "preference.eval_every=30", "preference.lr=1e-3",
            "trainer.threads=1", f"trainer.out_dir={tmp_path}"]
    assert main(args) == 0
    run = tmp_path / "rm_countdown_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(61))
    first, last = lines[0]["eval/heldout_pair_accuracy"], lines[-1]["eval/heldout_pair_accuracy"]
    assert last > first + 0.1, (first, last)  # measured: 0.578 at step 0, 0.734 at 60
    assert lines[-1]["rm/loss"] < lines[1]["rm/loss"]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert main(["export", str(run), str(tmp_path / "rm")]) == 0

    fn = load_reward_fn(str(tmp_path / "rm"))
    assert isinstance(fn, RewardModel)
    prompts, completions = ["3 5 2>13:", "3 5 2>13:"], ["3+5*2", "3*5+2"]
    got = [r["raw"] for r in fn(prompts, completions)]
    ids, mask = encode_pairs(fn.tokenizer, prompts, completions, pad_id=fn.pad_id)
    with torch.no_grad():
        direct = [float(fn.model(input_ids=ids[i:i + 1, :int(mask[i].sum())]).logits[0, 0]) for i in range(2)]
    assert got == pytest.approx(direct, abs=1e-5)
    assert sequence_scores(fn.model, ids, mask).shape == (2,)
    assert "done: step 60" in capsys.readouterr().out


def test_near_miss_pairs_differ_from_the_solution_in_one_operator():
    task = Countdown(heldout_size=10)
    examples = task.sample(30, random.Random(0))
    pairs = verifier_pairs(task, examples, random.Random(1), rejected="near_miss")
    assert len(pairs) >= 25  # a problem whose every one-operator edit keeps the value gives no pair
    for pair in pairs:
        ex = next(e for e in examples if e.prompt == pair.prompt)
        fields = {"answer": ex.answer, "meta": ex.meta}
        assert task.reward(ex.prompt, pair.chosen, **fields) == 1.0
        assert task.reward(ex.prompt, pair.rejected, **fields) == 0.1  # well-formed, wrong
        diff = [(a, b) for a, b in zip(pair.chosen, pair.rejected) if a != b]
        assert len(pair.chosen) == len(pair.rejected) and len(diff) == 1
        assert diff[0][0] in "+-*" and diff[0][1] in "+-*"
