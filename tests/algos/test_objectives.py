"""Hand vectors for the policy objectives."""

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


# --- gspo, cispo, sapo ---------------------------------------------------------------------------

from rlvr.algos.aggregate import seq_mean_token_mean  # noqa: E402
from rlvr.algos.objectives import cispo, gspo, sapo, sapo_gate  # noqa: E402


def test_gspo_sequence_ratio_vector():
    # log-ratios [.1, -.1, .3] -> mean .1 -> s = e^.1 = 1.105171 on every token
    logp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.4, -2.3]])
    mask, adv = torch.ones(1, 3), torch.ones(1, 3)
    loss, m = gspo(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(m["ratio"], torch.full((1, 3), 1.105171))
    torch.testing.assert_close(loss, torch.full((1, 3), -1.105171))
    seq_mean_token_mean(loss, mask, num_seqs=1.0).backward()
    # -A s (1/L) per token = -1.105171 / 3
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -0.368390))


def test_gspo_paper_clip_cuts_the_gradient():
    logp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    loss, m = gspo(logp, torch.tensor([[-1.1, -0.4, -2.3]]), torch.ones(1, 3), torch.ones(1, 3))
    torch.testing.assert_close(loss, torch.full((1, 3), -1.0004))  # clipped at 1 + 4e-4
    assert m["clip_frac_high"].sum() == 3
    loss.sum().backward()
    assert torch.all(logp.grad == 0)


def test_gspo_equals_ppo_clip_on_single_token_completions():
    torch.manual_seed(1)
    B, T = 6, 4
    mask = torch.zeros(B, T)
    mask[:, 0] = 1  # single-token completions, padded
    logp = (torch.randn(B, T) * 0.3 - 1).requires_grad_(True)
    old = logp.detach() + torch.randn(B, T) * 0.3
    adv = torch.randn(B, 1).expand(B, T) * mask
    hp = dict(clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0)
    l_g, _ = gspo(logp, old, adv, mask, **hp)
    (g_g,) = torch.autograd.grad(l_g.sum(), logp)
    l_p, _ = ppo_clip(logp, old, adv, mask, **hp)
    (g_p,) = torch.autograd.grad(l_p.sum(), logp)
    torch.testing.assert_close(l_g, l_p)
    torch.testing.assert_close(g_g, g_p)


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    rho = torch.tensor([[0.5, 1.0, 1.5, 6.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = logp.detach() - rho.log()
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    loss, m = cispo(logp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.28)
    w = torch.tensor([[0.8, 1.0, 1.28, 1.28]])  # clip(rho, 0.8, 1.28)
    torch.testing.assert_close(loss, -w * adv * logp.detach())
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -w * adv)  # nonzero even where clipped
    torch.testing.assert_close(m["clip_frac_low"], torch.tensor([[1.0, 0, 0, 0]]))
    torch.testing.assert_close(m["clip_frac_high"], torch.tensor([[0.0, 0, 1, 1]]))


def test_sapo_gate_vectors_and_gradient_at_one():
    rho = torch.tensor([0.5, 1.0, 1.5])
    torch.testing.assert_close(sapo_gate(rho, 1.0), torch.tensor([1.510163, 2.0, 2.489837]))
    torch.testing.assert_close(sapo_gate(rho, 1.05), torch.tensor([1.415938, 1.904762, 2.393585]))
    # A = +1 uses tau_pos = 1: loss -f; A = -1 uses tau_neg = 1.05: loss +f
    logp = rho.log().repeat(2, 1).requires_grad_(True)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    loss, _ = sapo(logp, torch.zeros(2, 3), adv, torch.ones(2, 3), tau_pos=1.0, tau_neg=1.05)
    torch.testing.assert_close(loss[0], -torch.tensor([1.510163, 2.0, 2.489837]))
    torch.testing.assert_close(loss[1], torch.tensor([1.415938, 1.904762, 2.393585]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad[:, 1], torch.tensor([-1.0, 1.0]))  # f'(1) * rho = 1 -> -A


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo", "sapo", "reinforce"])
def test_every_objective_padding_safe_and_reports_ratio(name):
    logp = torch.tensor([[-1.0, float("-inf")], [-0.5, -0.7]], requires_grad=True)
    old = torch.tensor([[-1.2, float("nan")], [-0.5, -0.9]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, m = OBJECTIVES[name](logp, old, torch.tensor([[1.0, 5.0], [-1.0, -1.0]]), mask)
    assert loss[0, 1] == 0 and torch.isfinite(loss).all()
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert "ratio" in m and all(torch.isfinite(v).all() and not v.requires_grad for v in m.values())


def test_every_objective_has_the_reinforce_gradient_on_policy():
    torch.manual_seed(2)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 1).expand(3, 5).contiguous()
    mask = (torch.rand(3, 5) > 0.3).float()
    (g_ref,) = torch.autograd.grad(reinforce(logp, logp.detach(), adv, mask)[0].sum(), logp)
    for name in ("ppo_clip", "cispo", "sapo"):
        (g,) = torch.autograd.grad(OBJECTIVES[name](logp, logp.detach(), adv, mask)[0].sum(), logp)
        torch.testing.assert_close(g, g_ref, msg=name)
