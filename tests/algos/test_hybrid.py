"""Hybrid objectives (NFT, CHORD-φ, RL-PLUS), their mixing weights, and RPG's KL surrogates:
hand vectors, gradient checks and exact enumeration."""

import math

import pytest
import torch

from rlvr.algos import hybrid, rpg
from rlvr.algos.kl import KL_ESTIMATORS, forward_kl, k3
from rlvr.algos.objectives import OBJECTIVES, reinforce


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# ------------------------------------------------------------------------------------------ NFT

def test_nft_hand_vector_and_clip():
    # One group of 4 rows, one token each: rows 0, 1 positive, 2, 3 negative -> r̂ = 0.5, ω = 1.
    old = torch.zeros(4, 1, dtype=torch.float64)
    logp = _leaf([[math.log(1.2)], [0.0], [math.log(1.2)], [math.log(1.96)]])
    adv = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]], dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.float64)
    loss, metrics = hybrid.nft(logp, old, adv, mask, group_size=4, nft_eps=0.1)
    # positive: -log R; negative: -log max((1 - 0.5 R) / 0.5, ε); R = 1.96 gives 0.04 < ε -> -log ε.
    expected = [-math.log(1.2), 0.0, -math.log(0.8), -math.log(0.1)]
    assert loss.squeeze(-1).tolist() == pytest.approx(expected, abs=1e-12)
    loss.sum().backward()
    # d/dlogp: positive -1; negative r̂R/(1 - r̂R) = 0.6/0.4; clipped -> 0.
    assert logp.grad.squeeze(-1).tolist() == pytest.approx([-1.0, -1.0, 1.5, 0.0], abs=1e-12)
    assert metrics["nft_neg_clip_frac"].squeeze(-1).tolist() == [0, 0, 0, 1]
    assert metrics["nft_accuracy"].squeeze(-1).tolist() == [0.5] * 4


def test_nft_on_policy_gradient_is_grpo_with_population_std():
    # The paper's equivalence: with ω = sqrt((1 - r̂)/r̂) and R = 1, NFT's gradient equals the
    # policy gradient -A ∇logp with A = (y - r̂) / sqrt(r̂ (1 - r̂)).
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float64)
    group = 4
    grouped = rewards.view(-1, group)
    mean, std = grouped.mean(-1, keepdim=True), grouped.std(-1, unbiased=False, keepdim=True)
    seq_adv = torch.where(std > 0, (grouped - mean) / std.clamp(min=1e-12), torch.zeros_like(grouped)).reshape(-1)
    mask = (torch.rand(16, 5, generator=gen) > 0.2).double()
    mask[:, 0] = 1
    adv = seq_adv[:, None] * mask
    values = torch.randn(16, 5, generator=gen, dtype=torch.float64) - 2.0
    logp_nft, logp_pg = _leaf(values.tolist()), _leaf(values.tolist())
    loss, _ = hybrid.nft(logp_nft, logp_nft.detach(), adv, mask, group_size=group, nft_weight="grpo")
    (loss * mask).sum().backward()
    pg, _ = reinforce(logp_pg, logp_pg.detach(), adv, mask)
    (pg * mask).sum().backward()
    assert logp_nft.grad.abs().sum() > 0
    assert torch.allclose(logp_nft.grad, logp_pg.grad, atol=1e-10)


def test_nft_weights_and_registration():
    acc = torch.tensor([0.0, 0.25, 0.5, 1.0])
    assert hybrid.nft_prompt_weight(acc, "grpo").tolist() == pytest.approx([0.0, math.sqrt(3), 1.0, 0.0])
    assert hybrid.nft_prompt_weight(acc, "hard").tolist() == pytest.approx([1.0, 0.75, 0.5, 0.0])
    assert hybrid.nft_prompt_weight(acc, "one").tolist() == [1.0] * 4
    with pytest.raises(ValueError, match="nft_weight"):
        hybrid.nft_prompt_weight(acc, "bogus")
    assert OBJECTIVES["nft"] is hybrid.nft
    with pytest.raises(ValueError, match="whole groups"):
        hybrid.nft(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2), group_size=2)


def test_nft_all_negative_group_and_padding_get_no_gradient():
    logp = _leaf([[-1.0, float("nan")], [-2.0, -0.5]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    adv = torch.zeros(2, 2, dtype=torch.float64)  # r̂ = 0: the implicit negative policy is the old one
    loss, _ = hybrid.nft(logp, logp.detach().nan_to_num(), adv, mask, group_size=2, nft_weight="one")
    loss.sum().backward()
    assert loss.abs().sum() == 0 and torch.equal(logp.grad, torch.zeros_like(logp))


# ---------------------------------------------------------------------------- expert objectives

def test_sft_and_chord_phi_vectors():
    p = torch.tensor([[0.5, 0.9, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    logp = _leaf(p.log().tolist())
    loss, metrics = hybrid.chord_phi(logp, logp.detach(), None, torch.zeros_like(p), mask)
    loss.sum().backward()
    phi = [0.25, 0.09, 0.0]
    assert loss.squeeze(0).tolist() == pytest.approx([-0.25 * math.log(0.5), -0.09 * math.log(0.9), 0.0])
    assert logp.grad.squeeze(0).tolist() == pytest.approx([-f for f in phi])  # −φ(p) ∇logp, φ detached
    assert metrics["chord_phi"].squeeze(0).tolist() == pytest.approx(phi)
    logp2 = _leaf(p.log().tolist())
    loss, _ = hybrid.sft(logp2, logp2.detach(), None, torch.zeros_like(p), mask)
    loss.sum().backward()
    assert logp2.grad.squeeze(0).tolist() == [-1.0, -1.0, 0.0]


def test_rlplus_mis_ratio_and_exploration_weight():
    logp = _leaf([[math.log(0.5), math.log(0.8)]])
    old = torch.tensor([[math.log(0.5), math.log(0.4)]], dtype=torch.float64)
    adv = torch.full((1, 2), 2.0, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = hybrid.rlplus(logp, old, None, adv, mask, rlplus_gamma=2.0)  # π_ω = 1
    ratio = [0.5 / ((0.5 + 1) / 2), 0.8 / ((0.4 + 1) / 2)]
    explore = [0.5 ** 2, 0.2 ** 2]
    assert metrics["mis_ratio"].squeeze(0).tolist() == pytest.approx(ratio)
    assert metrics["explore_weight"].squeeze(0).tolist() == pytest.approx(explore)
    assert loss.squeeze(0).tolist() == pytest.approx([-r * 2.0 * e for r, e in zip(ratio, explore)])
    loss.sum().backward()  # d ratio / d logp = ratio; the weight is detached
    assert logp.grad.squeeze(0).tolist() == pytest.approx([-r * 2.0 * e for r, e in zip(ratio, explore)])
    # A known expert behaviour log-prob enters the mixture.
    loss, metrics = hybrid.rlplus(logp.detach(), old, torch.full((1, 2), math.log(0.5), dtype=torch.float64),
                                  adv, mask)
    assert metrics["mis_ratio"][0, 0].item() == pytest.approx(1.0)


def test_mix_weights_normalise_each_side_over_its_own_rows():
    expert = torch.tensor([False, False, False, True])
    assert hybrid.mix_weights(expert, 0.5).tolist() == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert hybrid.mix_weights(expert, 0.25, keep_onpolicy=True).tolist() == pytest.approx([4 / 3] * 3 + [1.0])
    assert hybrid.mix_weights(expert, 0.0).tolist() == pytest.approx([4 / 3] * 3 + [0.0])
    units = torch.tensor([2.0, 2.0, 4.0, 8.0])  # token_mean: each side's share of the tokens
    assert hybrid.mix_weights(expert, 0.5, units=units).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert hybrid.mix_weights(torch.tensor([True, True]), 0.5).tolist() == pytest.approx([0.5, 0.5])


def test_chord_mu_schedule():
    mu = [hybrid.chord_mu(s, weight=1.0, weight_final=0.0, decay_steps=10) for s in (1, 6, 11, 50)]
    assert mu == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert hybrid.chord_mu(7, weight=0.3, weight_final=None, decay_steps=10) == 0.3


def test_expert_advantages_pool_the_steps_rewards():
    adv = hybrid.expert_advantages(torch.tensor([1.0]), torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert adv.tolist() == pytest.approx([0.6 / math.sqrt(0.3)], rel=1e-5)  # mean 0.4, Bessel std √0.3
    assert hybrid.expert_advantages(torch.tensor([1.0]), torch.tensor([])).tolist() == [0.0]
    nan = hybrid.expert_advantages(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]))
    assert nan[0] == 0 and nan[1] > 0


# ------------------------------------------------------------------------------------------ RPG

def _categoricals(seed):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    old = torch.randn(6, generator=gen, dtype=torch.float64).log_softmax(0)
    ref = torch.randn(6, generator=gen, dtype=torch.float64).log_softmax(0)
    return theta, old, ref


@pytest.mark.parametrize("name, target", [
    ("rpg_rkl", lambda lp, ref: (lp.exp() * (lp - ref)).sum()),
    ("rpg_urkl", lambda lp, ref: (lp.exp() * (lp - ref)).sum()),
    ("rpg_fkl", lambda lp, ref: (ref.exp() * (ref - lp)).sum()),
    ("rpg_ufkl", lambda lp, ref: (ref.exp() * (ref - lp)).sum()),
])
def test_rpg_surrogates_are_exact_off_policy_by_enumeration(name, target):
    # E_{y~π_old}[surrogate(y)] over all six tokens: the divergence's value and its gradient in θ.
    theta, old, ref = _categoricals(3)
    logp = theta.log_softmax(0)
    surrogate = (old.exp() * KL_ESTIMATORS[name](logp, ref, old_logp=old)).sum()
    (grad,) = torch.autograd.grad(surrogate, theta)
    exact = target(theta.log_softmax(0), ref)
    (exact_grad,) = torch.autograd.grad(exact, theta)
    assert surrogate.item() == pytest.approx(exact.item(), abs=1e-12)
    assert torch.allclose(grad, exact_grad, atol=1e-12)


def test_rpg_unnormalised_forms_reduce_on_policy_to_k3_and_forward_kl():
    gen = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(3, 4, generator=gen) * 3, -torch.rand(3, 4, generator=gen) * 3
    assert torch.allclose(rpg.rpg_urkl(logp, ref), k3(logp, ref), atol=1e-6)
    assert torch.allclose(rpg.rpg_ufkl(logp, ref), forward_kl(logp, ref), atol=1e-6)


# ----------------------------------------------------------------------------------------- ShiQ

def _two_step_batch(policy_logits, ref_logits, reward):
    """All 9 sequences of a vocab-3, two-token MDP: logp, ref_logp, lse, ref_lse, token rewards."""
    from itertools import product

    rows = {k: [] for k in ("logp", "ref_logp", "lse", "ref_lse", "rewards")}
    for a0, a1 in product(range(3), range(3)):
        pol, ref = (policy_logits["root"], policy_logits[a0]), (ref_logits["root"], ref_logits[a0])
        rows["logp"].append([pol[0].log_softmax(0)[a0], pol[1].log_softmax(0)[a1]])
        rows["ref_logp"].append([ref[0].log_softmax(0)[a0], ref[1].log_softmax(0)[a1]])
        rows["lse"].append([pol[0].logsumexp(0), pol[1].logsumexp(0)])
        rows["ref_lse"].append([ref[0].logsumexp(0), ref[1].logsumexp(0)])
        rows["rewards"].append([torch.tensor(0.0, dtype=torch.float64), reward[a0, a1]])
    return {k: torch.stack([torch.stack(r) for r in v]) for k, v in rows.items()}


def test_shiq_residuals_vanish_exactly_at_the_soft_optimal_policy():
    from rlvr.algos.offpolicy import shiq_loss, shiq_residuals

    gen = torch.Generator().manual_seed(5)
    beta = 0.5
    ref = {k: torch.randn(3, generator=gen, dtype=torch.float64) for k in ("root", 0, 1, 2)}
    reward = torch.rand(3, 3, generator=gen, dtype=torch.float64)
    # Backward induction: Q*(s1, a1) = r, V*(s1) = β log Σ π_ref e^{Q/β}; Q*(s0, a0) = V*(s1(a0)).
    q1 = {a0: reward[a0] for a0 in range(3)}
    v1 = torch.stack([beta * (ref[a0].log_softmax(0) + q1[a0] / beta).logsumexp(0) for a0 in range(3)])
    optimal = {"root": ref["root"] + v1 / beta, **{a0: ref[a0] + q1[a0] / beta for a0 in range(3)}}
    b = _two_step_batch(optimal, ref, reward)
    mask = torch.ones(9, 2, dtype=torch.float64)
    delta = shiq_residuals(b["logp"], b["ref_logp"], b["lse"], b["ref_lse"], b["rewards"], mask, beta=beta)
    assert delta.abs().max() < 1e-12
    off = {k: v + 0.3 * torch.randn(3, generator=gen, dtype=torch.float64) for k, v in optimal.items()}
    b = _two_step_batch(off, ref, reward)
    loss = shiq_loss(b["logp"], b["ref_logp"], b["lse"], b["ref_lse"], b["rewards"], mask, beta=beta)
    assert loss.sum() > 1e-4
    short = mask.clone()
    short[0, 1] = 0  # a one-token row: its return is what sits on its valid tokens
    delta = shiq_residuals(b["logp"], b["ref_logp"], b["lse"], b["ref_lse"], b["rewards"], short, beta=beta)
    assert delta[0, 1] == 0
    expected = beta * (b["logp"][0, 0] - b["ref_logp"][0, 0] + b["lse"][0, 0] - b["ref_lse"][0, 0])
    assert delta[0, 0].item() == pytest.approx(expected.item())
