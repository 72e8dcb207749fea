"""Token-level advantage estimators built on returns: REINFORCE++, ReMax, GAE.

Papers (arXiv ids and links in docs/papers.md):
- `reinforce_pp`, `reinforce_pp_baseline`: "REINFORCE++: Stabilizing Critic-Free Policy
  Optimization with Global Advantage Normalization" (Hu et al. 2025).
- `remax`: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
  Large Language Models" (Li et al. 2023), greedy-rollout baseline.
- `gae`: "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
  (Schulman et al. 2015), with PPO's critic.

Token rewards r_{i,t}: the outcome R_i at the last valid token plus `token_rewards * mask` (see
`_advantage_core.token_level_rewards`). Masked positions inside a row (tool or observation
tokens) are skipped: the running return and the next value carry across them unchanged, and
their advantage is 0 (verl's newer convention). Rows with a NaN reward get advantage 0 and are
left out of the whitening statistics.

Hyperparameters: `gamma` (discount), `lam` (GAE lambda), `adv_eps` (added to the std in
whitening), shared with `advantages`.

Deliberate deviations:
1. Whitening divides by (Bessel std over valid tokens + adv_eps) instead of verl's
   sqrt(var + 1e-8), so `adv_eps` has one meaning across the registry.
2. `gae` returns only the advantages; the critic's targets come from `gae_returns` (same inputs,
   same hyperparameters), returns = raw GAE + V, before whitening. Rows with a NaN reward get
   returns equal to their values (no value-loss signal).
3. `remax` gives 0 to the rows of a prompt whose greedy baseline reward is NaN.
4. `reinforce_pp_baseline` follows verl: s_i - mean_g broadcast, then whitened over all valid
   tokens of the batch (so an all-equal group ends at -mean/std, not 0). OpenRLHF instead puts
   the centred score at the last token before adding the per-token KL; they agree without
   `token_rewards`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._advantage_core import (
    AdvantageInputs,
    centred_scores,
    group_metrics,
    group_stats,
    row_valid,
    sequence_scores,
    to_tokens,
    token_level_rewards,
    whiten,
    working_mask,
)
from rlvr.algos._registry import Requirement, needs, requires

__all__ = [
    "discounted_returns",
    "gae",
    "gae_returns",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
]


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """(B, T) G_t = r_t + gamma * G_{t'} with t' the next valid token; 0 at masked positions."""
    B, T = token_rewards.shape
    running = torch.zeros(B, dtype=token_rewards.dtype, device=token_rewards.device)
    out = torch.zeros_like(token_rewards)
    for t in reversed(range(T)):
        valid = response_mask[:, t] > 0
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(valid, running, torch.zeros_like(running))
    return out


def _scorable_tokens(inp: AdvantageInputs) -> Tensor:
    """(B, T) response mask restricted to rows with a scorable reward."""
    mask = working_mask(inp)
    return mask * row_valid(inp.rewards)[:, None].to(mask.dtype)


def reinforce_pp(
    inp: AdvantageInputs, *, gamma: float = 1.0, adv_eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++: discounted token returns, whitened over every valid token of the batch."""
    mask = _scorable_tokens(inp)
    returns = discounted_returns(token_level_rewards(inp), mask, gamma=gamma)
    adv = whiten(returns, mask, adv_eps=adv_eps)
    return adv, {"scorable_frac": row_valid(inp.rewards).float().mean().item()}


def reinforce_pp_baseline(inp: AdvantageInputs, *, adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline: (s_i - mean_g) broadcast, then whitened over all batch tokens."""
    st = group_stats(sequence_scores(inp), inp.group_size)
    centred = to_tokens(centred_scores(st, inp.group_size), inp.response_mask)
    adv = whiten(centred, _scorable_tokens(inp), adv_eps=adv_eps)
    return adv, group_metrics(st)


@needs("baseline_rewards")
def remax(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """ReMax: A_{i,t} = reward-to-go_{i,t} - b_p, b_p the greedy rollout's reward for prompt p."""
    if inp.baseline_rewards is None:
        raise ValueError("remax needs baseline_rewards: the (P,) rewards of greedy rollouts")
    mask = _scorable_tokens(inp)
    baseline = inp.baseline_rewards.detach().to(mask.dtype).repeat_interleave(inp.group_size)  # (B,)
    if baseline.numel() != mask.shape[0]:
        raise ValueError(f"baseline_rewards must be (P,) = ({mask.shape[0] // inp.group_size},)")
    mask = mask * (~torch.isnan(baseline))[:, None].to(mask.dtype)
    to_go = discounted_returns(token_level_rewards(inp), mask, gamma=1.0)
    adv = (to_go - torch.nan_to_num(baseline)[:, None]) * mask
    return adv, {"scorable_frac": row_valid(inp.rewards).float().mean().item()}


def _gae_raw(inp: AdvantageInputs, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """(B, T) un-whitened GAE advantages and the mask they live on."""
    if inp.values is None:
        raise ValueError("gae needs values: the (B, T) critic values of the completion tokens")
    mask = _scorable_tokens(inp)
    rewards = token_level_rewards(inp)
    values = inp.values.detach().to(mask.dtype)
    B, T = mask.shape
    next_value = torch.zeros(B, dtype=mask.dtype, device=mask.device)  # V after the last token = 0
    running = torch.zeros_like(next_value)
    adv = torch.zeros_like(mask)
    for t in reversed(range(T)):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid, delta + gamma * lam * running, running)
        next_value = torch.where(valid, values[:, t], next_value)
        adv[:, t] = torch.where(valid, running, torch.zeros_like(running))
    return adv, mask


@requires(Requirement({"model.lora.r": 0}, "the GAE critic is not implemented with LoRA; use a critic-free advantage "
                     "such as grpo, or set it to 0", field="model.lora.r"),
          Requirement({"expert.per_step": 0}, "expert rows have no critic values; use a critic-free advantage such as "
                      "grpo, or set it to 0", field="expert.per_step"))
def gae(
    inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, adv_eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GAE: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, then whitened
    over the valid tokens of the batch. Needs `inp.values`; critic targets: `gae_returns`."""
    raw, mask = _gae_raw(inp, gamma, lam)
    n = mask.sum().clamp(min=1)
    metrics = {
        "scorable_frac": row_valid(inp.rewards).float().mean().item(),
        "raw_adv_mean": float((raw * mask).sum() / n),
    }
    return whiten(raw, mask, adv_eps=adv_eps), metrics


def gae_returns(inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0) -> Tensor:
    """(B, T) value targets: raw GAE + V on valid tokens (V itself on NaN-reward rows), 0 on
    padding."""
    raw, mask = _gae_raw(inp, gamma, lam)
    values = inp.values.detach().to(mask.dtype)
    keep = inp.response_mask > 0
    return torch.where(keep, raw + values, torch.zeros_like(raw))  # junk values at padding never leak
