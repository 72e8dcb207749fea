"""Hand vectors and edge cases for the advantage estimators."""

import math

import pytest
import torch

from rlvr.algos.advantages import ADVANTAGES, AdvantageInputs, dr_grpo, get_advantage, grpo, rloo


def _inp(rewards, group_size, T=3, mask=None):
    r = torch.tensor(rewards, dtype=torch.float32)
    m = torch.ones(len(rewards), T) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return AdvantageInputs(rewards=r, group_size=group_size, response_mask=m)


def test_grpo_binary_vector():
    # mean 0.5, Bessel std sqrt(6*0.25/5) = 0.5477226; 0.5 / (0.5477226 + 1e-6) = 0.912869
    adv, metrics = grpo(_inp([1, 0, 0, 1, 1, 0], 6))
    expect = torch.tensor([1, -1, -1, 1, 1, -1]) * 0.912869
    torch.testing.assert_close(adv[:, 0], expect, atol=1e-6, rtol=0)
    assert torch.equal(adv[:, 0:1].expand(-1, 3), adv)  # broadcast over tokens
    assert metrics["scorable_frac"] == 1.0 and metrics["zero_std_group_frac"] == 0.0


def test_grpo_biased_std_would_give_one():
    # the bug signature: biased std 0.5 gives exactly ±1; ours must not
    adv, _ = grpo(_inp([1, 0, 0, 1, 1, 0], 6))
    assert abs(adv[0, 0].item() - 1.0) > 0.05


def test_grpo_graded_vector():
    # mean 0.4375, std_u 0.4269563: (0.5-0.4375)/0.4269573 = 0.146385 ...
    adv, _ = grpo(_inp([0.5, 1.0, 0.0, 0.25], 4))
    expect = torch.tensor([0.146385, 1.317462, -1.024693, -0.439154])
    torch.testing.assert_close(adv[:, 0], expect, atol=1e-5, rtol=0)


def test_grpo_without_std_is_dr_grpo():
    a, _ = grpo(_inp([1, 0, 0, 1, 1, 0], 6), std_normalize=False)
    b, _ = dr_grpo(_inp([1, 0, 0, 1, 1, 0], 6))
    torch.testing.assert_close(a[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5, 0.5, -0.5]))
    torch.testing.assert_close(a, b)


def test_rloo_vectors():
    # binary: R_i - mean(others): 1 - 2/5 = 0.6, 0 - 3/5 = -0.6
    adv, _ = rloo(_inp([1, 0, 0, 1, 1, 0], 6))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.6, -0.6, -0.6, 0.6, 0.6, -0.6]))
    # graded: 0.5 - (1+0+0.25)/3 = 0.083333; 1 - 0.75/3 = 0.75; 0 - 1.75/3; 0.25 - 1.5/3
    adv, _ = rloo(_inp([0.5, 1.0, 0.0, 0.25], 4))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.083333, 0.75, -0.583333, -0.25]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_singleton_group_gives_reward(name):
    adv, _ = ADVANTAGES[name](_inp([0.3, 1.0, 0.0], 1))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.3, 1.0, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_all_equal_group_is_exactly_zero(name):
    # 0.1 * 3 / 3 != 0.1 in float; the estimator must still return exact zeros
    adv, metrics = ADVANTAGES[name](_inp([0.1, 0.1, 0.1, 1, 0, 1], 3))
    assert torch.all(adv[:3] == 0)
    assert torch.all(adv[3:, 0] != 0)
    assert metrics["zero_std_group_frac"] == 0.5


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_nan_rewards_are_excluded(name):
    nan = math.nan
    # group 1: NaN excluded -> same as [1, 0, 0]; group 2: one scorable -> all 0 (deviation 3)
    adv, metrics = ADVANTAGES[name](_inp([1, nan, 0, 0, nan, nan, 1, nan], 4))
    ref, _ = ADVANTAGES[name](_inp([1, 0, 0], 3))
    assert not torch.isnan(adv).any()
    torch.testing.assert_close(adv[[0, 2, 3], 0], ref[:, 0])
    assert adv[1].abs().sum() == 0
    assert adv[4:].abs().sum() == 0
    assert metrics["scorable_frac"] == 4 / 8


def test_nan_in_singleton_group_is_zero():
    adv, _ = grpo(_inp([math.nan, 2.0], 1))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.0, 2.0]))


def test_padding_and_single_token_rows():
    mask = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    adv, _ = grpo(_inp([1, 0, 1, 0], 4, mask=mask))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # mean 0.5, Bessel std sqrt(4*0.25/3)
    expect = torch.tensor(mask, dtype=torch.float32) * torch.tensor([a, -a, a, -a])[:, None]
    torch.testing.assert_close(adv, expect)


def test_rewards_shape_checked():
    with pytest.raises(ValueError):
        grpo(_inp([1, 0, 1], 2))


def test_get_advantage_unknown_lists_names():
    assert get_advantage("grpo") is grpo
    with pytest.raises(ValueError, match=r"unknown advantage 'nope'; valid: .*grpo"):
        get_advantage("nope")
