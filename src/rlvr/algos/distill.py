"""On-policy distillation with a token-level reverse KL to a teacher.

Papers: TOPD-style on-policy distillation (the student samples, a teacher scores every sampled
token, the student minimises the per-token reverse KL), as in "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes" (GKD; Agarwal et al. 2024, arXiv:2306.13649) with
the reverse-KL divergence, and its per-token advantage form −(log π − log π_teacher).

On the student's own samples y ~ π, KL(π || π_T) = E_y Σ_t [log π(y_t|·) − log π_T(y_t|·)]. Its
per-token score-function gradient, dropping the terms of later tokens (the token-level form,
discount 0), is E[(log π_t − log π_T,t) ∇ log π_t]; the loss here is sg(log π_t − log π_T,t) · ρ_t
with ρ_t = exp(log π_t − log π_old,t) (ρ = 1 on-policy, gradient ∇ log π_t), i.e. PPO's surrogate
with the advantage −(log π_t − log π_T,t) and no clip. The teacher's log-probs are the reference's
(`ref_logp`): `model.teacher_path` loads the reference from the teacher checkpoint. For a
masked-diffusion LM both log-probs are the estimator's per-token proxies under the same masks.

Deliberate deviations:
1. The task advantages are not read (pure distillation); mix in the task reward with a second
   run stage or a KL-regularised objective instead.
2. No clip on ρ (the surrogate's advantage is bounded by the teacher gap, not by a reward scale);
   `log_ratio_clamp` only bounds |log ρ| before the exp, as an overflow guard.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._registry import SET, Requirement, needs, requires


@requires(Requirement({"model.teacher_path": SET}, "reverse_kl_distill trains toward a teacher; set "
                     "model.teacher_path to its checkpoint", field="model.teacher_path"))
@needs("ref_logp")
def reverse_kl_distill(logp, old_logp, advantages, mask, *, ref_logp: Tensor,
                       log_ratio_clamp: float = 20.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss (B, T) sg(logp − ref_logp) · exp(logp − old_logp); metrics: the ratio and the
    sampled per-token reverse KL (logp − ref_logp)."""
    keep = mask > 0
    zero = torch.zeros_like(logp)
    logp = torch.where(keep, logp, zero)
    gap = torch.where(keep, (logp - ref_logp).detach(), zero)
    ratio = torch.exp((logp - torch.where(keep, old_logp.detach(), zero)).clamp(-log_ratio_clamp, log_ratio_clamp))
    loss = torch.where(keep, gap * ratio, zero)
    return loss, {"ratio": torch.where(keep, ratio.detach(), zero), "teacher_kl": gap}


__all__ = ["reverse_kl_distill"]
