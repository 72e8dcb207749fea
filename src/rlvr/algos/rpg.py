"""RPG's KL-regularised surrogates: off-policy-correct KL terms for samples of the old policy.

Paper: "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning"
(regularized policy gradient, RPG; Zhang et al. 2025; literature/000_*.txt line 155). RPG
derives, for samples y ~ π_old, fully differentiable surrogates whose gradient is that of a KL
divergence of the current policy π_θ, for the forward and the reverse KL and their unnormalised
(mass-aware) forms. With w = π_θ/π_old (differentiable), r = π_ref/π_θ and the per-token
log-ratio δ = logp − ref_logp:
- `rpg_rkl`: w δ. Unbiased for KL(π_θ || π_ref) on samples of π_old; gradient
  E_old[w (δ + 1) ∇logp] = E_θ[δ ∇logp], the reverse-KL gradient (E_θ[∇logp] = 0).
- `rpg_urkl`: w δ − w + π_ref/π_old, the unnormalised reverse KL
  Σ π_θ log(π_θ/π_ref) − π_θ + π_ref; on-policy its value is k3 (= r − 1 − log r).
- `rpg_fkl`: (π_ref/π_old)(−δ). Unbiased for KL(π_ref || π_θ); gradient −(π_ref/π_old) ∇logp,
  whose expectation −E_ref[∇logp] is the forward-KL gradient.
- `rpg_ufkl`: (π_ref/π_old)(−δ) + w − π_ref/π_old, the unnormalised forward KL
  Σ π_ref log(π_ref/π_θ) + π_θ − π_ref; on-policy its value is r log r − r + 1.
They plug into the `algo.kl_estimator` seam, `fn(logp, ref_logp, *, old_logp) -> (B, T)`, and
`algo.kl_coef` is RPG's β; the reward term is the chosen objective (RPG's own is the
importance-weighted −w A with PPO-style clipping: `ppo_clip`).

Hyperparameters: none (β is `algo.kl_coef`).

Deliberate deviations:
1. Token-level: every surrogate is applied per token with per-token ratios (the paper derives
   them for whole sequences and implements them per token, as here).
2. Only the fully differentiable surrogates; the paper's REINFORCE-style estimators (the KL
   folded into a stop-gradient reward) are `algo.kl_placement=reward` with an existing estimator.
3. Exponents are clamped to [−20, 20] (overflow guard), as in `rlvr.algos.kl`.
4. `old_logp=None` means on-policy: old = sg[logp], so w is 1 in value with gradient ∇logp.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_EXP_CLAMP = 20.0


def _pieces(logp: Tensor, ref_logp: Tensor, old_logp: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(delta = logp − ref, w = π_θ/π_old differentiable, π_ref/π_old detached)."""
    old = logp.detach() if old_logp is None else old_logp.detach()
    ref = ref_logp.detach()
    w = torch.exp((logp - old).clamp(-_EXP_CLAMP, _EXP_CLAMP))
    ref_over_old = torch.exp((ref - old).clamp(-_EXP_CLAMP, _EXP_CLAMP))
    return logp - ref, w, ref_over_old


def rpg_rkl(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """w · (logp − ref_logp): reverse KL(π_θ || π_ref) from samples of π_old. Shape (B, T)."""
    delta, w, _ = _pieces(logp, ref_logp, old_logp)
    return w * delta


def rpg_urkl(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """w · (logp − ref_logp) − w + π_ref/π_old: unnormalised reverse KL. Shape (B, T)."""
    delta, w, ref_over_old = _pieces(logp, ref_logp, old_logp)
    return w * delta - w + ref_over_old


def rpg_fkl(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """(π_ref/π_old) · (ref_logp − logp): forward KL(π_ref || π_θ) from samples of π_old. Shape (B, T)."""
    delta, _, ref_over_old = _pieces(logp, ref_logp, old_logp)
    return -ref_over_old * delta


def rpg_ufkl(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """(π_ref/π_old) · (ref_logp − logp) + w − π_ref/π_old: unnormalised forward KL. Shape (B, T)."""
    delta, w, ref_over_old = _pieces(logp, ref_logp, old_logp)
    return -ref_over_old * delta + w - ref_over_old


RPG_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "rpg_rkl": rpg_rkl,
    "rpg_urkl": rpg_urkl,
    "rpg_fkl": rpg_fkl,
    "rpg_ufkl": rpg_ufkl,
}
"""Merged into `rlvr.algos.kl.KL_ESTIMATORS`."""
