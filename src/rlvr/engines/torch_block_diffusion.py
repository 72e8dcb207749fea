"""Block-diffusion sampler with a KV cache over finished blocks (SDAR / Fast-dLLM v2 / BD3-LM).

For a `BlockDiffusionLM`: the prompt is run once and its keys and values cached; each block of
`model.config.block_size` window tokens is denoised by forwards of that block only, reading the
cache; when the block is done, one forward of its committed tokens appends its keys and values
(none after the last block). The commit rule of every step is `generate_diffusion`'s (Gumbel-max
candidates at `temperature`, `remasking` scores, LLaDA's per-block schedule or a `threshold`,
`suppress_eos`, the same hashed per-row noise), so a completion depends on its row's seed only.

`use_cache=False` runs each step as one forward of [prompt; finished blocks; current block]
under the block-causal mask instead: the same logits up to float rounding, hence the same
tokens (tests/dllm/test_block_diffusion.py); it exists to measure what the cache saves.
`Rollouts.forwards` counts model calls: cached, the denoising steps plus the prompt's and each
finished block's append (none after the last block), each over one block's columns; uncached, the
steps, each over the whole prefix (bench/dllm_block.py measures both).

Deviations: no sub-block cache and no greedy decoding of a block's first token (Fast-dLLM v2),
block boundaries aligned to the window (see `rlvr.models.block_diffusion`).
"""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts
from rlvr.engines.torch_diffusion import (
    block_schedule,
    check_schedule,
    commit_step,
    eoser_scale,
    window_rollouts,
    window_state,
)


def _block_logits(model, x, attention, positions, lo, hi, tp, cache, carry):
    """Logits (B, b, V) of columns lo:hi given everything before them: from the cache, or one
    block-causal forward of x[:, :hi]. `carry` (B, V): the raw logit before lo (shift_logits)."""
    if cache is None:
        return model(x[:, :hi], attention[:, :hi], positions[:, :hi], prefix_len=tp)[:, lo:hi]
    raw, _ = model.forward_cached(x[:, lo:hi], positions[:, lo:hi], cache, attention[:, :hi])
    if model.config.shift_logits:  # position i predicts token i+1: the first column reads the carried one
        raw = torch.cat([carry[:, None], raw[:, :-1]], dim=1)
    return raw


def _append(model, x, positions, lo, hi, cache, attention):
    """Run columns lo:hi (finished) against the cache; return (cache with their k/v, their last raw logit)."""
    raw, fresh = model.forward_cached(x[:, lo:hi], positions[:, lo:hi], cache, attention[:, :hi])
    if cache is None:
        return fresh, raw[:, -1]
    return [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(cache, fresh)], raw[:, -1]


@torch.no_grad()
def generate_block_diffusion(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                             gen_length: int, steps: int, temperature: float | torch.Tensor = 1.0,
                             remasking: str = "low_confidence", threshold: float | None = None,
                             suppress_eos: bool = False, mask_id: int, eos_id: int, window: str = "eos",
                             use_cache: bool = True, block_length: int | None = None,
                             step_schedule: str = "even", eoser_gamma: float | None = None) -> Rollouts:
    """Sample one window per row, block by block (see the module doc). prompt_ids/prompt_mask (B, Tp)
    left-padded, seeds (B,). `block_length` must be None or the model's block size."""
    block = model.config.block_size
    if block_length not in (None, block):
        raise ValueError(f"block_length={block_length}: a block model samples blocks of its own size {block}")
    num_blocks = check_schedule(gen_length, block, steps, threshold, remasking, what="the model's block_size",
                                step_schedule=step_schedule, eoser_gamma=eoser_gamma)
    was_training = model.training
    model.eval()
    tp = prompt_ids.shape[1]
    x, attention, positions, trace, logprobs, row_steps = window_state(prompt_ids, prompt_mask, gen_length, mask_id)
    per_block = steps // num_blocks
    schedule = block_schedule(step_schedule, block, per_block) if threshold is None else None
    cache, carry, forwards = None, None, 0
    if use_cache:  # the prompt sees itself only: its keys and values are final
        cache, carry = _append(model, x, positions, 0, tp, None, attention)
        forwards += 1
    for b in range(num_blocks):
        lo, hi = tp + b * block, tp + (b + 1) * block
        s = 0
        while bool((x[:, lo:hi] == mask_id).any()):
            logits = _block_logits(model, x, attention, positions, lo, hi, tp, cache, carry).double()
            forwards += 1
            quota = schedule[min(s, len(schedule) - 1)] if schedule is not None else None
            ids, commit, logp, remaining = commit_step(
                logits, x[:, lo:hi], seeds, row_steps, temperature=temperature, remasking=remasking,
                threshold=threshold, quota=quota, suppress_eos=suppress_eos, mask_id=mask_id, eos_id=eos_id,
                eos_scale=eoser_scale(eoser_gamma, s, per_block, step_schedule))
            x[:, lo:hi] = ids
            trace[:, lo - tp:hi - tp] = torch.where(commit, row_steps[:, None], trace[:, lo - tp:hi - tp])
            logprobs[:, lo - tp:hi - tp] = torch.where(commit, logp.float(), logprobs[:, lo - tp:hi - tp])
            row_steps += (remaining > 0).long()
            s += 1
        if use_cache and b + 1 < num_blocks:
            cache, carry = _append(model, x, positions, lo, hi, cache, attention)
            forwards += 1
    model.train(was_training)
    return window_rollouts(prompt_ids, prompt_mask, x[:, tp:], logprobs, trace, forwards, eos_id=eos_id, window=window)


__all__ = ["generate_block_diffusion"]
