"""DAPO's reward shaping and group filtering, as pure functions.

Paper: DAPO, "Decoupled Clip and Dynamic sAmpling Policy Optimization" (Yu et al. 2025;
literature/000_*.txt line 93). Its other two pieces live elsewhere: clip-higher is
`objectives.ppo_clip(clip_high=0.28)`, the token-level loss is `aggregate.token_mean`.

- `overlong_penalty(lengths, *, max_length, overlong_buffer, overlong_factor)`: the soft
  overlong punishment added to the reward, 0 up to max_length - overlong_buffer, then falling
  linearly to -overlong_factor at max_length.
- `zero_variance_groups(rewards, group_size)`: which groups a dynamic sampler should drop and
  refill (all scorable rewards equal, so group-relative advantages are 0).

Hyperparameters: `max_length` (the generation cap, tokens), `overlong_buffer` (L_cache),
`overlong_factor` (penalty at and beyond max_length).

Deliberate deviations:
1. Lengths beyond max_length get -overlong_factor (the penalty is clamped), like TRL; verl and
   OpenRLHF cannot see them because generation stops at max_length.
2. A singleton group (G = 1) is never flagged (verl keeps it: with G = 1 the advantage is R);
   a group with fewer than two scorable rewards (G > 1) is flagged.
3. Names are overlong_buffer / overlong_factor rather than buffer / factor so they stay
   unambiguous as `algo.*` config fields.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._advantage_core import group_stats

__all__ = ["overlong_penalty", "zero_variance_groups"]


def overlong_penalty(
    lengths: Tensor, *, max_length: int, overlong_buffer: int, overlong_factor: float = 1.0
) -> Tensor:
    """(B,) penalty: -clamp(L - (max_length - overlong_buffer), 0, overlong_buffer) /
    overlong_buffer * overlong_factor, for completion lengths L (B,)."""
    if not 0 < overlong_buffer <= max_length:
        raise ValueError(f"need 0 < overlong_buffer <= max_length, got {overlong_buffer}, {max_length}")
    excess = lengths.to(torch.float32) - (max_length - overlong_buffer)
    return -excess.clamp(0, overlong_buffer) / overlong_buffer * overlong_factor


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """(P,) bool, True where the group's scorable rewards are all equal (or fewer than two of
    them with G > 1). NaN = not scorable. Expand to rows with `.repeat_interleave(G)`."""
    st = group_stats(rewards, group_size)
    if group_size == 1:
        return torch.zeros(st.count.shape[0], dtype=torch.bool, device=rewards.device)
    return st.constant[:, 0]
