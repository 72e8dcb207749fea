"""Numeric vectors for the verl-registry entries: GMPO, DPPO-TV/KL, DRO, KL-Cov, Clip-Cov, GPG,
verl's best-of-k pass@k, GDPO and the optimal token baseline."""

import math

import pytest
import torch

from rlvr.algos.advantages import ADVANTAGES, AdvantageInputs
from rlvr.algos.aggregate import seq_mean_token_mean
from rlvr.algos.objectives import OBJECTIVES


def _lp(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_gmpo_clips_each_log_ratio_then_takes_the_geometric_mean():
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = _lp([[0.1, 0.6], [-0.6, 0.2]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    loss_tok, m = OBJECTIVES["gmpo"](logp, old, adv, mask, clip_low=0.4, clip_high=0.4)
    # row 0 (A > 0): 0.6 -> 0.4, ratio e^{(0.1+0.4)/2}; row 1 (A < 0): -0.6 -> -0.4, ratio e^{(-0.4+0.2)/2}
    torch.testing.assert_close(loss_tok.mean(-1), torch.tensor([-math.exp(0.25), math.exp(-0.1)], dtype=torch.float64))
    loss = seq_mean_token_mean(loss_tok, mask, num_seqs=2.0)
    loss.backward()
    expected = torch.tensor([[-math.exp(0.25) / 2, 0.0], [0.0, math.exp(-0.1) / 2]], dtype=torch.float64) / 2
    torch.testing.assert_close(logp.grad, expected)
    assert m["clip_frac_high"].tolist() == [[0.0, 1.0], [0.0, 0.0]]
    assert m["clip_frac_low"].tolist() == [[0.0, 0.0], [1.0, 0.0]]



def test_gmpo_clips_each_token_in_the_direction_of_its_own_advantage():
    # one row, per-token advantages [+2, -1, +2]: row mean A = 1; log-ratios [0.6, 0.6, -0.6]
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = _lp([[0.6, 0.6, -0.6]])
    adv = torch.tensor([[2.0, -1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    loss_tok, m = OBJECTIVES["gmpo"](logp, old, adv, mask, clip_low=0.4, clip_high=0.4)
    # c: token 0 (A > 0) 0.6 -> 0.4 clipped; token 1 (A < 0) keeps 0.6 (max(0.6, 0.4)); token 2
    # (A > 0) keeps -0.6 (min(-0.6, -0.4)). The row's sign (+) would clip token 1 to 0.4 instead.
    r = math.exp((0.4 + 0.6 - 0.6) / 3)
    torch.testing.assert_close(loss_tok, torch.full((1, 3), -r, dtype=torch.float64))
    seq_mean_token_mean(loss_tok, mask, num_seqs=1.0).backward()
    # d(-A r)/dl_t = -A r / 3 on the unclipped tokens 1 and 2, 0 on the clipped token 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -r / 3, -r / 3]], dtype=torch.float64))
    assert m["clip_frac_high"].tolist() == [[1.0, 0.0, 0.0]]
    assert m["clip_frac_low"].tolist() == [[0.0, 0.0, 0.0]]


def test_gmpo_counts_a_lower_clip_on_a_negative_token_of_a_positive_row():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = _lp([[-0.6, 0.0]])
    adv = torch.tensor([[-1.0, 3.0]], dtype=torch.float64)  # row mean +1
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss_tok, m = OBJECTIVES["gmpo"](logp, old, adv, mask, clip_low=0.4, clip_high=0.4)
    # token 0 (A < 0, l = -0.6): c = -min(0.6, 0.4) = -0.4, clipped (the row's + sign keeps -0.6); token 1: c = 0
    torch.testing.assert_close(loss_tok, torch.full((1, 2), -math.exp(-0.2), dtype=torch.float64))
    loss_tok.mean().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -math.exp(-0.2) / 2]], dtype=torch.float64))
    assert m["clip_frac_low"].tolist() == [[1.0, 0.0]]

def test_dppo_tv_trains_a_token_only_inside_the_probability_trust_region():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64))
    p = torch.tensor([[0.8, 0.6, 0.2, 0.45]], dtype=torch.float64)
    logp = torch.log(p).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    loss, m = OBJECTIVES["dppo_tv"](logp, old, adv, mask, clip_low=0.2, clip_high=0.2, ratio_cap=20.0)
    # moves +0.3 (out), +0.1 (in), -0.3 (out), -0.05 (in); in-tokens: -A * sg[rho] * logp
    expected = torch.tensor([[0.0, -1.2 * math.log(0.6), 0.0, 0.9 * math.log(0.45)]], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.2, 0.0, 0.9]], dtype=torch.float64))
    assert m["clip_frac_high"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert m["clip_frac_low"].tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_dppo_kl_uses_the_binary_kl_and_caps_the_weight():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.01]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.8, 0.1, 0.5]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    loss, m = OBJECTIVES["dppo_kl"](logp, old, adv, mask, clip_low=0.2, clip_high=0.2, ratio_cap=20.0)
    # 0.5 -> 0.8: binary KL 0.223 > 0.2, out; 0.5 -> 0.1 moves against A: always in (rho 0.2);
    # 0.01 -> 0.5: binary KL 1.61, out
    bkl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert bkl > 0.2
    torch.testing.assert_close(loss, torch.tensor([[0.0, -0.2 * math.log(0.1), 0.0]], dtype=torch.float64))
    _, m2 = OBJECTIVES["dppo_kl"](logp, old, adv, mask, clip_low=0.2, clip_high=5.0, ratio_cap=20.0)
    assert m2["ratio_capped_frac"].tolist() == [[0.0, 0.0, 1.0]]  # rho = 50 > 20 inside a wide region


def test_dro_gradient_is_reinforce_pulled_back_by_the_log_ratio():
    old = torch.tensor([[-1.0, -0.7, -0.2]], dtype=torch.float64)
    logp = _lp([[-0.8, -0.9, 5.0]])  # the last position is padding
    adv = torch.tensor([[2.0, -1.5, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, _ = OBJECTIVES["dro"](logp, old, adv, mask, dro_beta=0.05)
    loss.sum().backward()
    lr = torch.tensor([0.2, -0.2], dtype=torch.float64)
    torch.testing.assert_close(logp.grad[0, :2], -(adv[0, :2] - 0.05 * lr))
    assert logp.grad[0, 2] == 0
    with pytest.raises(ValueError, match="dro_beta"):
        OBJECTIVES["dro"](logp, old, adv, mask, dro_beta=0.0)


def test_kl_cov_penalises_only_the_top_covariance_tokens():
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = _lp([[-0.2, -1.5, -3.0, -1.2]])
    mask = torch.ones(1, 4, dtype=torch.float64)
    # cov_t = (A - 0)(logp - mean(logp) = -1.475): [1.275, -0.025, 1.525, 0.275] -> top-1 is token 2
    loss, m = OBJECTIVES["kl_cov"](logp, old, adv, mask, cov_ratio=0.25, cov_kl_coef=0.5)
    ratio = torch.exp(logp.detach() - old)
    expected = -adv * ratio
    expected[0, 2] += 0.5 * 2.0
    torch.testing.assert_close(loss, expected)
    assert m["cov_selected_frac"].tolist() == [[0.0, 0.0, 1.0, 0.0]]
    # floor(4 * 0.5) = 2 tokens: 2 and 0
    _, m2 = OBJECTIVES["kl_cov"](logp, old, adv, mask, cov_ratio=0.5, cov_kl_coef=0.5)
    assert m2["cov_selected_frac"].tolist() == [[1.0, 0.0, 1.0, 0.0]]


def test_clip_cov_drops_tokens_in_the_covariance_window_not_already_clipped():
    adv = torch.tensor([[2.0, 2.0, -2.0, -2.0]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = _lp([[-0.1, -2.0, -2.2, 0.0]])
    mask = torch.ones(1, 4, dtype=torch.float64)
    # mean logp -1.075; cov = [1.95, -1.85, 2.25, -2.15]; window (1, 5): tokens 0 and 2.
    # token 2 (A < 0, rho = e^-2.2 < 0.8) is PPO-clipped already, so only token 0 is dropped.
    loss, m = OBJECTIVES["clip_cov"](logp, old, adv, mask, clip_low=0.2, clip_high=0.2, cov_ratio=0.5,
                                     cov_lb=1.0, cov_ub=5.0)
    assert m["cov_selected_frac"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    ratio = torch.exp(logp.detach())
    ppo = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    torch.testing.assert_close(loss[0, 1:], ppo[0, 1:])
    assert loss[0, 0] == 0
    loss.sum().backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0


def _inp(rewards, G, mask=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float64)
    return AdvantageInputs(rewards=r, group_size=G, response_mask=mask if mask is not None else torch.ones(len(r), 1),
                           **kw)


def test_gpg_scales_the_centred_score_by_batch_over_nonzero_count():
    adv, m = ADVANTAGES["gpg"](_inp([1.0, 0.0, 0.0, 0.0], 2))
    assert adv[:, 0].tolist() == [2.0, -2.0, 0.0, 0.0] and m["gpg_alpha"] == 4.0
    adv, _ = ADVANTAGES["gpg"](_inp([1.0, 0.0, float("nan"), 3.0], 1))  # G = 1: A = alpha s over scorable rows
    assert adv[:, 0].tolist() == [1.5, 0.0, 0.0, 4.5]



def test_gpg_divides_by_f_norm():
    adv, _ = ADVANTAGES["gpg"](_inp([1.0, 0.0, 0.0, 0.0], 2), f_norm=4.0)
    assert adv[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]  # alpha 4, centred +-0.5, / 4
    with pytest.raises(ValueError, match="f_norm"):
        ADVANTAGES["gpg"](_inp([1.0, 0.0], 2), f_norm=0.0)


def test_grpo_passk_credits_only_the_best_row_with_its_gap_to_the_runner_up():
    # group 0: [0.2, 0.9, 0.5] -> row 1 gets 0.9 - 0.5 = 0.4, / (Bessel std 0.35119 + 1e-6);
    # group 1: [1, 1, 0] ties at the top -> 0; group 2: [NaN, 0.3, 0.1] -> the best scorable row
    # (0.3) gets 0.2 / (std of [0.3, 0.1] = 0.141421 + 1e-6)
    inp = _inp([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, float("nan"), 0.3, 0.1], 3)
    adv, _ = ADVANTAGES["grpo_passk"](inp)
    std0 = math.sqrt(((0.2 - 0.5333333333333333) ** 2 + (0.9 - 0.5333333333333333) ** 2
                      + (0.5 - 0.5333333333333333) ** 2) / 2)
    expected = [0.0, 0.4 / (std0 + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0, 0.2 / (math.sqrt(0.02) + 1e-6), 0.0]
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected, dtype=torch.float64))
    raw, _ = ADVANTAGES["grpo_passk"](inp, std_normalize=False, adv_eps=0.0)
    torch.testing.assert_close(raw[:, 0], torch.tensor([0, 0.4, 0, 0, 0, 0, 0, 0.2, 0], dtype=torch.float64))
    one, _ = ADVANTAGES["grpo_passk"](_inp([1.0, float("nan"), 0.0, 0.0], 2), adv_eps=0.0)
    assert one[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0]  # one scorable row: no comparison; a tie: 0, not 0 / 0
    with pytest.raises(ValueError, match="rollout.group_size >= 2"):
        ADVANTAGES["grpo_passk"](_inp([1.0, 0.0], 1))

def test_gdpo_normalises_each_component_then_whitens_the_weighted_sum():
    comps = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    inp = _inp([1.0, 0.0, 2.0, 0.0], 2, reward_components=comps, reward_weights=torch.tensor([1.0, 2.0]))
    adv, _ = ADVANTAGES["gdpo"](inp, adv_eps=0.0)
    h = 1 / math.sqrt(2)  # each [1, 0] group: Bessel std 0.7071
    total = torch.tensor([h, -h, 3 * h, -3 * h], dtype=torch.float64)
    expected = total / math.sqrt(10 / 3 * 1.0)  # mean 0, Bessel variance (0.5+0.5+4.5+4.5)/3
    torch.testing.assert_close(adv[:, 0], expected)
    # one component: whitened GRPO
    one, _ = ADVANTAGES["gdpo"](_inp([1.0, 0.0, 3.0, 0.0], 2), adv_eps=0.0)
    torch.testing.assert_close(one[:, 0], torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) * math.sqrt(3 / 4))


def _otb_inputs(rewards, mask, G=2):
    B, T = mask.shape
    return _inp(rewards, G, mask=mask, old_logp=torch.full((B, T), math.log(0.5)),
                sum_pi_squared=torch.full((B, T), 0.5))


def test_optimal_token_baseline_vectors_and_zero_tail():
    # w = 1 - 2*0.5 + 0.5 = 0.5 per token, W = cumulative sum
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    adv, _ = ADVANTAGES["optimal_token_baseline"](_otb_inputs([1.0, 0.0], mask))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]], dtype=torch.float64), atol=1e-7, rtol=0)
    # row 1 is shorter: at t = 1 only row 0 remains; zero_tail leaves it no baseline there
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = ADVANTAGES["optimal_token_baseline"](_otb_inputs([1.0, 0.0], mask))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0], [-0.5, 0.0]], dtype=torch.float64), atol=1e-7, rtol=0)
    kept, _ = ADVANTAGES["optimal_token_baseline"](_otb_inputs([1.0, 0.0], mask), zero_tail=False)
    assert abs(kept[0, 1].item()) < 1e-7  # B_1 = row 0's own return


def test_multi_turn_otb_aligns_the_kth_trained_token_of_every_row():
    gappy = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # row 0 has a masked tool output at t = 1
    adv, _ = ADVANTAGES["optimal_token_baseline_multi_turn"](_otb_inputs([1.0, 0.0], gappy))
    packed, _ = ADVANTAGES["optimal_token_baseline"](_otb_inputs([1.0, 0.0], torch.tensor([[1.0, 1.0], [1.0, 1.0]])))
    torch.testing.assert_close(adv[0, [0, 2]], packed[0])
    torch.testing.assert_close(adv[1, :2], packed[1])
    assert adv[0, 1] == 0 and adv[1, 2] == 0


def test_otb_needs_its_inputs():
    with pytest.raises(ValueError, match="sum_pi_squared"):
        ADVANTAGES["optimal_token_baseline"](_inp([1.0, 0.0], 2))
