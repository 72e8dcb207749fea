"""`kl_placement=reward` charges `algo.kl_estimator`; the adaptive controller moves β from the KL the step
charged, in the reward or in the loss; the policy-drift metrics are always logged."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.kl import adaptive_kl_coef
from rlvr.algos.objectives import ppo_clip, reinforce
from rlvr.batch import TrainBatch
from rlvr.builder.build import build_loss
from rlvr.builder.plans import reward_kl
from rlvr.config import load_config
from rlvr.trainer.parts import StepState
from rlvr.trainer.step import LossSpec, micro_batch_loss
from rlvr.trainer.sync import _adapt_kl, _shaped_rewards, charged_seq_kl

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, 0.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -2.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _batch():
    ids = torch.zeros(2, 3, dtype=torch.long)
    b = TrainBatch(ids, torch.ones(2, 3), ids, MASK, advantages=torch.zeros(2, 3))
    b.old_logp, b.ref_logp = OLD, REF
    return b


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_reward_placement_uses_the_configured_estimator(estimator):
    config = load_config(None, ["algo.kl_coef=0.5", "algo.kl_placement=reward", f"algo.kl_estimator={estimator}"])
    loss = build_loss(config)
    assert loss.kl_estimator is None  # nothing in the loss
    c = SimpleNamespace(plan=SimpleNamespace(shaping=None, reward_kl=reward_kl(config)),  # no overlong penalty
                        learner=SimpleNamespace(reference=object()), state=StepState(kl_coef=0.5))
    shaped, charged = _shaped_rewards(c, torch.tensor([1.0, 0.0]), _batch(), torch.tensor([3, 2]))
    delta = (OLD - REF) * MASK
    per_token = {"k1": delta, "k2": 0.5 * delta**2, "k3": torch.exp(-delta) + delta - 1.0}[estimator] * MASK
    torch.testing.assert_close(charged, per_token.sum(-1))
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.0]) - 0.5 * per_token.sum(-1))


def test_the_controller_moves_with_the_kl_charged_in_the_reward():
    """Hand vector: rows charged 0.3 and 0.1 (per-sequence KL 0.2) against a target of 0.1 give
    e = clip(0.2 / 0.1 - 1, ±0.2) = 0.2 and β' = 0.5 · (1 + 0.2 · 2 / 10) = 0.52; the line logs
    the β the step charged (0.5)."""
    c = SimpleNamespace(plan=SimpleNamespace(kl_controller=partial(adaptive_kl_coef, kl_target=0.1, kl_horizon=10)),
                        learner=SimpleNamespace(reference=object()), state=StepState(kl_coef=0.5))
    metrics = {"response/length_mean": 3.0}
    _adapt_kl(c, metrics, 2, torch.tensor([0.3, 0.1]))
    assert metrics["kl/coef"] == 0.5 and c.state.kl_coef == pytest.approx(0.52)
    # below the target it falls: seq KL 0.05 -> e = -0.5 clipped to -0.2 -> 0.52 · (1 - 0.04)
    _adapt_kl(c, metrics, 2, torch.tensor([0.05, 0.05]))
    assert c.state.kl_coef == pytest.approx(0.52 * 0.96)
    # the KL in the loss: the update's mean per-token KL times the mean length, as before
    assert charged_seq_kl({"actor/kl": 0.1, "response/length_mean": 3.0}, None) == pytest.approx(0.3)
    assert charged_seq_kl({"response/length_mean": 3.0}, None) is None  # no KL charged: β stays


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_adaptive_beta_moves_under_both_placements(placement):
    """Two steps of a run with `algo.kl_target` set: the KL of the first steps is far below the
    target (the policy starts at the reference), so e = -0.2 each step and β falls by
    (1 - 0.2 · B / horizon) per step, whether the KL lives in the reward or in the loss."""
    from rlvr.builder.components import build_components
    from rlvr.trainer.sync import rl_step

    config = load_config(None, ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
                                "model.intermediate_size=32", "rollout.max_new_tokens=6", "task.heldout_size=2",
                                "rollout.prompts_per_step=2", "rollout.group_size=4", "algo.dynamic_sampling=false",
                                "algo.kl_coef=0.05", f"algo.kl_placement={placement}", "algo.kl_target=1.0",
                                "algo.kl_horizon=80", "trainer.threads=1"])
    c = build_components(config)
    logged = [rl_step(c, step)[0]["kl/coef"] for step in (1, 2)]
    factor = 1 - 0.2 * 8 / 80
    assert logged == pytest.approx([0.05, 0.05 * factor]) and c.state.kl_coef == pytest.approx(0.05 * factor ** 2)


class _FixedPolicy:
    """A policy whose log-probs are a fixed tensor (with a gradient), entropy 0."""

    def __init__(self, logp):
        self.logp = logp

    def batch_logprobs(self, mb, with_entropy=False):
        return self.logp, torch.zeros_like(self.logp)


@pytest.mark.parametrize("objective", [partial(ppo_clip, clip_low=0.2, clip_high=0.2), reinforce])
def test_drift_and_clip_split_logged_with_kl_off(objective):
    new = torch.tensor([[-0.5, -2.5, -0.5], [-0.8, -3.0, 9.0]], requires_grad=True)  # 9.0 is padding
    batch = _batch()
    batch.advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    spec = LossSpec(objective=objective, aggregation=AGGREGATIONS["token_mean"], kl_estimator=None,
                    entropy_coef=0.0)
    _, sums = micro_batch_loss(_FixedPolicy(new), batch, spec, num_tokens=5.0, num_seqs=2.0)
    expected_kl = float(((OLD - new.detach()) * MASK).sum())  # padding's 9.0 excluded
    assert sums["old_policy_kl"] == pytest.approx(expected_kl)
    assert "kl" not in sums
    if objective is reinforce:
        assert sums["clip_frac_low"] == 0.0 and sums["clip_frac_high"] == 0.0
    else:  # (0, 0): A > 0, rho = e^0.5 > 1.2 is high-clipped; (1, 0): A < 0, rho = e^-0.5 < 0.8 is low-clipped
        ratio = torch.exp(new.detach() - OLD)
        high = ((ratio > 1.2) & (batch.advantages > 0) & (MASK > 0)).sum().item()
        low = ((ratio < 0.8) & (batch.advantages < 0) & (MASK > 0)).sum().item()
        assert (sums["clip_frac_high"], sums["clip_frac_low"]) == (high, low)
        assert high == 1 and low == 1
