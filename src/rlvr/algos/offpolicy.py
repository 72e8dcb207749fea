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

Hyperparameters: `beta` (float), the KL strength β; `shiq_beta` in the registered objective
`shiq` (config field `algo.shiq_beta`).

`shiq` is the `OBJECTIVES` entry: it declares (`needs`) the policy's logsumexp, the reference's
log-probs and logsumexp and the rows' token rewards, which the trainer then computes: the
logsumexp from the same forward (and logits) as the log-probs, the reference's in its no-grad
pass (a reference is built for it whatever `algo.kl_coef`), the rewards from the verifier. It
trains any rows: on-policy samples and, with `expert.objective=main`, the expert rows of
`rlvr.trainer.expert` alike (off-policy data needs no importance ratio here).

Deliberate deviations:
1. Derived here from the abstract's stated objective (a Bellman-derived, token-wise, off-policy
   loss on logits read as Q-values); the paper's exact loss may weight or shift terms
   differently. The test checks the fixed point by exact enumeration of a two-step MDP.
2. The logits are the temperature-scaled ones (`rollout.temperature`), as every log-prob in
   rlvr; the soft-optimal policy is then the sampler's distribution.
3. γ = 1 (episodic sequences with an outcome reward, the setting of the rest of rlvr).
4. The reward is the loop's shaped reward (task reward, DAPO overlong penalty, KL when
   `algo.kl_placement=reward`) on the last valid token; an unscorable row gets no loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._registry import Requirement, needs, requires


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


@requires(Requirement({"model.kind": "causal"}, "shiq reads the logits' logsumexp, which a diffusion likelihood "
                     "estimator does not have; use model.kind=causal or another objective"))
@needs("logsumexp", "ref_logp", "ref_logsumexp", "token_rewards")
def shiq(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, logsumexp: Tensor, ref_logp: Tensor,
         ref_logsumexp: Tensor, token_rewards: Tensor, shiq_beta: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """The registered ShiQ objective: `shiq_loss` per token (B, T) on every row whose
    `token_rewards` are finite (a NaN marks an unscorable row: no loss). `advantages` are unused
    (ShiQ learns from rewards, not advantages) and `old_logp` feeds only the reported "ratio".
    Metrics: "ratio", "shiq_abs_residual" |δ_t|, "shiq_q" q_θ(s_t, a_t)."""
    scorable = ~torch.isnan(token_rewards).any(-1, keepdim=True)
    keep = mask * scorable.to(mask.dtype)
    rewards = torch.nan_to_num(token_rewards, nan=0.0)
    delta = shiq_residuals(logp, ref_logp, logsumexp, ref_logsumexp, rewards, keep, beta=shiq_beta)
    on = keep > 0
    zero = torch.zeros_like(logp)
    gap = torch.where(on, (logp - ref_logp) + (logsumexp - ref_logsumexp), zero).detach()
    ratio = torch.where(on, (logp.detach() - old_logp.detach()).clamp(-20.0, 20.0).exp(), zero)
    metrics = {"ratio": ratio, "shiq_abs_residual": delta.detach().abs(), "shiq_q": shiq_beta * gap}
    return 0.5 * delta ** 2, metrics
