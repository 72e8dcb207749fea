"""Critic loss for PPO with GAE: clipped value regression, per token (B, T).

Papers (see docs/papers.md): PPO (Schulman et al. 2017) and its value clipping as used by the
OpenAI baselines / verl / OpenRLHF critics.

`value_loss(values, old_values, returns, mask, *, value_clip)` returns the per-token loss
0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = old_V + clip(V - old_V, -value_clip,
value_clip), and per-token metrics, like an objective; aggregate it with the same aggregation
as the policy loss. Targets R come from `returns.gae_returns`.

Hyperparameters: `value_clip` (float | None): half-width of the clip around the old values;
None turns clipping off.

Deliberate deviations:
1. The factor 0.5 lives here (verl applies it after aggregation); the gradient is the same.
2. Padding is zeroed with `torch.where` so junk values there cannot leak into the sum.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["value_loss"]


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, value_clip: float | None = 0.5
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss, shapes (B, T); metrics "value_clip_frac" (the clipped branch binds)
    and "value_error" (V - R), both detached per-token."""
    keep = mask > 0
    values = torch.where(keep, values, torch.zeros_like(values))
    old = torch.where(keep, old_values.detach(), torch.zeros_like(old_values))
    target = torch.where(keep, returns.detach(), torch.zeros_like(returns))
    err = (values - target) ** 2
    clipped_frac = torch.zeros_like(err)
    if value_clip is not None:
        v_clip = old + (values - old).clamp(-value_clip, value_clip)
        err_clip = (v_clip - target) ** 2
        clipped_frac = (err_clip > err).to(err.dtype)
        err = torch.maximum(err, err_clip)
    loss = torch.where(keep, 0.5 * err, torch.zeros_like(err))
    zero = torch.zeros_like(err)
    metrics = {
        "value_clip_frac": torch.where(keep, clipped_frac, zero).detach(),
        "value_error": torch.where(keep, values - target, zero).detach(),
    }
    return loss, metrics
