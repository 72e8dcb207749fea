"""DMPO: centred self-normalised weights by hand, and its gradient against the distribution-matching KL."""

import math

import pytest
import torch

from rlvr.algos._advantage_core import AdvantageInputs
from rlvr.algos.advantages import get_advantage
from rlvr.algos.dmpo import dmpo, dmpo_centred, dmpo_weights
from rlvr.algos.objectives import reinforce
from rlvr.config import load_config


def test_weights_are_the_group_softmax_of_r_over_beta_and_advantages_their_centred_multiple():
    # β = 1, group [1, 0, 0, 0]: w = [e, 1, 1, 1] / (e + 3) = [0.475366, 0.174878, ...]; A = 4 w − 1
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0])
    w = dmpo_weights(scores, 4, beta=1.0)
    assert torch.allclose(w, torch.tensor([[0.475366, 0.174878, 0.174878, 0.174878]]), atol=1e-6)
    a = dmpo_centred(scores, 4, beta=1.0)
    assert torch.allclose(a, torch.tensor([[0.901463, -0.300488, -0.300488, -0.300488]]), atol=1e-6)
    assert abs(float(a.sum())) < 1e-6  # the weight baseline: centred weights sum to 0
    # β = 0.5 sharpens: w_0 = e² / (e² + 3) = 0.711235, A_0 = 4 w_0 − 1 = 1.844940
    assert abs(float(dmpo_centred(scores, 4, beta=0.5)[0, 0]) - 1.844940) < 1e-5


def test_unscorable_rows_equal_groups_and_bad_beta():
    # group 1: a NaN row is out of the softmax (n = 3: w = [e, 1, 1] / (e + 2)); group 2: all equal -> 0
    scores = torch.tensor([1.0, 0.0, float("nan"), 0.0, 0.5, 0.5, 0.5, 0.5])
    a = dmpo_centred(scores, 4, beta=1.0)
    e = math.e
    assert torch.allclose(a[0], torch.tensor([3 * e / (e + 2) - 1, 3 / (e + 2) - 1, 0.0, 3 / (e + 2) - 1]), atol=1e-6)
    assert torch.equal(a[1], torch.zeros(4))
    with pytest.raises(ValueError, match="dmpo_beta"):
        dmpo_weights(scores, 4, beta=0.0)


def test_estimator_spreads_advantages_over_valid_tokens_and_reports_ess():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, metrics = dmpo(AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_size=2, response_mask=mask))
    w0 = math.e / (math.e + 1)  # A = 2 w − 1 = ±0.462117
    assert torch.allclose(adv, torch.tensor([[2 * w0 - 1, 2 * w0 - 1, 0.0], [1 - 2 * w0, 0.0, 0.0]]), atol=1e-6)
    assert abs(metrics["dmpo_ess"] - 1 / (2 * (w0 ** 2 + (1 - w0) ** 2))) < 1e-6
    assert get_advantage("dmpo") is dmpo


def test_gradient_is_the_distribution_matching_kl_gradient_at_the_reference():
    # Categorical policy over K outcomes at π_θ = π_ref = uniform, the group = each outcome once: the
    # self-normalised weights are exactly π* ∝ π_ref exp(r/β), and DMPO's loss −Σ (w_i − 1/K) log π_θ(y_i)
    # has the gradient of KL(π* ‖ π_θ) in the logits (π_θ − π*), by autograd on both.
    r, beta = torch.tensor([1.0, 0.0, 0.3, 0.7]), 0.5
    logits = torch.zeros(4, requires_grad=True)
    logp = logits.log_softmax(-1)[:, None]  # (B = K, T = 1): row i is outcome i
    adv = dmpo_centred(r, 4, beta=beta).reshape(-1, 1) / 4  # A / G: the per-group sum
    loss, _ = reinforce(logp, logp.detach(), adv, torch.ones_like(logp))
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    target = (r / beta).softmax(-1)
    kl = (target * (target.log() - logits.log_softmax(-1))).sum()
    (kl_grad,) = torch.autograd.grad(kl, logits)
    assert torch.allclose(grad, kl_grad, atol=1e-6)
    assert torch.allclose(kl_grad, 0.25 - target, atol=1e-6)


def test_recipes_pair_the_weights_with_reinforce_on_the_elbo():
    for task in ("countdown", "sudoku"):
        cfg = load_config(f"recipes/dllm_dmpo_{task}.yaml")
        assert (cfg.algo.advantage, cfg.algo.objective, cfg.estimator.name) == ("dmpo", "reinforce", "elbo_mc")
        assert cfg.algo.dmpo_beta == 0.5
