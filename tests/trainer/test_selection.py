"""MoPPS prompt selection: the posterior update, the ranking, target seeking, and exact resume."""

import json
import random
import shutil

import pytest

from rlvr.cli import main
from rlvr.sampling.selection import PosteriorSelector, closest_to_target, posterior_update
from rlvr.types import Example


def test_posterior_update_vectors():
    # λ = 1 is the plain conjugate update; λ = 0.5 pulls old evidence halfway back to the prior.
    assert posterior_update(1.0, 1.0, 3, 5, decay=1.0) == (4.0, 6.0)
    assert posterior_update(4.0, 6.0, 2, 2, decay=0.5) == pytest.approx((4.5, 5.5), abs=1e-12)
    assert posterior_update(4.0, 6.0, 0, 8, decay=0.0) == (1.0, 9.0)  # λ = 0: only the latest group counts


def test_closest_to_target_keeps_candidate_order_and_breaks_ties_by_index():
    rates = [0.0, 0.75, 1.0, 0.25, 0.5]
    assert closest_to_target(rates, 1, 0.5) == [4]
    assert closest_to_target(rates, 2, 0.5) == [1, 4]  # 0.75 and 0.25 tie exactly; the earlier one wins
    assert closest_to_target(rates, 3, 0.0) == [0, 3, 4]


def _dead_fraction_and_distance(selector, p_true, steps, n, group):
    """Run a synthetic pool with known success rates; Bernoulli verdicts feed the selector."""
    rng = random.Random(7)
    pool = [Example(prompt=f"q{i}", answer="", meta={}) for i in range(len(p_true))]
    dead = distance = 0.0
    for _ in range(steps):
        if selector is None:
            chosen = rng.sample(pool, n)
        else:
            chosen = selector.choose(rng.sample(pool, selector.num_candidates(n)), n)
        for ex in chosen:
            p = p_true[int(ex.prompt[1:])]
            s = sum(rng.random() < p for _ in range(group))
            dead += s in (0, group)
            distance += abs(p - 0.5)
            if selector is not None:
                selector.observe(ex.prompt, s, group)
    total = steps * n
    return dead / total, distance / total


def test_selection_seeks_informative_prompts_on_a_known_pool():
    # 200 prompts, true success rates uniform in [0, 1], G = 8: after the posteriors fill, MoPPS
    # must pick prompts nearer p = 0.5 and waste fewer groups on all-equal verdicts than uniform.
    p_true = [random.Random(i).random() for i in range(200)]
    uniform = _dead_fraction_and_distance(None, p_true, 300, 8, 8)
    mopps = _dead_fraction_and_distance(
        PosteriorSelector(candidates_per_prompt=3.0, target=0.5, decay=1.0, seed=0), p_true, 300, 8, 8)
    assert mopps[1] < 0.7 * uniform[1], (mopps, uniform)
    assert mopps[0] < 0.7 * uniform[0], (mopps, uniform)


def test_state_dict_round_trip_repeats_the_same_choices():
    a = PosteriorSelector(candidates_per_prompt=2.0, target=0.5, decay=0.5, seed=3)
    cands = [Example(prompt=f"q{i}", answer="", meta={}) for i in range(10)]
    for i in range(10):
        a.observe(f"q{i}", i % 5, 4)
    b = PosteriorSelector(candidates_per_prompt=2.0, target=0.5, decay=0.5, seed=99)
    b.load_state_dict(a.state_dict())
    assert [[e.prompt for e in a.choose(cands, 5)] for _ in range(5)] == \
           [[e.prompt for e in b.choose(cands, 5)] for _ in range(5)]


def _read(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
            for line in path.read_text().splitlines()]


def test_mopps_run_resumes_exactly(tmp_path, capsys):
    # A run resumed from its step-2 checkpoint logs what the uninterrupted run logged, so the
    # selector's posteriors and its random state are part of the checkpoint.
    args = ["train", "rollout.prompt_selection=mopps", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "trainer.steps=4", "trainer.save_every=2", "trainer.eval_every=0", "task.heldout_size=20",
            "trainer.threads=1", f"trainer.out_dir={tmp_path}", "seed=5"]
    assert main([*args, "trainer.name=straight"]) == 0, capsys.readouterr().err
    assert main([*args, "trainer.name=cut"]) == 0, capsys.readouterr().err
    shutil.rmtree(next((tmp_path / "cut" / "checkpoints").glob("*4")))
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 0, capsys.readouterr().err
    straight, resumed = _read(tmp_path / "straight" / "metrics.jsonl"), _read(tmp_path / "cut" / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [0, 1, 2, 3, 4]
    assert resumed == straight
    assert straight[-1]["selection/prompts_seen"] >= 2
