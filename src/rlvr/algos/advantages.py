"""Advantage estimators: outcome rewards -> token advantages (B, T).

Papers (abstracts in /work/shared/literature/, see docs/papers.md):
- `grpo`: DeepSeekMath (Shao et al. 2024), group-normalised outcome advantage.
- `dr_grpo`: "Understanding R1-Zero-Like Training" (Liu et al. 2025), no std division.
- `rloo`: "Back to Basics: Revisiting REINFORCE Style Optimization" (Ahmadian et al. 2024).

Conventions. Rows are grouped contiguously: rows [p*G:(p+1)*G] are the G completions of prompt
p, B = P*G. A NaN reward means "not scorable": that row gets advantage 0 and is left out of its
group's statistics. Every estimator is `fn(inp, **hparams) -> (advantages (B, T), metrics)`;
the advantages are already multiplied by `response_mask`, and `metrics` holds plain floats.

Hyperparameters (one flat namespace, same meaning wherever used):
- `std_normalize` (bool): divide the centred reward by the group std (GRPO) or not (Dr.GRPO).
- `adv_eps` (float): added to the std before dividing (not to the variance).

Deliberate deviations:
1. std is Bessel-corrected (as verl, TRL and OpenRLHF do) and `adv_eps` defaults to verl's 1e-6.
2. `group_size == 1` means "no baseline": A = R for the group estimators (verl's rule for GRPO
   and RLOO; verl's vectorised RLOO returns 0 instead).
3. A group of size G > 1 with fewer than two scorable rewards gets A = 0: it carries no
   comparison, and switching to the G = 1 rule because a verifier failed would change the
   estimator silently. TRL would produce NaN there.
4. A group whose scorable rewards are all equal gets exactly 0 (tested with max == min), not
   the tiny 1e-17/(1e-17 + eps) that float round-off in the mean would leave.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlvr.algos._registry import lookup

__all__ = [
    "ADVANTAGES",
    "AdvantageInputs",
    "GroupStats",
    "dr_grpo",
    "get_advantage",
    "group_stats",
    "grpo",
    "rloo",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read. Shapes: B = P*G rows, T completion tokens."""

    rewards: Tensor  # (B,) float; NaN = not scorable
    group_size: int  # G; rows [p*G:(p+1)*G] share prompt p
    response_mask: Tensor  # (B, T) float 0/1, 1 for trainable completion tokens
    values: Tensor | None = None  # (B, T) critic values, for gae
    baseline_rewards: Tensor | None = None  # (P,) greedy-rollout rewards, for remax


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics over scorable rewards. Shapes (P, G) or (P, 1)."""

    rewards: Tensor  # (P, G) with NaN replaced by 0
    valid: Tensor  # (P, G) bool, True where the reward is scorable
    count: Tensor  # (P, 1) number of scorable rewards in the group
    mean: Tensor  # (P, 1) mean of the scorable rewards (0 for an empty group)
    std: Tensor  # (P, 1) Bessel std of the scorable rewards (0 when count < 2)
    constant: Tensor  # (P, 1) bool: scorable rewards all equal (or fewer than two)


def group_stats(rewards: Tensor, group_size: int) -> GroupStats:
    """Group the (B,) rewards into (P, G) and compute NaN-aware mean and Bessel std."""
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be (P*G,) with G={group_size}; got {tuple(rewards.shape)}")
    r = rewards.detach().float().view(-1, group_size)  # (P, G)
    valid = ~torch.isnan(r)
    r = torch.where(valid, r, torch.zeros_like(r))
    count = valid.sum(dim=1, keepdim=True).float()  # (P, 1)
    mean = r.sum(dim=1, keepdim=True) / count.clamp(min=1)
    sq = torch.where(valid, (r - mean) ** 2, torch.zeros_like(r))
    std = (sq.sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    std = torch.where(count >= 2, std, torch.zeros_like(std))
    big, small = torch.finfo(r.dtype).max, torch.finfo(r.dtype).min
    hi = torch.where(valid, r, torch.full_like(r, small)).amax(dim=1, keepdim=True)
    lo = torch.where(valid, r, torch.full_like(r, big)).amin(dim=1, keepdim=True)
    constant = (count < 2) | (hi == lo)
    return GroupStats(rewards=r, valid=valid, count=count, mean=mean, std=std, constant=constant)


def _to_tokens(adv_seq: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) or (P, G) sequence advantage -> (B, T), zero outside the mask."""
    return adv_seq.reshape(-1, 1).to(response_mask.dtype) * response_mask


def _group_metrics(st: GroupStats) -> dict[str, float]:
    return {
        "scorable_frac": st.valid.float().mean().item(),
        "zero_std_group_frac": st.constant.float().mean().item(),
    }


def _centred(st: GroupStats, group_size: int) -> Tensor:
    """R - mean_g over scorable rows; the G = 1 and degenerate-group rules (deviations 2-4)."""
    if group_size == 1:
        return st.rewards  # no baseline: A = R (NaN rows already 0)
    centred = st.rewards - st.mean
    return torch.where(st.valid & ~st.constant, centred, torch.zeros_like(centred))


def grpo(inp: AdvantageInputs, *, std_normalize: bool = True, adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GRPO: A_i = (R_i - mean_g) / (std_g + adv_eps), broadcast to the completion tokens.

    `std_normalize=False` gives R_i - mean_g (the Dr.GRPO advantage). G = 1: A = R.
    """
    st = group_stats(inp.rewards, inp.group_size)
    adv = _centred(st, inp.group_size)
    if std_normalize and inp.group_size > 1:
        adv = adv / (st.std + adv_eps)
    return _to_tokens(adv, inp.response_mask), _group_metrics(st)


def dr_grpo(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """Dr.GRPO: A_i = R_i - mean_g (no std division; the length fix lives in the aggregation,
    `seq_mean_token_sum_norm`)."""
    st = group_stats(inp.rewards, inp.group_size)
    return _to_tokens(_centred(st, inp.group_size), inp.response_mask), _group_metrics(st)


def rloo(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """RLOO: A_i = R_i - mean of the other scorable rewards of the group.

    Equal to n/(n-1) * (R_i - mean_g) with n scorable rewards in the group. G = 1: A = R.
    """
    st = group_stats(inp.rewards, inp.group_size)
    adv = _centred(st, inp.group_size)
    if inp.group_size > 1:
        adv = adv * st.count / (st.count - 1).clamp(min=1)
    return _to_tokens(adv, inp.response_mask), _group_metrics(st)


ADVANTAGES: dict[str, Callable[..., tuple[Tensor, dict[str, float]]]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
}


def get_advantage(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """The advantage estimator registered as `name`; ValueError listing valid names otherwise."""
    return lookup(ADVANTAGES, "advantage", name)
