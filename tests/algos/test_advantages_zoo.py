"""Hand vectors for opo, lite_ppo, maxrl, passk and the token-level estimators."""

import itertools
import math

import pytest
import torch

from rlvr.algos.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    dr_grpo,
    gae,
    gae_returns,
    grpo,
    lite_ppo,
    maxrl,
    opo,
    passk,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
)
from rlvr.algos.returns import discounted_returns

nan = math.nan


def _inp(rewards, group_size, T=1, mask=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float64)
    m = torch.ones(len(rewards), T, dtype=torch.float64) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return AdvantageInputs(rewards=r, group_size=group_size, response_mask=m, **kw)


def _close(a, b, atol=1e-6):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=atol, rtol=0)


TURN_LEVEL = {"gigpo", "turn_return"}  # read per-turn tensors of agent episodes: tests/agents/test_credit.py


def test_registry_has_the_zoo():
    assert set(ADVANTAGES) == {
        "grpo", "dr_grpo", "rloo", "opo", "lite_ppo", "maxrl", "passk",
        "reinforce_pp", "reinforce_pp_baseline", "remax", "gae",
        "gpg", "grpo_passk", "gdpo", "optimal_token_baseline", "optimal_token_baseline_multi_turn", "lightning", "dmpo",
        *TURN_LEVEL,
    }


@pytest.mark.parametrize("name", sorted(set(ADVANTAGES) - TURN_LEVEL))
def test_every_estimator_masks_and_never_returns_nan(name):
    mask = [[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]]
    kw = {"values": torch.full((4, 3), 0.5, dtype=torch.float64), "baseline_rewards": torch.tensor([0.5, 1.0]),
          "old_logp": torch.full((4, 3), -0.7, dtype=torch.float64),
          "sum_pi_squared": torch.full((4, 3), 0.4, dtype=torch.float64),
          "trace": torch.tensor([[0, 1, 2], [0, 0, 1], [0, 0, 0], [1, 0, 0]])}
    adv, metrics = ADVANTAGES[name](_inp([1, nan, 0, 1], 2, mask=mask, **kw))
    assert adv.shape == (4, 3) and not torch.isnan(adv).any()
    assert torch.all(adv[torch.tensor(mask) == 0] == 0)
    assert torch.all(adv[1] == 0)  # the NaN row
    assert all(isinstance(v, float) for v in metrics.values())


# --- opo ---------------------------------------------------------------------------------------

def test_opo_length_weighted_baseline():
    # lengths [2, 4, 1, 3], rewards [1, 0, 1, 0]: b = (2*1 + 1*1) / (2+4+1+3) = 0.3
    mask = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    adv, _ = opo(_inp([1, 0, 1, 0], 4, mask=mask))
    _close(adv[:, 0], [0.7, -0.3, 0.7, -0.3])


def test_opo_equal_lengths_is_dr_grpo_and_constant_group_is_zero():
    inp = _inp([1, 0, 0, 0.2, 0.2, 0.2], 3, T=2)
    adv, _ = opo(inp)
    _close(adv[:3, 0], [2 / 3, -1 / 3, -1 / 3])  # mean 1/3
    assert torch.all(adv[3:] == 0)
    torch.testing.assert_close(adv, dr_grpo(inp)[0])


# --- lite_ppo ----------------------------------------------------------------------------------

def test_lite_ppo_group_mean_batch_std():
    # group means 0.25, 0.75; batch std_u of [1,0,0,0,1,1,1,0] = sqrt(8*0.25/7) = 0.5345225
    adv, m = lite_ppo(_inp([1, 0, 0, 0, 1, 1, 1, 0], 4))
    _close(adv[:, 0], [1.403119, -0.467706, -0.467706, -0.467706, 0.467706, 0.467706, 0.467706, -1.403119])
    assert abs(m["batch_std"] - 0.5345225) < 1e-6


def test_lite_ppo_constant_group_stays_zero():
    adv, _ = lite_ppo(_inp([1, 1, 1, 0], 2))
    assert torch.all(adv[:2] == 0)
    _close(adv[2:, 0], [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)])  # batch std_u of [1,1,1,0] = 0.5


# --- maxrl -------------------------------------------------------------------------------------

def test_maxrl_vectors_and_limit_cases():
    # p_hat = 1/4 -> success 1/0.25 - 1 = 3, failures -1; p_hat = 1/2 -> +-1;
    # p_hat = 0 -> -1 everywhere (control variate kept); p_hat = 1 -> 0 everywhere
    adv, m = maxrl(_inp([1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1], 4))
    _close(adv[:, 0], [3, -1, -1, -1, 1, 1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0])
    assert m["all_fail_group_frac"] == 0.25


def test_maxrl_singleton_groups_and_nan():
    # G = 1: N = 1, A = r - 1: success 0, failure -1 (an unbiased RL gradient)
    adv, _ = maxrl(_inp([1, 0], 1))
    _close(adv[:, 0], [0, -1])
    # NaN excluded: p_hat = 1/3 over [1, 0, 0] -> [2, 0, -1, -1]; an all-NaN group -> 0
    adv, _ = maxrl(_inp([1, nan, 0, 0, nan, nan, nan, nan], 4))
    _close(adv[:, 0], [2, 0, -1, -1, 0, 0, 0, 0])


def test_maxrl_graded_and_invalid_rewards():
    adv, _ = maxrl(_inp([0.5, 0.0], 2))  # p_hat = 0.25 -> [0.5/0.25 - 1, -1]
    _close(adv[:, 0], [1, -1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        maxrl(_inp([1.5, 0.0], 2))
    with pytest.raises(ValueError, match="token_rewards"):
        maxrl(_inp([1, 0], 2, token_rewards=torch.zeros(2, 1)))


# --- passk -------------------------------------------------------------------------------------

def _passk_brute(rewards, k):
    """Average over k-subsets containing i of (max(subset) - mean) / std, by enumeration."""
    subsets = list(itertools.combinations(range(len(rewards)), k))
    g = {s: max(rewards[j] for j in s) for s in subsets}
    mean = sum(g.values()) / len(g)
    std = math.sqrt(sum((v - mean) ** 2 for v in g.values()) / len(g))
    return [sum((g[s] - mean) / std for s in subsets if i in s) / sum(1 for s in subsets if i in s)
            for i in range(len(rewards))]


def test_passk_hand_vector():
    # n=4, one success, k=2: R_bar = 1 - C(3,2)/C(4,2) = 0.5, sigma = 0.5
    # success (1 - 0.5)/0.5 = 1; failure (1 - 0.5 - C(2,1)/C(3,1))/0.5 = (0.5 - 2/3)/0.5 = -1/3
    adv, _ = passk(_inp([1, 0, 0, 0], 4), pass_k=2, adv_eps=0.0)
    _close(adv[:, 0], [1, -1 / 3, -1 / 3, -1 / 3])


PASSK_CASES = [([1, 0, 0, 0, 0, 1], 2), ([1, 0, 0, 0, 0, 1], 3), ([0, 1, 1, 0, 0], 2), ([0, 1, 0, 0, 0, 0, 0, 0], 5)]


@pytest.mark.parametrize("rewards,k", PASSK_CASES)
def test_passk_matches_subset_enumeration(rewards, k):
    adv, _ = passk(_inp(rewards, len(rewards)), pass_k=k, adv_eps=0.0)
    _close(adv[:, 0], _passk_brute(rewards, k))


def test_passk_k1_is_grpo_with_biased_std_and_degenerate_groups():
    adv, _ = passk(_inp([1, 0, 0, 1, 1, 0], 6), pass_k=1, adv_eps=0.0)
    _close(adv[:, 0], [1, -1, -1, 1, 1, -1])  # (r - 0.5) / 0.5, the biased-std signature
    adv, _ = passk(_inp([1, 1, 0, 0, nan, 1], 2), pass_k=2)
    assert torch.all(adv == 0)  # all-pass, all-fail, one scorable
    with pytest.raises(ValueError):
        passk(_inp([0.5, 0], 2))
    with pytest.raises(ValueError):
        passk(_inp([1, 0], 2), pass_k=0)


# --- token_rewards (KL in the reward) ----------------------------------------------------------

def test_outcome_estimators_fold_token_rewards_into_the_score():
    tok = torch.tensor([[0.1, -0.2], [0.0, 0.3], [0.5, 0.0], [0.0, 0.0]], dtype=torch.float64)
    mask = [[1, 1], [1, 1], [1, 0], [1, 1]]  # the 0.0 at [2, 1] is padding anyway
    with_tok, _ = grpo(_inp([1, 0, 1, 0], 4, mask=mask, token_rewards=tok))
    folded, _ = grpo(_inp([0.9, 0.3, 1.5, 0.0], 4, mask=mask))
    torch.testing.assert_close(with_tok, folded)


# --- REINFORCE++ ---------------------------------------------------------------------------------

def test_discounted_returns_skip_masked_tokens():
    # R = 1 at the last valid token (t=2); t=1 is an observation token: carried, 0 there
    r = torch.tensor([[0.0, 0.0, 1.0]])
    _close(discounted_returns(r, torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5), [[0.5, 0.0, 1.0]])


def test_reinforce_pp_global_whitening():
    mask = [[1, 1, 1], [1, 1, 0]]
    # gamma 1: token returns 1,1,1 | 0,0: mean 0.6, std_u sqrt((3*.16 + 2*.36)/4) = 0.5477226
    adv, _ = reinforce_pp(_inp([1, 0], 2, mask=mask))
    _close(adv, [[0.730295, 0.730295, 0.730295], [-1.095443, -1.095443, 0.0]])
    # gamma 0.5: returns .25,.5,1 | 0,0: mean .35, std_u sqrt(.7/4) = .4183300
    adv, _ = reinforce_pp(_inp([1, 0], 2, mask=mask), gamma=0.5)
    _close(adv, [[-0.239045, 0.358568, 1.553793], [-0.836658, -0.836658, 0.0]])


def test_reinforce_pp_baseline():
    # centred: [.5, -.5] and a constant group [0, 0]; std_u of [.5,-.5,0,0] = 0.4082483
    adv, _ = reinforce_pp_baseline(_inp([1, 0, 1, 1], 2))
    _close(adv[:, 0], [1.224742, -1.224742, 0.0, 0.0])


# --- ReMax -------------------------------------------------------------------------------------

def test_remax_greedy_baseline():
    mask = [[1, 1], [1, 0], [1, 1], [0, 0]]
    adv, _ = remax(_inp([1, 0, 1, 1], 2, mask=mask, baseline_rewards=torch.tensor([0.5, 1.0])))
    _close(adv, [[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])  # R - b on valid tokens
    adv, _ = remax(_inp([1, 0], 2, T=2, baseline_rewards=torch.tensor([nan])))
    assert torch.all(adv == 0)
    with pytest.raises(ValueError, match="baseline_rewards"):
        remax(_inp([1, 0], 2))


# --- GAE ---------------------------------------------------------------------------------------

def test_gae_anchor_vector():
    # r = [0, 0, 1], V = [.5, .6, .7], gamma 1, lam .95:
    # delta = [.1, .1, .3]; A_2 = .3, A_1 = .1 + .95*.3 = .385, A_0 = .1 + .95*.385 = .46575
    inp = _inp([1.0], 1, T=3, values=torch.tensor([[0.5, 0.6, 0.7]], dtype=torch.float64))
    _close(gae_returns(inp, gamma=1.0, lam=0.95), [[0.96575, 0.985, 1.0]])
    adv, m = gae(inp, gamma=1.0, lam=0.95)
    raw = torch.tensor([0.46575, 0.385, 0.3], dtype=torch.float64)
    _close(adv[0], (raw - raw.mean()) / (raw.std() + 1e-6))
    assert abs(m["raw_adv_mean"] - raw.mean().item()) < 1e-9


def test_gae_skips_masked_tokens():
    # t=1 masked: V there (9.9) is never read; A_2 = .3, A_0 = (0 + .7 - .5) + .95*.3 = .485
    inp = _inp([1.0], 1, mask=[[1, 0, 1]], values=torch.tensor([[0.5, 9.9, 0.7]], dtype=torch.float64))
    _close(gae_returns(inp, gamma=1.0, lam=0.95), [[0.985, 0.0, 1.0]])


def test_gae_nan_rows_and_missing_values():
    values = torch.tensor([[0.5, 0.5], [0.2, 0.3]], dtype=torch.float64)
    inp = _inp([1.0, nan], 2, T=2, values=values)
    adv, _ = gae(inp)
    assert torch.all(adv[1] == 0)
    _close(gae_returns(inp)[1], [0.2, 0.3])  # NaN row: returns = values, no value-loss signal
    with pytest.raises(ValueError, match="values"):
        gae(_inp([1.0], 1))
