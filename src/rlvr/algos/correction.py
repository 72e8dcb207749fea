"""Rollout/trainer mismatch: importance weights between the sampler's and the trainer's
log-probs, and the size of the gap.

Papers (see docs/papers.md): truncated importance sampling (TIS, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training", Yao et al. 2025) and masked importance sampling
(MIS / IcePop); verl, TRL and OpenRLHF implement the same corrections.

The sampler (vLLM, a quantised or differently-batched engine) returns rollout_logp; the trainer
recomputes old_logp for the same tokens. The policy objective's ratio is taken against old_logp,
so the loss should be reweighted by w = pi_old / pi_rollout, per token or per sequence:
    loss_tok = objective_loss_tok * weights   (weights detached)

Hyperparameters (config fields `algo.<name>`):
- `correction_level`: "token" (w_t = exp(old - roll)) or "sequence" (w = exp(sum_t m (old - roll))
  broadcast to every token of the row).
- `correction_mode`: "truncate" (w <- min(w, cap), TIS) or "mask" (w <- w * 1[w <= cap], MIS:
  an implausible token or sequence is dropped instead of shrunk).
- `correction_cap` (float): the cap C.

Deliberate deviations:
1. One upper cap, no lower threshold (TRL's default C_min=None; verl's default rejection
   thresholds are not reproduced).
2. Weights are 0 on padding, and the gap metrics are masked means over valid tokens.
3. The per-token log-ratio is clamped to [-20, 20] before exp, so a sequence weight is finite.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LEVELS", "MODES", "importance_correction", "mismatch_metrics"]

LEVELS = ("token", "sequence")
"""Values of `correction_level`."""
MODES = ("truncate", "mask")
"""Values of `correction_mode`."""


def mismatch_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """The trainer/sampler gap on valid tokens (samples come from the sampler):
    "mismatch_k1" = mean (roll - old), "mismatch_k3" = mean k3, both estimating KL(roll || old);
    "mismatch_max_abs" = max |old - roll|."""
    keep = mask > 0
    n = keep.sum().clamp(min=1)
    log_r = torch.where(keep, (old_logp - rollout_logp).detach(), torch.zeros_like(old_logp))  # log(old/roll)
    k3 = torch.exp(log_r.clamp(-20, 20)) - 1.0 - log_r
    return {
        "mismatch_k1": float(-log_r.sum() / n),
        "mismatch_k3": float(torch.where(keep, k3, torch.zeros_like(k3)).sum() / n),
        "mismatch_max_abs": float(log_r.abs().max()) if keep.any() else 0.0,
    }


def importance_correction(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    *,
    correction_level: str = "token",
    correction_mode: str = "truncate",
    correction_cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """(B, T) detached weights w ~ pi_old / pi_rollout and metrics (gap plus the fraction of
    valid tokens whose weight was truncated or masked, "correction_clip_frac")."""
    keep = mask > 0
    log_w = torch.where(keep, (old_logp - rollout_logp).detach(), torch.zeros_like(old_logp))
    if correction_level == "token":
        pass
    elif correction_level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
    else:
        raise ValueError(f"unknown correction_level {correction_level!r}; valid: {', '.join(sorted(LEVELS))}")
    w = torch.exp(log_w.clamp(-20.0, 20.0))
    over = w > correction_cap
    if correction_mode == "truncate":
        w = w.clamp(max=correction_cap)
    elif correction_mode == "mask":
        w = torch.where(over, torch.zeros_like(w), w)
    else:
        raise ValueError(f"unknown correction_mode {correction_mode!r}; valid: {', '.join(sorted(MODES))}")
    w = torch.where(keep, w, torch.zeros_like(w))
    metrics = mismatch_metrics(old_logp, rollout_logp, mask)
    metrics["correction_clip_frac"] = float((over & keep).sum() / keep.sum().clamp(min=1))
    return w, metrics
