"""Token-wise off-policy learning with logits as Q-values (ShiQ-style soft Bellman consistency).

Paper: "ShiQ: Bringing back Bellman to LLMs" (Clavier et al. 2025; literature/000_*.txt line 71):
losses derived from Bellman equations so that the LLM's logits become Q-value estimates, learned
token-wise and off-policy (any behaviour policy's sequences).

The KL-regularised token MDP (state s_t = prompt + a_<t, reward r_t, reference π_ref, strength
β, γ = 1) has optimal policy π*(a|s) = π_ref(a|s) exp((Q*(s,a) − V*(s))/β) with
Q*(s_t, a_t) = r_t + V*(s_{t+1}). Reading the logits ℓ as shifted Q-values,
q_θ(s, a) = β (ℓ_θ(s, a) − ℓ_ref(s, a)), makes softmax(ℓ_θ) the policy that q_θ implies, and
V_θ(s) = β log Σ_a π_ref(a|s) exp(q_θ(s,a)/β) = β (lse ℓ_θ(s) − lse ℓ_ref(s)). Unrolling the
Bellman equation to the end of the sequence (the multi-step form, no bootstrapped target
network) gives, at every token t of any sampled sequence,
    δ_t = q_θ(s_t, a_t) + β Σ_{k>t} log(π_θ/π_ref)(a_k|s_k) − Σ_{k≥t} r_k,
which is 0 for all t exactly when π_θ = π*; the loss is ½ δ_t² per token. In log-prob terms
q_θ(s_t, a_t) = β (logp_t − ref_logp_t) + β (lse_t − ref_lse_t).

Hyperparameters: `beta` (float), the KL strength β.

Deliberate deviations:
1. Derived here from the abstract's stated objective (a Bellman-derived, token-wise, off-policy
   loss on logits read as Q-values); the paper's exact loss may weight or shift terms
   differently. The test checks the fixed point by exact enumeration of a two-step MDP.
2. Not in a registry and not wired into the trainer: it needs the logsumexp of the policy's
   (and reference's) raw logits at every position, which the `PolicyModel` seam does not return
   (it returns normalised log-probs only).
3. γ = 1 (episodic sequences with an outcome reward, the setting of the rest of rlvr).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _reverse_cumsum(x: Tensor) -> Tensor:
    """y_t = Σ_{k≥t} x_k along the last dim."""
    return x.flip(-1).cumsum(-1).flip(-1)


def shiq_residuals(logp: Tensor, ref_logp: Tensor, lse: Tensor, ref_lse: Tensor, token_rewards: Tensor,
                   mask: Tensor, *, beta: float) -> Tensor:
    """δ_t (B, T) of the module docstring; 0 outside `mask`. `lse`/`ref_lse` (B, T): logsumexp of
    the policy's / reference's logits at the position that emits token t; `token_rewards` (B, T)
    (an outcome reward sits on the last valid token). `ref_logp`, `ref_lse` are detached."""
    keep = mask > 0
    zero = torch.zeros_like(logp)
    log_ratio = torch.where(keep, logp - ref_logp.detach(), zero)
    q = beta * (log_ratio + torch.where(keep, lse - ref_lse.detach(), zero))
    future_kl = beta * (_reverse_cumsum(log_ratio) - log_ratio)  # Σ_{k>t}
    returns = _reverse_cumsum(torch.where(keep, token_rewards, zero))
    return torch.where(keep, q + future_kl - returns, zero)


def shiq_loss(logp: Tensor, ref_logp: Tensor, lse: Tensor, ref_lse: Tensor, token_rewards: Tensor, mask: Tensor,
              *, beta: float = 0.1) -> Tensor:
    """Per-token ½ δ_t² (B, T), zero outside `mask`; aggregate with any `AGGREGATIONS` entry."""
    return 0.5 * shiq_residuals(logp, ref_logp, lse, ref_lse, token_rewards, mask, beta=beta) ** 2
