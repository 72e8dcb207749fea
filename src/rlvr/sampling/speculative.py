"""SPEC-RL's verification step: how much of a previous rollout the current policy keeps.

SPEC-RL (speculative rollouts, arXiv:2509.23232) reuses the previous epoch's completion of a prompt as a draft:
token t of the old completion y is accepted while u_t < min(1, ℓ · π_new(y_t) / π_old(y_t)),
u_t ~ U(0, 1) (ℓ ≥ 1 is its lenience), and generation continues from the first rejected
position. This module holds the verification rule and the choice of the first new token;
`rlvr.engines.speculative` runs them on the causal torch sampler (`rollout.speculative`).

The first new token is where exactness is decided. Sampling it fresh from π_new (what continuing
"from the first rejected token" reads as) gives, at that position, min(p, q) + (1 − Σ min(p, q)) · p,
which is not p unless p = q: with ℓ = 1 the sample is *not* distributed as π_new. Sampling it from
the residual (p − q)⁺ / Σ(p − q)⁺, as speculative decoding does, makes the whole completion an exact
draw from π_new. Both are here (`first_token`), and the tests measure both. Deviations:
1. The residual rule is speculative decoding's (Leviathan et al. 2023), not SPEC-RL's as described;
   `fresh` is the rule as described (whether the released trainer draws the residual is not
   confirmed), kept so its bias can be measured.
2. ℓ > 1 is accepted but is off-policy by construction under either rule.
"""

from __future__ import annotations

import torch

FIRST_TOKENS = ("residual", "fresh")
"""How the first token after a rejection is drawn: from (p − q)⁺ (exact) or from p (SPEC-RL's reading)."""


def accepted_prefix(new_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, uniforms: torch.Tensor, *,
                    lenience: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """(B,) number of leading draft tokens accepted, and metrics.

    `new_logp`, `old_logp`: (B, T) log-probs of the draft's tokens under the current and the drafting
    policy; `mask`: (B, T) 1 on draft tokens; `uniforms`: (B, T) U(0, 1) draws. Token t is accepted
    when every earlier one was and log u_t < log ℓ + new − old. A fully accepted draft keeps all of
    its tokens (its end included)."""
    ok = (torch.log(uniforms) < (new_logp - old_logp + torch.log(torch.tensor(float(lenience))))) | (mask == 0)
    kept = torch.cumprod(ok.long(), dim=-1) * mask.long()                   # (B, T) 1 while all so far accepted
    n = kept.sum(-1)                                                        # (B,)
    total = mask.sum()
    return n, {"speculative/accepted_frac": float(n.sum() / total) if total > 0 else 0.0,
               "speculative/full_accept_frac": float((n == mask.sum(-1)).float().mean())}


def first_token_probs(new_probs: torch.Tensor, old_probs: torch.Tensor, *, rule: str) -> torch.Tensor:
    """(B, V) distribution of the first new token at a rejected position, given the current
    policy's `new_probs` and the drafting policy's `old_probs` (B, V) there. `residual`: (p − q)⁺
    normalised (p itself where p ≤ q everywhere, which a rejection makes impossible up to rounding);
    `fresh`: p."""
    if rule not in FIRST_TOKENS:
        raise ValueError(f"first token rule {rule!r}: expected one of {FIRST_TOKENS}")
    if rule == "fresh":
        return new_probs
    residual = (new_probs - old_probs).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), new_probs)
