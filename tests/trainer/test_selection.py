"""MoPPS prompt selection: the posterior update, the ranking, target seeking, and exact resume."""

import json
import random
import shutil

import pytest

from rlvr.cli import main
from rlvr.sampling.base import GroupFeedback
from rlvr.sampling.selection import MoPPS, closest_to_target, posterior_update
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


class Pool:
    """A synthetic task: prompts q0..qN drawn uniformly without replacement per call."""

    def __init__(self, n):
        self.pool = [Example(prompt=f"q{i}", answer="", meta={}) for i in range(n)]

    def sample(self, n, rng):
        return rng.sample(self.pool, n)


def verdicts(step, chosen, p_true, rng, group):
    """Bernoulli feedback for the chosen requests from their known success rates."""
    out = []
    for req in chosen:
        s = sum(rng.random() < p_true[int(req.prompt_id[1:])] for _ in range(req.n_rollouts))
        out.append(GroupFeedback(req.prompt_id, req.source, step, step - 1, (0.0,) * req.n_rollouts,
                                 (1.0,) * s + (0.0,) * (req.n_rollouts - s), (False,) * req.n_rollouts, 0, True))
    return out


def _dead_fraction_and_distance(make, p_true, steps, n, group):
    """Run a synthetic pool with known success rates; Bernoulli verdicts feed the sampler."""
    rng = random.Random(7)
    sampler = make(Pool(len(p_true)), rng)
    dead = distance = 0.0
    for step in range(1, steps + 1):
        chosen = sampler.propose(step, n, n * group)
        fb = verdicts(step, chosen, p_true, rng, group)
        for f in fb:
            dead += f.successes in (0, group)
            distance += abs(p_true[int(f.prompt_id[1:])] - 0.5)
        sampler.observe(step, fb)
    total = steps * n
    return dead / total, distance / total


def uniform(task, rng):
    from rlvr.sampling.base import Uniform
    return Uniform(task=task, rng=rng, group_size=8)


def test_selection_seeks_informative_prompts_on_a_known_pool():
    # 200 prompts, true success rates uniform in [0, 1], G = 8: after the posteriors fill, MoPPS
    # must pick prompts nearer p = 0.5 and waste fewer groups on all-equal verdicts than uniform.
    p_true = [random.Random(i).random() for i in range(200)]
    base = _dead_fraction_and_distance(uniform, p_true, 300, 8, 8)
    mopps = _dead_fraction_and_distance(
        lambda task, rng: MoPPS(task=task, rng=rng, group_size=8, seed=0, candidates=3.0, target=0.5, decay=1.0),
        p_true, 300, 8, 8)
    assert mopps[1] < 0.7 * base[1], (mopps, base)
    assert mopps[0] < 0.7 * base[0], (mopps, base)


def test_state_dict_round_trip_repeats_the_same_choices():
    task = Pool(10)
    a = MoPPS(task=task, rng=random.Random(1), group_size=4, seed=3, decay=0.5)
    a.observe(0, [GroupFeedback(f"q{i}", "", 0, 0, (0.0,) * 4, (1.0,) * (i % 5) + (0.0,) * (4 - i % 5),
                                (False,) * 4, 0, True) for i in range(10)])
    b = MoPPS(task=task, rng=random.Random(1), group_size=4, seed=99, decay=0.5)
    b.load_state_dict(a.state_dict())
    assert [[r.prompt_id for r in a.propose(1, 5, 20)] for _ in range(5)] == \
           [[r.prompt_id for r in b.propose(1, 5, 20)] for _ in range(5)]


def _read(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
            for line in path.read_text().splitlines()]


def test_mopps_run_resumes_exactly(tmp_path, capsys):
    # A run resumed from its step-2 checkpoint logs what the uninterrupted run logged, so the
    # sampler's posteriors and its random state are part of the checkpoint.
    args = ["train", "sampler.name=mopps", "rollout.prompts_per_step=2", "rollout.group_size=4",
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
