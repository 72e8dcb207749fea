"""Hand vectors for the policy objectives (anchors §2.3, §2.11)."""

import math

import pytest
import torch

from rlvr.algos.objectives import OBJECTIVES, get_objective, ppo_clip, reinforce

# (A, rho, loss, clip_low, clip_high, dual) with eps_lo 0.2, eps_hi 0.28, c = 3
PPO_TABLE = [
    (1.0, 1.5, -1.28, 0, 1, 0),  # clipped at 1 + 0.28
    (1.0, 0.5, -0.5, 0, 0, 0),  # pessimistic branch: unclipped
    (1.0, 1.1, -1.1, 0, 0, 0),  # inside the region
    (-1.0, 1.5, 1.5, 0, 0, 0),  # unclipped
    (-1.0, 0.5, 0.8, 1, 0, 0),  # clipped at 1 - 0.2
    (-1.0, 5.0, 3.0, 0, 0, 1),  # dual clip: min(5.0, 3 * 1)
    (-0.5, 1.25, 0.625, 0, 0, 0),
]


def _table_tensors():
    adv = torch.tensor([[row[0] for row in PPO_TABLE]])
    old = torch.zeros_like(adv)
    logp = torch.log(torch.tensor([[row[1] for row in PPO_TABLE]]))
    return logp, old, adv, torch.ones_like(adv)


def test_ppo_clip_table():
    logp, old, adv, mask = _table_tensors()
    loss, m = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(loss[0], torch.tensor([row[2] for row in PPO_TABLE]), atol=1e-6, rtol=0)
    torch.testing.assert_close(m["clip_frac_low"][0], torch.tensor([float(r[3]) for r in PPO_TABLE]))
    torch.testing.assert_close(m["clip_frac_high"][0], torch.tensor([float(r[4]) for r in PPO_TABLE]))
    torch.testing.assert_close(m["clip_frac_dual"][0], torch.tensor([float(r[5]) for r in PPO_TABLE]))
    torch.testing.assert_close(m["ratio"][0], torch.tensor([r[1] for r in PPO_TABLE]))


def test_ppo_clip_without_dual_clip():
    logp, old, adv, mask = _table_tensors()
    loss, m = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert math.isclose(loss[0, 5].item(), 5.0, rel_tol=1e-6)
    assert m["clip_frac_dual"].sum() == 0


def test_ppo_clip_gradients_zero_where_clipped():
    logp, old, adv, mask = _table_tensors()
    logp.requires_grad_(True)
    loss, _ = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss.sum().backward()
    rho = torch.tensor([r[1] for r in PPO_TABLE])
    a = torch.tensor([r[0] for r in PPO_TABLE])
    # d(-A rho)/d logp = -A rho where unclipped; 0 for clipped rows 0, 4, 5
    expect = -a * rho
    expect[[0, 4, 5]] = 0.0
    torch.testing.assert_close(logp.grad[0], expect)


def test_ppo_clip_padding_is_zero_even_with_junk():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan")]])
    adv = torch.ones(1, 2)
    mask = torch.tensor([[1.0, 0.0]])
    loss, m = ppo_clip(logp, old, adv, mask)
    assert loss[0, 1] == 0 and torch.isfinite(loss).all()
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v).all() for v in m.values())


def test_ppo_clip_rejects_bad_dual_clip():
    logp, old, adv, mask = _table_tensors()
    with pytest.raises(ValueError):
        ppo_clip(logp, old, adv, mask, dual_clip=1.0)


def test_ppo_clip_at_ratio_one_has_reinforce_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    mask = (torch.rand(3, 5) > 0.3).float()
    (ppo_clip(logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0].sum()).backward()
    g_ppo = logp.grad.clone()
    logp.grad = None
    reinforce(logp, logp.detach(), adv, mask)[0].sum().backward()
    torch.testing.assert_close(g_ppo, logp.grad)


def test_reinforce_value():
    logp = torch.tensor([[-1.0, -2.0]])
    loss, _ = reinforce(logp, logp, torch.tensor([[2.0, -1.0]]), torch.tensor([[1.0, 1.0]]))
    torch.testing.assert_close(loss, torch.tensor([[2.0, -2.0]]))  # -A * logp


def test_get_objective():
    assert get_objective("ppo_clip") is ppo_clip
    assert set(OBJECTIVES) >= {"ppo_clip", "reinforce"}
    with pytest.raises(ValueError, match=r"unknown objective 'x'; valid: .*ppo_clip"):
        get_objective("x")
