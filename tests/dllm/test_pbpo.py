"""PBPO: the prefix-block surrogate by direct forwards, and the block-product ratio by hand."""

import math

import torch
from _tiny import context, enumerable_model

from rlvr.algos.dllm_objectives import block_product_ppo
from rlvr.models.likelihood import mean_field
from rlvr.models.prefix_block import prefix_block

SEQS = torch.tensor([[0, 1, 2, 1], [1, 1, 3, 0], [2, 0, 1, 2]])


def test_prefix_block_values_are_one_forward_per_block_with_earlier_blocks_visible():
    model = enumerable_model()
    ctx = context(model, SEQS)
    with torch.no_grad():
        values, _ = prefix_block(ctx, block_length=2, p_mask_prompt=0.0)
        first, _ = ctx.denoise(torch.ones_like(ctx.valid))  # block 0: the whole completion masked
        second, _ = ctx.denoise(torch.tensor([[False, False, True, True]]).expand_as(ctx.valid))  # block 0 shown
        whole, _ = prefix_block(ctx, block_length=None, p_mask_prompt=0.0)
        d1, _ = mean_field(ctx, p_mask_prompt=0.0)
    assert torch.allclose(values[:, :2], first[:, :2]) and torch.allclose(values[:, 2:], second[:, 2:])
    assert not torch.allclose(values[:, 2:], first[:, 2:])  # seeing block 0 changes block 1's values
    assert torch.allclose(whole, d1)  # one block: d1's one-step mean-field estimator


def test_corrupted_views_mask_only_the_prompt_and_the_revealed_prefix():
    model = enumerable_model()
    ctx = context(model, SEQS, seed=3)
    with torch.no_grad():
        clean, _ = prefix_block(ctx, block_length=2, p_mask_prompt=0.0)
        corrupt, _ = prefix_block(ctx, block_length=2, p_mask_prompt=0.9)
        again, _ = prefix_block(context(model, SEQS, seed=3), block_length=2, p_mask_prompt=0.9)
    assert torch.equal(corrupt, again)  # the view is a function of (row, mask seed): old and current share it
    assert not torch.allclose(clean, corrupt)


def test_block_product_on_policy_gradient_is_token_locals():
    theta = torch.tensor([0.3, -0.2], requires_grad=True)
    feats = torch.tensor([[[1.0, 0.0], [0.5, 1.0], [0.0, 2.0], [1.0, 1.0]]])  # (B, T, dim)
    adv, mask = torch.tensor([[1.5] * 4]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    grads = []
    for use_blocks in (False, True):
        logp = (feats * theta).sum(-1)
        old = logp.detach()
        if use_blocks:
            loss, _ = block_product_ppo(logp, old, adv, mask, block_length=2)
        else:
            loss = torch.where(mask > 0, -adv * torch.exp(logp - old), torch.zeros_like(logp))
        grads.append(torch.autograd.grad(loss.sum(), theta)[0])
    assert torch.allclose(grads[0], grads[1])


def test_block_product_ratio_hand_vector():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -0.3]])
    old = torch.tensor([[-1.1, -2.1, -0.5, -0.2]])
    adv = torch.full((1, 4), 2.0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = block_product_ppo(logp, old, adv, mask, block_length=2, clip_low=0.2, clip_high=0.2)
    # block 0: d = 0.1 + 0.1 -> ratio e^0.2 = 1.2214, clipped at 1.2 for A > 0: block loss -2·1.2 = -2.4, spread
    # over its 2 tokens -> -1.2 each; block 1: only token 2 is valid, d = 0 -> ratio 1, loss -2; token 3 masked out
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.2, -2.0, 0.0]]), atol=1e-6)
    assert torch.allclose(metrics["ratio"], torch.tensor([[math.exp(0.2), math.exp(0.2), 1.0, 0.0]]), atol=1e-6)
