"""DMPO's advantage: self-normalised importance weights toward the reward-tilted optimum, centred.

Paper: DMPO, "Enhancing Reasoning for Diffusion LLMs via Distribution Matching Policy Optimization"
(Zhu et al. 2025; code github.com/yuchen-zhu-zyc/DMPO). The KL-regularised optimum is
π*(y) ∝ π_ref(y) exp(r(y)/β); DMPO fits the policy to it by the cross-entropy −E_{π*}[log π_θ(y)],
estimated on the G samples of a group drawn from the policy with self-normalised importance weights
    w_i = softmax_j(s_j / β)_i     (over the group's scorable rows),
and subtracts the weights' group mean ("weight baseline subtraction": Σ_i (w_i − w̄) ∇log π_θ(y_i)
has the same expectation direction with less variance, and a group whose rewards are all equal
gives no gradient). The likelihood is the masked-diffusion ELBO (estimator `elbo_mc`); the loss,
summed over a group as in the released trainer, is
    L = −Σ_i (w_i − 1/G) · ELBO_i.
`dmpo` returns A_i = G (w_i − 1/G) = G w_i − 1 on each valid token, so the `reinforce` objective
(−A · logp) with `seq_mean_token_mean` aggregation gives −(1/P) Σ_groups Σ_i (w_i − 1/G) ELBO_i / L_i:
the released loss per prompt, on the released length-normalised scale (its 1/m weights without
the gen_length factor).

Hyperparameter `dmpo_beta` (config field `algo.dmpo_beta`): β > 0, the temperature of the tilt (the released
code's `coeff` is 1/β in its α = 0 branch).

Deliberate deviations:
1. The weights omit the log-ratio log π_ref(y)/π_θ(y) (the released α > 0 branch, whose per-sample
   log-ratio comes from a token-by-token replay of the sampler): on-policy at the start of training
   π_θ = π_ref, and the trainer's samples carry no exact sequence likelihood. This is the released
   α = 0 branch, w = softmax(coeff · r).
2. No adaptive coefficient (the released `ada_coeff` searches coeff per group for a target
   effective sample size); β is fixed.
3. NaN (unscorable) rows get weight 0 and advantage 0 and are left out of the softmax; a group with
   fewer than two scorable rows gets 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._advantage_core import (
    AdvantageInputs,
    group_metrics,
    group_stats,
    sequence_scores,
    to_tokens,
)


def dmpo_weights(scores: Tensor, group_size: int, *, beta: float = 1.0) -> Tensor:
    """(P, G) self-normalised weights softmax(s/β) over each group's scorable rows (0 elsewhere)."""
    if not beta > 0:
        raise ValueError(f"dmpo_beta must be > 0, got {beta}")
    st = group_stats(scores, group_size)
    logits = torch.where(st.valid, st.scores / beta, torch.full_like(st.scores, -torch.inf))
    weights = logits.softmax(-1)
    return torch.where(st.valid, weights, torch.zeros_like(weights))


def dmpo_centred(scores: Tensor, group_size: int, *, beta: float = 1.0) -> Tensor:
    """(P, G) A_i = n (w_i − 1/n) over the n scorable rows of the group; 0 for NaN rows and for
    groups with fewer than two scorable rows (no comparison) or all scores equal (w uniform)."""
    st = group_stats(scores, group_size)
    weights = dmpo_weights(scores, group_size, beta=beta)
    centred = st.count * weights - 1.0
    return torch.where(st.valid & ~st.constant, centred, torch.zeros_like(centred))


def dmpo(inp: AdvantageInputs, *, dmpo_beta: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """DMPO's centred importance weights as advantages (B, T); metric: the weights' effective
    sample size over the group size, 1 / (G Σ w²) (1 = uniform, 1/G = one row takes all)."""
    scores = sequence_scores(inp)
    st = group_stats(scores, inp.group_size)
    weights = dmpo_weights(scores, inp.group_size, beta=dmpo_beta)
    metrics = group_metrics(st)
    ess = 1.0 / (weights.square().sum(-1) * st.count.squeeze(-1)).clamp(min=1e-12)
    metrics["dmpo_ess"] = float(ess.mean())
    return to_tokens(dmpo_centred(scores, inp.group_size, beta=dmpo_beta), inp.response_mask), metrics


__all__ = ["dmpo", "dmpo_centred", "dmpo_weights"]
