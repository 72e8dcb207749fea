"""The Monte-Carlo calibration metric: hand vectors, a synthetic pool of known pass rates where a
posterior sampler must come out calibrated and a reversed predictor must not, and the trainer's
probe, which logs the metrics without changing the run."""

from __future__ import annotations

import math
import random

import pytest

from rlvr.builder.components import build_components
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.sampling.base import GroupFeedback
from rlvr.sampling.calibration import calibration_metrics, mc_pass_rates
from rlvr.sampling.selection import MoPPS
from rlvr.trainer.collect import produce
from rlvr.types import Example

FAST = ["rollout.prompts_per_step=2", "rollout.max_new_tokens=6", "trainer.steps=1", "task.heldout_size=4",
        "trainer.threads=1", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "model.path="]


def test_mc_pass_rates_count_scorable_completions_only():
    # 3 rollouts per prompt: [1, 0, 1] -> 2/3; [1, -, 0] -> 1/2 (the unscorable one left out); [-, -, -] -> NaN
    rates = mc_pass_rates([1, 0, 1, 1, 0, 0, 0, 0, 0], [True] * 4 + [False, True] + [False] * 3, 3)
    assert rates[:2] == pytest.approx([2 / 3, 1 / 2]) and math.isnan(rates[2])


def test_calibration_metrics_hand_vector():
    predicted, estimated = [0.1, 0.5, 0.8, 0.3], [0.0, 0.5, 1.0, math.nan]
    rho, m = calibration_metrics(predicted, estimated, rollouts=4)
    # The NaN prompt is left out: ranks agree exactly -> ρ = 1; |errors| 0.1, 0, 0.2; signed +0.1, 0, -0.2;
    # standard errors √(p(1-p)/4): 0, 0.25, 0.
    assert rho == pytest.approx(1.0) and m["sampler/calibration_mc_spearman"] == pytest.approx(1.0)
    assert m["sampler/calibration_prompts"] == 3
    assert m["sampler/calibration_mae"] == pytest.approx(0.3 / 3)
    assert m["sampler/calibration_bias"] == pytest.approx(-0.1 / 3)
    assert m["sampler/calibration_mc_stderr"] == pytest.approx(0.25 / 3)
    rho, m = calibration_metrics([0.2, 0.2], [0.1, 0.9], rollouts=4)  # a constant prediction has no rank order
    assert math.isnan(rho) and "sampler/calibration_mc_spearman" not in m


class Pool:
    """A task of 12 prompts with known pass rates 0, 1/11, ..., 1."""

    rates = {f"p{i}": i / 11 for i in range(12)}

    def sample(self, n, rng):
        return [Example(prompt=k, answer="") for k in rng.sample(sorted(self.rates), n)]


def _verdicts(prompt: str, n: int, rng: random.Random) -> tuple[float, ...]:
    return tuple(float(rng.random() < Pool.rates[prompt]) for _ in range(n))


def test_a_posterior_sampler_is_calibrated_on_a_pool_of_known_rates():
    # MoPPS without forgetting (λ = 1) sees 16 verdicts per prompt per step for 10 steps; the
    # Monte-Carlo estimate draws 400 more of its own per prompt. The posterior means must rank
    # the prompts as the estimate does and sit near it; a reversed predictor must rank them backwards.
    sampler = MoPPS(task=Pool(), rng=random.Random(0), group_size=16, seed=0, decay=1.0)
    world = random.Random(1)
    for step in range(1, 11):
        for req in sampler.propose(step, 6, 96):
            c = _verdicts(req.prompt_id, 16, world)
            sampler.observe(step, [GroupFeedback(req.prompt_id, "", step, step - 1, c, c, (False,) * 16, 0, True)])
    examples = [Example(prompt=k, answer="") for k in Pool.rates if k in sampler.table.rows]
    assert len(examples) >= 10
    flat = [v for ex in examples for v in _verdicts(ex.prompt, 400, world)]
    estimated = mc_pass_rates(flat, [True] * len(flat), 400)
    rho, m = calibration_metrics(sampler.predict(11, examples), estimated, rollouts=400)
    assert rho > 0.9 and m["sampler/calibration_mae"] < 0.08
    rho, m = calibration_metrics([1 - p for p in sampler.predict(11, examples)], estimated, rollouts=400)
    assert rho < -0.9 and m["sampler/calibration_mae"] > 0.2


def test_the_probe_logs_calibration_and_leaves_the_run_unchanged():
    common = [*FAST, "sampler.name=mopps", "rollout.group_size=4"]
    on = build_components(load_config(None, [*common, "sampler.calibration_every=1", "sampler.calibration_prompts=2",
                                             "sampler.calibration_rollouts=8"]))
    off = build_components(load_config(None, common))
    a, b = produce(on.rollout, 1), produce(off.rollout, 1)
    assert a.sampler_metrics["sampler/calibration_prompts"] == 2
    assert a.sampler_metrics["sampler/calibration_tokens"] > 0
    assert {"sampler/calibration_mae", "sampler/calibration_bias"} <= set(a.sampler_metrics)
    # The probe draws no prompt, no seed of the run and no sampler randomness, and feeds nothing back.
    assert a.got.texts == b.got.texts and a.minibatch_seed == b.minibatch_seed
    assert a.sampler_state == b.sampler_state and a.task_rng == b.task_rng


def test_calibration_needs_a_sampler_that_predicts():
    with pytest.raises(ConfigError, match="^sampler.calibration_every: sampler 'uniform' predicts no pass rates"):
        build_components(load_config(None, [*FAST, "sampler.calibration_every=5"]))
