"""Shared pieces of the advantage estimators: the inputs, group statistics, reward placement.

Conventions (the whole `advantages` family): rows are grouped contiguously, rows
[p*G:(p+1)*G] are the G completions of prompt p, B = P*G. A NaN reward means "not scorable":
that row gets advantage 0 and is left out of every statistic (group or batch).

The scalar an outcome estimator sees for row i is its sequence score
    s_i = R_i + sum_t m_{i,t} * token_rewards_{i,t}
(`token_rewards` optional, e.g. -beta * k1 for a KL penalty in the reward). A token-level
estimator sees the token rewards r_{i,t} = token_rewards_{i,t} * m_{i,t} with R_i added at the
last valid token of row i (the verl / OpenRLHF placement).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read. Shapes: B = P*G rows, T completion tokens."""

    rewards: Tensor  # (B,) float; NaN = not scorable
    group_size: int  # G; rows [p*G:(p+1)*G] share prompt p
    response_mask: Tensor  # (B, T) float 0/1, 1 for trainable completion tokens
    values: Tensor | None = None  # (B, T) critic values, for gae
    baseline_rewards: Tensor | None = None  # (P,) greedy-rollout rewards, for remax
    token_rewards: Tensor | None = None  # (B, T) extra per-token rewards (e.g. -beta*k1), or None
    old_logp: Tensor | None = None  # (B, T) log-probs of the sampled tokens under the behaviour policy (OTB)
    sum_pi_squared: Tensor | None = None  # (B, T) sum_v pi_v^2 of the behaviour policy at each position (OTB)
    reward_components: Tensor | None = None  # (B, K) separate reward components (gdpo); None = rewards alone
    reward_weights: Tensor | None = None  # (K,) weights of the components (gdpo); None = all 1
    turn_index: Tensor | None = None  # (B, T) long: turn of each completion token, -1 none (multi-turn agents)
    turn_rewards: Tensor | None = None  # (B, K) float: the environment's reward of each turn
    turn_states: Tensor | None = None  # (B, K) long: id of the state each turn's action was taken in
    turn_valid: Tensor | None = None  # (B, K) bool: real turns (False = padding)
    trace: Tensor | None = None  # (B, T) long: masked-diffusion step that committed each token (lightning)


def wide(x: Tensor, *others: Tensor | None) -> torch.dtype:
    """The dtype the statistics run in: the widest of `x`, `others` and float32 (promote a
    float64 input, never demote it: a float64 group whose rewards differ by 1e-8 must not be
    rounded to a float32 zero-variance group)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    for o in others:
        if o is not None:
            dtype = torch.promote_types(dtype, o.dtype)
    return dtype


def working_mask(inp: AdvantageInputs) -> Tensor:
    """(B, T) response mask in the dtype of the widest input (rewards, token rewards, values,
    baseline rewards, the mask itself)."""
    dtype = wide(inp.rewards, inp.response_mask, inp.token_rewards, inp.values, inp.baseline_rewards)
    return inp.response_mask.to(dtype)


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics over scorable scores. Shapes (P, G) or (P, 1)."""

    scores: Tensor  # (P, G) with NaN replaced by 0
    valid: Tensor  # (P, G) bool, True where the score is scorable
    count: Tensor  # (P, 1) number of scorable scores in the group
    mean: Tensor  # (P, 1) mean of the scorable scores (0 for an empty group)
    std: Tensor  # (P, 1) Bessel std of the scorable scores (0 when count < 2)
    constant: Tensor  # (P, 1) bool: scorable scores all equal (or fewer than two)


def sequence_scores(inp: AdvantageInputs) -> Tensor:
    """(B,) s_i = R_i + sum_t m * token_rewards (NaN stays NaN: still not scorable)."""
    dtype = wide(inp.rewards, inp.token_rewards)
    r = inp.rewards.detach().to(dtype)
    if inp.token_rewards is not None:
        r = r + (inp.token_rewards.detach().to(dtype) * inp.response_mask.to(dtype)).sum(dim=-1)
    return r


def group_stats(scores: Tensor, group_size: int) -> GroupStats:
    """Group the (B,) scores into (P, G) and compute NaN-aware mean and Bessel std."""
    if group_size < 1 or scores.dim() != 1 or scores.numel() % group_size != 0:
        raise ValueError(f"rewards must be (P*G,) with G={group_size}; got {tuple(scores.shape)}")
    s = scores.detach().to(wide(scores)).view(-1, group_size)  # (P, G)
    valid = ~torch.isnan(s)
    s = torch.where(valid, s, torch.zeros_like(s))
    count = valid.sum(dim=1, keepdim=True).to(s.dtype)  # (P, 1)
    mean = s.sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = torch.where(valid, (s - mean) ** 2, torch.zeros_like(s))
    std = (sq.sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    std = torch.where(count >= 2, std, torch.zeros_like(std))
    big, small = torch.finfo(s.dtype).max, torch.finfo(s.dtype).min
    hi = torch.where(valid, s, torch.full_like(s, small)).amax(dim=1, keepdim=True)
    lo = torch.where(valid, s, torch.full_like(s, big)).amin(dim=1, keepdim=True)
    constant = (count < 2) | (hi == lo)
    return GroupStats(scores=s, valid=valid, count=count, mean=mean, std=std, constant=constant)


def centred_scores(st: GroupStats, group_size: int) -> Tensor:
    """(P, G) s - mean_g over scorable rows. G = 1: s itself (no baseline). A group with fewer
    than two scorable scores (G > 1), or all of them equal, gets exactly 0; NaN rows get 0."""
    if group_size == 1:
        return st.scores
    centred = st.scores - st.mean
    return torch.where(st.valid & ~st.constant, centred, torch.zeros_like(centred))


def group_metrics(st: GroupStats) -> dict[str, float]:
    """Scalar diagnostics every group estimator reports."""
    return {
        "scorable_frac": st.valid.float().mean().item(),
        "zero_std_group_frac": st.constant.float().mean().item(),
    }


def to_tokens(adv_seq: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) or (P, G) sequence advantage -> (B, T), zero outside the mask, in the wider dtype of
    the two."""
    dtype = torch.promote_types(adv_seq.dtype, response_mask.dtype)
    return adv_seq.reshape(-1, 1).to(dtype) * response_mask.to(dtype)


def row_valid(rewards: Tensor) -> Tensor:
    """(B,) bool: the row's reward is scorable."""
    return ~torch.isnan(rewards)


def last_token_index(response_mask: Tensor) -> Tensor:
    """(B,) index of the last valid token of each row (0 for an empty row)."""
    T = response_mask.shape[-1]
    positions = torch.arange(T, device=response_mask.device).expand_as(response_mask)
    return torch.where(response_mask > 0, positions, torch.zeros_like(positions)).amax(dim=-1)


def token_level_rewards(inp: AdvantageInputs) -> Tensor:
    """(B, T) r_{i,t}: token_rewards * mask, plus R_i at the last valid token (NaN R -> 0)."""
    mask = working_mask(inp)
    r_tok = torch.zeros_like(mask)
    if inp.token_rewards is not None:
        r_tok = inp.token_rewards.detach().to(mask.dtype) * mask
    outcome = torch.nan_to_num(inp.rewards.detach().to(mask.dtype), nan=0.0)
    has_token = mask.sum(dim=-1) > 0
    outcome = torch.where(has_token, outcome, torch.zeros_like(outcome))  # empty row: nowhere to put it
    return r_tok.scatter_add(1, last_token_index(mask)[:, None], outcome[:, None])


def whiten(x: Tensor, weight_mask: Tensor, *, adv_eps: float) -> Tensor:
    """(x - mean) / (std + adv_eps) over entries with weight_mask 1 (Bessel std over those
    entries), zero elsewhere. Shapes (B, T)."""
    keep = weight_mask > 0
    n = keep.sum()
    if n == 0:
        return torch.zeros_like(x)
    xs = torch.where(keep, x, torch.zeros_like(x))
    mean = xs.sum() / n
    var = torch.where(keep, (x - mean) ** 2, torch.zeros_like(x)).sum() / (n - 1).clamp(min=1)
    out = (x - mean) / (var.sqrt() + adv_eps)
    return torch.where(keep, out, torch.zeros_like(out))
