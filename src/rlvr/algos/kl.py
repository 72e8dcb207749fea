"""KL estimators: per-token estimate (B, T) of the KL between the policy and a reference.

Papers (abstracts in /work/shared/literature/, see docs/papers.md):
- k1, k2, k3: J. Schulman, "Approximating KL Divergence" (2020 note); k3 as the GRPO KL loss
  (DeepSeekMath, Shao et al. 2024).

Signature of every estimator:
    fn(logp, ref_logp, *, old_logp=None) -> (B, T) per-token estimate, differentiable in logp
With delta = logp - ref_logp on tokens sampled from the policy:
- k1 = delta              unbiased for KL(pi || ref); its gradient has zero mean (pure noise in
                          the loss), use it in the reward.
- k2 = delta^2 / 2        biased; in the loss its gradient is the reverse-KL gradient on-policy.
- k3 = e^-delta + delta - 1   unbiased for KL(pi || ref), always >= 0; in the loss its gradient
                          is that of the FORWARD KL(ref || pi).
- abs = |delta|.
`old_logp` is accepted by every estimator (so the caller passes it uniformly) and ignored unless
the estimator is importance-weighted. The mask is applied by the aggregation, not here.

Hyperparameters: none.

Deliberate deviations:
1. k3 clamps the exponent -delta to [-20, 20] (overflow guard) but not its output; verl also
   clamps the output to [-10, 10] and OpenRLHF clamps every estimator's output, which silently
   zeroes the gradient of far-off tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algos._registry import lookup

__all__ = ["KL_ESTIMATORS", "get_kl_estimator", "kl_abs", "k1", "k2", "k3"]

_EXP_CLAMP = 20.0


def k1(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k1 = logp - ref_logp. Shape (B, T)."""
    return logp - ref_logp.detach()


def k2(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2. Shape (B, T)."""
    return 0.5 * (logp - ref_logp.detach()) ** 2


def k3(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1 >= 0. Shape (B, T)."""
    log_r = (ref_logp.detach() - logp).clamp(-_EXP_CLAMP, _EXP_CLAMP)  # log(ref / pi)
    return torch.exp(log_r) - log_r - 1.0


def kl_abs(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """|logp - ref_logp|. Shape (B, T)."""
    return (logp - ref_logp.detach()).abs()


KL_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "abs": kl_abs,
}


def get_kl_estimator(name: str) -> Callable[..., Tensor]:
    """The KL estimator registered as `name`; ValueError listing valid names otherwise."""
    return lookup(KL_ESTIMATORS, "KL estimator", name)
