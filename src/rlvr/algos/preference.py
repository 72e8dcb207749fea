"""Preference losses on sequence log-likelihood estimates.

- `vrpo_loss`: VRPO (LLaDA 1.5) — DPO on ELBO estimates of chosen and rejected completions,
  with the same mask seed for policy and reference (shared randomness lowers the variance of
  the margin).

Hyperparameters: `beta` (float), the DPO temperature on the estimated log-ratio margin.

Deliberate deviations:
1. The estimates are whatever the caller passes (e.g. `elbo_mc` sequence values); the loss does
   not draw masks itself, so shared randomness is the caller's job (same `mask_seed`).
"""

from __future__ import annotations

import torch.nn.functional as F


def vrpo_loss(policy_chosen, ref_chosen, policy_rejected, ref_rejected, *, beta: float = 0.2):
    """VRPO = DPO with ELBO estimates: −log σ(β[(B̂θ(y_w) − B̂ref(y_w)) − (B̂θ(y_l) − B̂ref(y_l))]).
    All (B,) sequence estimates; compute them with the SAME mask seed for policy and reference
    (common random numbers, VRPO's third variance-reduction result). Returns (loss, metrics)."""
    margin = beta * ((policy_chosen - ref_chosen.detach()) - (policy_rejected - ref_rejected.detach()))
    loss = -F.logsigmoid(margin).mean()
    return loss, {"margin": float(margin.detach().mean()), "accuracy": float((margin > 0).float().mean())}
