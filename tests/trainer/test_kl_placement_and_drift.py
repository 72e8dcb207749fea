"""`kl_placement=reward` charges `algo.kl_estimator`; the policy-drift metrics are always logged."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.objectives import ppo_clip, reinforce
from rlvr.batch import TrainBatch
from rlvr.builder.build import build_loss
from rlvr.config import load_config
from rlvr.trainer.step import LossSpec, micro_batch_loss
from rlvr.trainer.sync import _shaped_rewards

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
    c = SimpleNamespace(plan=SimpleNamespace(shaping=None), reference=object(), loss=loss)  # no overlong penalty
    shaped = _shaped_rewards(c, torch.tensor([1.0, 0.0]), _batch(), torch.tensor([3, 2]))
    delta = (OLD - REF) * MASK
    per_token = {"k1": delta, "k2": 0.5 * delta**2, "k3": torch.exp(-delta) + delta - 1.0}[estimator] * MASK
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.0]) - 0.5 * per_token.sum(-1))


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
