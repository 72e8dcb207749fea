"""Advantage statistics keep the input's precision: float64 in, float64 math out."""

import pytest
import torch

from rlvr.algos.advantages import ADVANTAGES, AdvantageInputs

GROUP_ESTIMATORS = ["grpo", "dr_grpo", "rloo", "lite_ppo", "opo", "reinforce_pp", "reinforce_pp_baseline"]


def _inputs(rewards, dtype=torch.float64):
    return AdvantageInputs(rewards=torch.tensor(rewards, dtype=dtype), group_size=2, response_mask=torch.ones(2, 3))


def test_grpo_resolves_a_spread_below_float32():
    # 1 + 1e-8 rounds to 1 in float32: a float32 pipeline calls this group zero-variance (A = 0)
    adv, metrics = ADVANTAGES["grpo"](_inputs([1.0, 1.0 + 1e-8]))
    d = torch.tensor([1.0, 1.0 + 1e-8], dtype=torch.float64)
    expected = (d - d.mean()) / (d.std() + 1e-6)  # float64 math: about -/+ 0.00496
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv[:, 0], expected, rtol=1e-12, atol=0)
    assert abs(adv[0, 0].item()) > 4e-3
    assert metrics["zero_std_group_frac"] == 0.0


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_every_group_estimator_keeps_float64(name):
    adv, _ = ADVANTAGES[name](_inputs([1.0, 1.0 + 1e-8]))
    assert adv.dtype == torch.float64
    assert adv[0, 0].item() < 0 < adv[1, 0].item()


def test_tiny_spread_matches_float64_reference_not_float32():
    rewards = [0.3, 0.3 + 3e-7]  # float32 resolves this only to within ~20%
    adv, _ = ADVANTAGES["dr_grpo"](_inputs(rewards))
    torch.testing.assert_close(adv[1, 0], torch.tensor(1.5e-7, dtype=torch.float64), rtol=1e-8, atol=0)


def test_float32_input_stays_float32_and_bfloat16_is_promoted():
    adv32, _ = ADVANTAGES["grpo"](_inputs([0.0, 1.0], torch.float32))
    adv16, _ = ADVANTAGES["grpo"](_inputs([0.0, 1.0], torch.bfloat16))
    assert adv32.dtype == torch.float32 and adv16.dtype == torch.float32
    torch.testing.assert_close(adv16, adv32)


def test_binary_estimators_keep_float64():
    adv, _ = ADVANTAGES["maxrl"](_inputs([0.0, 1.0]))
    assert adv.dtype == torch.float64
