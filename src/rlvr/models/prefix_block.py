"""PBPO's prefix-block token surrogate for masked-diffusion LMs.

Paper: "Prefix-Block Policy Optimization" (PBPO; abstract in the project's literature notes). A
semi-autoregressive sampler decodes block by block, so a completed block's likelihood is the
natural action probability, but it marginalises over the reveal orders inside the block. PBPO's
surrogate: the PREFIX-BLOCK state of block b is the prompt and the revealed blocks < b visible,
block b and every later block masked; one forward gives each token of block b a one-step
log-probability log p(y_k | prefix-block state). The block's surrogate ratio would be the
product of its tokens' ratios; PBPO instead weights and clips each token by its own ratio
(token-local), which with the trainer's `ppo_clip` is what these token values give. Corrupted
views: prompt and revealed-prefix tokens are masked w.p. `p_mask_prompt` (the pre-training
corruption), drawn from the row's key, so current, old and reference share the view.

`block_product_ppo` (`rlvr.algos.dllm_objectives`) is the block-product weighting the paper
argues against, for the variance comparison (bench/dllm_pbpo.py).

Deliberate deviations:
1. The corrupted view is drawn once per step (from the step's mask seed), shared by the
   step's repeated updates; the paper resamples it at every update.
2. Each block's forward keeps its graph (memory linear in the number of blocks, 2 in the
   recipes); positions past the row's window are masked as in every estimator here.
"""

from __future__ import annotations

import torch


def prefix_block(ctx, *, block_length: int | None = None, p_mask_prompt: float = 0.15, with_entropy: bool = False):
    """Token values (B, Tc): log p(y_k | prompt, blocks before k's visible, k's block and later masked).
    `ctx` is a `likelihood.Corruptor`; `block_length` None = the whole window as one block."""
    width = ctx.valid.shape[1]
    block = block_length or width
    pos = torch.arange(width, device=ctx.valid.device)[None, :]
    values = ctx.zeros()
    entropy = ctx.zeros() if with_entropy else None
    for b, lo in enumerate(range(0, width, block)):
        corrupt = ctx.uniform(41 + 2 * b, width).lt(p_mask_prompt) & (pos < lo) if p_mask_prompt > 0 else pos < 0
        width_p = ctx.prompt_ids.shape[1]
        prompt_masked = ctx.uniform(42 + 2 * b, width_p).lt(p_mask_prompt) if p_mask_prompt > 0 else None
        ell, h = ctx.denoise((pos >= lo).expand_as(ctx.valid) | corrupt, prompt_masked, with_entropy)
        target = (pos >= lo) & (pos < lo + block)
        values = torch.where(target, ell, values)
        if with_entropy:
            entropy = torch.where(target, h, entropy)
    return values, entropy


__all__ = ["prefix_block"]
