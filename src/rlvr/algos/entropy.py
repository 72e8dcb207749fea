"""Token entropy of the policy, from logits.

Used by the entropy bonus (loss -= entropy_coef * aggregate(H)) and as a diagnostic; DAPO and
"Tricks or Traps" (literature/000_*.txt lines 93, 27) watch it for entropy collapse.

H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}, computed in float32 or wider.

Hyperparameters: none.

Deliberate deviations:
1. No vocabulary chunking here: the model code computes logits in chunks if it must and can
   call this per chunk of positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["token_entropy"]


def token_entropy(logits: Tensor) -> Tensor:
    """(..., V) logits -> (...) entropy in nats; differentiable."""
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logz = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    return logz - (p * z).sum(dim=-1)
