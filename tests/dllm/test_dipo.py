"""DiPO: the per-step joint ratio by hand, and its on-policy gradient against exact enumeration."""

import itertools
import math

import pytest
import torch
from _tiny import all_sequences, context, enumerable_model

from rlvr.algos.dllm_objectives import block_product_ppo, dipo
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.likelihood import mean_field, trace


def test_dipo_takes_one_clipped_ratio_per_denoising_step_by_hand():
    # step 0 commits tokens 0 and 1 (d = 0.1 + 0.2: ratio e^0.3 = 1.34986 > 1.2, clipped to 1.2, its
    # loss -1.2 spread over 2 tokens); step 1 token 2 (e^-0.3 = 0.740818, A > 0: unclipped); step 2 token 3 (1)
    logp = torch.tensor([[0.1, 0.2, -0.3, 0.0]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)
    loss, metrics = dipo(logp, old, adv, mask, trace=torch.tensor([[0, 0, 1, 2]]), clip_low=0.2, clip_high=0.2)
    assert torch.allclose(loss, torch.tensor([[-0.6, -0.6, -0.740818, -1.0]]), atol=1e-6)
    assert torch.allclose(metrics["ratio"], torch.tensor([[1.349859, 1.349859, 0.740818, 1.0]]), atol=1e-6)
    loss.sum().backward()
    # clipped step: no gradient; unclipped steps: -A * ratio (d/dlogp of -A e^d)
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, -0.740818, -1.0]]), atol=1e-6)


def test_dipo_with_steps_equal_to_blocks_is_the_block_product_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(3, 6, generator=g) * 0.3, torch.randn(3, 6, generator=g) * 0.3
    adv = torch.randn(3, 1, generator=g).expand(3, 6)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 5 + [0.0]])
    blocks = (torch.arange(6) // 2).expand(3, 6)
    by_step, _ = dipo(logp, old, adv, mask, trace=blocks, clip_low=0.2, clip_high=0.3)
    by_block, _ = block_product_ppo(logp, old, adv, mask, block_length=2, clip_low=0.2, clip_high=0.3)
    assert torch.allclose(by_step, by_block)
    assert bool((by_step[mask == 0] == 0).all())


def _trajectories(length: int = 3):
    """Every (order, sequence) of the random-order one-token-per-step sampler: (rows, trace)."""
    seqs = all_sequences(length)
    orders = list(itertools.permutations(range(length)))
    rows = seqs.repeat_interleave(len(orders), 0)
    steps = torch.tensor([[order.index(k) for k in range(length)] for order in orders])  # step of position k
    return rows, steps.repeat(len(seqs), 1), len(orders)


def _reward(rows: torch.Tensor) -> torch.Tensor:
    return (rows[:, 0] == 1).float() + 0.5 * (rows[:, 2] == 3).float()


def _flat_grad(value, model):
    grads = torch.autograd.grad(value, list(model.parameters()), allow_unused=True, retain_graph=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, model.parameters())])


def test_dipo_on_policy_gradient_is_the_exact_policy_gradient_and_mean_field_is_not():
    # J(θ) = E_τ[R(y(τ))] over the sampler's trajectories τ = (order σ uniform, tokens drawn per step);
    # π_θ(τ) = (1/L!) Π_k p_θ(y_σk | x before step k). Summing DiPO's on-policy loss over all 384
    # trajectories with weights π(τ) (advantage A = R) gives exactly −∇J; d1's mean-field score does not.
    model = enumerable_model()
    rows, steps, n_orders = _trajectories()
    values, _ = trace(context(model, rows), trace=steps)  # (384, 3) log p(y_k | state before its step)
    log_tau = values.sum(-1) - math.log(n_orders)
    rewards = _reward(rows)
    exact = _flat_grad((log_tau.exp() * rewards).sum(), model)  # ∇J by autograd through every trajectory
    mask = torch.ones_like(values)
    loss, _ = dipo(values, values.detach(), rewards[:, None].expand_as(values), mask, trace=steps)
    surrogate = (log_tau.exp().detach() * loss.sum(-1)).sum()
    dipo_grad = -_flat_grad(surrogate, model)
    assert torch.allclose(dipo_grad, exact, rtol=1e-4, atol=1e-6)
    assert exact.norm() > 1e-2  # not trivially zero
    # d1: log p(y_k | completion all masked) per token, the same trajectory weights and advantages
    mf, _ = mean_field(context(model, rows), p_mask_prompt=0.0)
    mf_grad = _flat_grad((log_tau.exp().detach() * rewards * mf.sum(-1)).sum(), model)
    assert float((mf_grad - exact).norm() / exact.norm()) > 0.05  # biased (0.087 here): another distribution's score


def test_config_requires_the_trace_estimator_at_the_samplers_own_steps():
    with pytest.raises(ConfigError, match="estimator.name=trace"):
        load_config("recipes/dllm_dipo_countdown.yaml", ["estimator.name=mean_field", "estimator.shrink=null"])
    with pytest.raises(ConfigError, match="estimator.shrink=1"):
        load_config("recipes/dllm_dipo_countdown.yaml", ["estimator.shrink=2"])
    assert load_config("recipes/dllm_dipo_countdown.yaml").algo.objective == "dipo"
