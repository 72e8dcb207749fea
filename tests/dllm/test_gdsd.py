"""GDSD: the advantage-tilted self-teacher and the squared log-ratio loss by hand, its gradient (the
clip's dead zone, the on-policy policy gradient, a finite-difference check), and the recipe's loss."""

import math

import pytest
import torch
from _tiny import PROMPT, enumerable_model

from rlvr.algos.dllm_objectives import gdsd, gdsd_teacher
from rlvr.algos.objectives import get_objective
from rlvr.batch import TrainBatch
from rlvr.builder.build import build_loss, build_policy
from rlvr.config import load_config
from rlvr.trainer.step import micro_batch_loss

RECIPE = "recipes/dllm_gdsd_countdown.yaml"
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.1, -1.5], [-0.5, -2.0]], dtype=torch.float64)
ADV = torch.tensor([[2.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)


def test_teacher_is_the_old_policy_tilted_by_the_advantage():
    teacher = gdsd_teacher(OLD, ADV, gdsd_psi=0.5)
    assert torch.allclose(teacher, torch.tensor([[-0.1, -0.5], [-1.0, -2.5]], dtype=torch.float64))
    assert not teacher.requires_grad


def test_gdsd_loss_hand_vector():
    loss, metrics = gdsd(LOGP, OLD, ADV, MASK, gdsd_psi=0.5, clip_low=0.2, clip_high=0.2)
    # log-ratios (0.1, -0.5 | 0, -1); the clip [log 0.8, log 1.2] = [-0.22314, 0.18232] holds the second
    # at -0.22314; residuals against psi A = (1, 1 | -0.5, -0.5): (-0.9, -1.22314 | 0.5, masked)
    floor = math.log(0.8)
    expected = torch.tensor([[0.81, (floor - 1) ** 2], [0.25, 0.0]], dtype=torch.float64)
    assert torch.allclose(loss, expected, atol=1e-12)
    assert torch.allclose(metrics["gdsd_teacher_gap"], torch.tensor([[-0.9, floor - 1], [0.5, 0.0]],
                                                                    dtype=torch.float64))
    assert metrics["clip_frac_low"].tolist() == [[0.0, 1.0], [0.0, 0.0]]  # the masked -1 is not counted
    assert metrics["clip_frac_high"].sum() == 0
    assert get_objective("gdsd") is gdsd


def test_gradient_is_twice_the_residual_inside_the_clip_and_zero_outside():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = gdsd(logp, OLD, ADV, MASK, gdsd_psi=0.5)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(grad, torch.tensor([[-1.8, 0.0], [1.0, 0.0]], dtype=torch.float64))
    # on-policy (old = sg(logp)): -2 psi A, a policy gradient of scale 2 psi
    loss, _ = gdsd(logp, logp.detach(), ADV, MASK, gdsd_psi=0.5)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(grad, -2 * 0.5 * ADV * MASK)
    inside = torch.tensor([[-1.05, -1.45], [-0.45, -2.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: gdsd(x, OLD, ADV, MASK, gdsd_psi=0.5)[0], (inside,))


def test_recipe_loss_is_the_hand_formula_on_the_policys_elbo():
    config = load_config(RECIPE, ["algo.gdsd_psi=0.5", "algo.kl_coef=0"])
    policy = build_policy(config, enumerable_model())
    spec = build_loss(config)
    ys = torch.tensor([[0, 1, 2], [1, 1, 3]])
    mask = torch.ones_like(ys, dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0])[:, None] * mask
    prompt = PROMPT.expand(2, -1)
    batch = TrainBatch(prompt, torch.ones_like(prompt), ys, mask, advantages=adv)
    loss, _ = micro_batch_loss(policy, batch, spec, num_tokens=6.0, num_seqs=2.0)
    # on-policy every log-ratio is 0: each token's loss is (psi A)^2 = 0.25, whose row mean is 0.25
    assert float(loss.detach()) == pytest.approx(0.25)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
