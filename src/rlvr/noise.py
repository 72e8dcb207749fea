"""Counter-based random numbers: the noise of row i at step t depends only on (seed_i, t).

A batch-wide `torch.Generator` would make a completion depend on which other prompts share its
batch. Hashing (seed, step, vocab index) instead gives each sample its own reproducible stream,
vectorised over the batch with integer ops (no per-row Python loop).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash (Wellons), computed in int64 and kept to 32 bits."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def _column_keys(width: int, device: torch.device) -> torch.Tensor:
    return mix32(torch.arange(width, dtype=torch.int64, device=device) * 0x632BE5AB + 0x85EBCA6B)


def uniform_noise_block(seeds: torch.Tensor, first_step: int, steps: int, width: int) -> torch.Tensor:
    """(B, steps, width) float64 uniforms for decoding steps first_step .. first_step+steps-1.

    Entry [:, j] equals `uniform_noise(seeds, first_step + j, width)` bit for bit; computing a
    block at once costs the same integer work with a fraction of the per-op overhead.
    """
    arange = torch.arange(first_step, first_step + steps, dtype=torch.int64, device=seeds.device)
    step_keys = mix32(arange + 0x9E3779B9)  # (S,)
    base = mix32(mix32(seeds.to(torch.int64))[:, None] ^ step_keys[None, :])                      # (B, S)
    bits = mix32(base[:, :, None] ^ _column_keys(width, seeds.device)[None, None, :])
    return (bits.to(torch.float64) + 0.5) / 2.0**32


def uniform_noise(seeds: torch.Tensor, step: int, width: int) -> torch.Tensor:
    """(B, width) float64 uniforms in (0, 1) from per-row int seeds (B,) at decoding `step`."""
    return uniform_noise_block(seeds, step, 1, width)[:, 0]


def gumbel_noise_block(seeds: torch.Tensor, first_step: int, steps: int, width: int) -> torch.Tensor:
    """(B, steps, width) float64 standard Gumbel noise (see `uniform_noise_block`)."""
    return -torch.log(-torch.log(uniform_noise_block(seeds, first_step, steps, width)))


def gumbel_noise(seeds: torch.Tensor, step: int, width: int) -> torch.Tensor:
    """(B, width) float64 standard Gumbel noise; argmax(logits + g) samples softmax(logits)."""
    return gumbel_noise_block(seeds, step, 1, width)[:, 0]
