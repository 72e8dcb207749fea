"""Policy objectives: per-token policy loss (B, T), before aggregation.

Papers (abstracts in /work/shared/literature/, see docs/papers.md):
- `ppo_clip`: PPO (Schulman et al. 2017); asymmetric "clip-higher" from DAPO (Yu et al. 2025);
  dual-clip from "Mastering Complex Control in MOBA Games with Deep RL" (Ye et al. 2020).
- `reinforce`: REINFORCE (Williams 1992), the plain policy-gradient surrogate -A * logp.

Signature of every objective:
    fn(logp, old_logp, advantages, mask, **hparams) -> (loss (B, T), metrics dict[str, (B, T)])
`logp` (B, T) carries the gradient; `old_logp` (B, T) is the policy the ratio is taken against
(detached here whatever the caller passes); `advantages` (B, T) are detached too; `mask` (B, T)
is float 0/1. The loss is zero outside the mask. Metric tensors are detached per-token floats;
the caller takes their masked mean with the same mask.

Hyperparameters (one flat namespace, same meaning wherever used):
- `clip_low`, `clip_high` (float): half-widths of the ratio clip, [1 - clip_low, 1 + clip_high].
- `dual_clip` (float | None): c > 1 caps a negative-advantage token's loss at c * |A|.
- `log_ratio_clamp` (float): |logp - old_logp| is clamped to this before exp (overflow guard).

Deliberate deviations:
1. Dual-clip is off unless `dual_clip` is given (verl always applies it with c = 3).
2. Padding positions are set to exactly 0 with `torch.where`, so junk log-probs there (inf, NaN)
   cannot leak into the sum through 0 * inf.
3. Metrics are per-token indicators; "clip_frac_low" counts tokens whose gradient the lower clip
   removes (A < 0 and rho < 1 - clip_low), "clip_frac_high" the upper (A > 0 and
   rho > 1 + clip_high), "clip_frac_dual" those where the dual clip binds (A < 0, rho > c).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algos._registry import lookup

__all__ = ["OBJECTIVES", "get_objective", "ppo_clip", "reinforce"]

Metrics = dict[str, Tensor]


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _ratio(logp: Tensor, old_logp: Tensor, log_ratio_clamp: float) -> Tensor:
    """rho = exp(clamp(logp - old_logp)), differentiable in logp."""
    log_ratio = (logp - old_logp.detach()).clamp(-log_ratio_clamp, log_ratio_clamp)
    return torch.exp(log_ratio)


def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Metrics]:
    """PPO-clip: max(-A*rho, -A*clip(rho, 1-clip_low, 1+clip_high)), with optional dual clip
    min(., -c*A) for A < 0. Shapes (B, T)."""
    adv = advantages.detach()
    ratio = _ratio(logp, old_logp, log_ratio_clamp)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    r = ratio.detach()
    dual_active = torch.zeros_like(r, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss_dual = -adv * dual_clip
        dual_active = (adv < 0) & (loss_dual < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, loss_dual), loss)
    low = (adv < 0) & (r < 1.0 - clip_low)
    high = (adv > 0) & (r > 1.0 + clip_high)
    metrics = {
        "ratio": _masked(r, mask),
        "clip_frac_low": _masked(low.float(), mask),
        "clip_frac_high": _masked(high.float(), mask),
        "clip_frac_dual": _masked(dual_active.float(), mask),
    }
    return _masked(loss, mask), metrics


def reinforce(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Metrics]:
    """REINFORCE surrogate -A * logp: gradient -A * grad(logp), no ratio, no clipping.

    `old_logp` is unused (kept for the common signature); the ratio is still reported so the
    caller's metric code does not branch.
    """
    adv = advantages.detach()
    ratio = torch.exp((logp - old_logp).detach().clamp(-20.0, 20.0))
    return _masked(-adv * logp, mask), {"ratio": _masked(ratio, mask)}


OBJECTIVES: dict[str, Callable[..., tuple[Tensor, Metrics]]] = {
    "ppo_clip": ppo_clip,
    "reinforce": reinforce,
}


def get_objective(name: str) -> Callable[..., tuple[Tensor, Metrics]]:
    """The policy objective registered as `name`; ValueError listing valid names otherwise."""
    return lookup(OBJECTIVES, "objective", name)
