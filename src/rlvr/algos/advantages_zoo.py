"""More advantage estimators, the rest of verl 0.9.1's registry: GPG, verl's best-of-k pass@k,
GDPO and the optimal token baseline (single- and multi-turn). Same signature and conventions as
`advantages` (registered there, in ADVANTAGES): `fn(inp, **hparams) -> (advantages (B, T),
metrics)`, rows [p*G:(p+1)*G] share prompt p, a NaN reward is not scorable (advantage 0, left
out of every statistic).

Papers (arXiv ids and links in docs/papers.md):
- `gpg`: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
  (Chu et al. 2025). Pair with the `reinforce` objective (verl's `gpg` policy loss is -A logp).
- `grpo_passk`: verl's `grpo_passk`, after "Optimizing Language Models for Inference Time
  Objectives using Reinforcement Learning" (Tang et al. 2025): the pass@k reward of a group is
  its best score, and only the best row gets credit, the gap to the runner-up. `passk`
  (`binary_advantages.py`) is a different estimator, the analytic pass@k advantage of Chen et al.
- `gdpo`: "GDPO: Group reward-Decoupled Normalization Policy Optimization" (arXiv 2601.05242):
  normalise each reward component within its group, sum with weights, whiten over the batch.
- `optimal_token_baseline`, `optimal_token_baseline_multi_turn`: verl's OTB ("optimal token
  baseline"): a per-position baseline B_t = sum_i G_{i,t} W_{i,t} / sum_i W_{i,t} over the
  group, W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2) the cumulative squared score norm of the
  sampled path (the variance-minimising baseline when the gradient's size grows with W).

Hyperparameters (config fields `algo.<name>`): `std_normalize`, `adv_eps` (as in `advantages`,
for gdpo's per-component GRPO step and its batch whitening, and grpo_passk's std division);
`f_norm` (float): GPG's constant divisor of the advantage (verl's, 1 = none); `zero_tail`
(bool): OTB gives the longest row of a group no baseline past the second-longest row's length
(no other row reaches those positions, so B_t there would be the row's own return).

Deliberate deviations from verl 0.9.1:
1. `gpg` counts only scorable rows in alpha = n / #nonzero scores and leaves NaN rows at 0.
2. `gdpo` whitens with rlvr's `whiten`, (x - mean) / (std + adv_eps) over the valid tokens;
   verl's masked_whiten uses (x - mean) / sqrt(var + 1e-8). Its components come from
   `inp.reward_components` (B, K) with weights `inp.reward_weights` (K,) (the trainer fills them
   when `reward.fn` names several functions: each function's own score and weight); without them
   it is the one-component case (verl's fallback when no gdpo_reward_keys are given). A row whose
   weighted reward is not scorable is left out of every component's group statistics.
3. OTB ignores rollout-correction weights (verl can rescale W by rho^2), and W at a NaN row is 0.
   Both OTB entries declare (`needs`) `old_logp` and `sum_pi_squared`; the trainer computes them
   in its old-policy pass from the same logits as the log-probs (as verl's
   `actor.calculate_sum_pi_squared`), running that no-grad pass for them even where the
   on-policy shortcut would skip it.
4. `grpo_passk` gives 0 to a group with fewer than two scorable rows (verl raises on a group
   with fewer than two rows; so does rlvr, for `rollout.group_size` < 2). Of tied best rows the
   advantage is 0 whichever is picked.
"""

from __future__ import annotations

from collections.abc import Callable

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

__all__ = ["gdpo", "gpg", "grpo_passk", "optimal_token_baseline", "optimal_token_baseline_multi_turn"]

_OTB_EPS = 1e-8  # verl's, added to the baseline's denominator


def gpg(inp: AdvantageInputs, *, f_norm: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """GPG: A_i = alpha (s_i - mean_g) / f_norm, alpha = n / max(1, #{i: s_i != 0}) over the n
    scorable rows of the batch: the batch-level factor that undoes the dilution by rows with no
    signal; f_norm a constant divisor (verl's, default 1). G = 1: A = alpha s / f_norm."""
    if not f_norm > 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    scores = sequence_scores(inp)
    st = group_stats(scores, inp.group_size)
    ok = scores[~torch.isnan(scores)]
    alpha = ok.numel() / max(int((ok != 0).sum()), 1)
    metrics = group_metrics(st)
    metrics["gpg_alpha"] = float(alpha)
    return to_tokens(alpha * centred_scores(st, inp.group_size) / f_norm, inp.response_mask), metrics


def grpo_passk(inp: AdvantageInputs, *, std_normalize: bool = True,
               adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """verl's best-of-k pass@k: only the group's best row trains, with A = (s_max - s_second) /
    (std_g + adv_eps) (Bessel std over the group; no division with std_normalize=False); every
    other row gets 0, as does the best row of a group whose top two scores tie."""
    if inp.group_size < 2:
        raise ValueError(f"grpo_passk compares the best two completions of a group; needs "
                         f"rollout.group_size >= 2, got {inp.group_size}")
    st = group_stats(sequence_scores(inp), inp.group_size)
    ranked = torch.where(st.valid, st.scores, torch.full_like(st.scores, -torch.inf)).topk(2, dim=1)  # (P, 2)
    gap = ranked.values[:, :1] - ranked.values[:, 1:]  # (P, 1)
    gap = torch.where(st.count >= 2, gap, torch.zeros_like(gap))  # fewer than two scorable rows: no comparison
    if std_normalize:  # a non-zero gap has a non-zero std
        gap = torch.where(gap != 0, gap / (st.std + adv_eps), torch.zeros_like(gap))
    adv = torch.zeros_like(st.scores).scatter(1, ranked.indices[:, :1], gap)
    return to_tokens(adv, inp.response_mask), group_metrics(st)


def _grpo_component(values: Tensor, inp: AdvantageInputs, std_normalize: bool, adv_eps: float) -> Tensor:
    st = group_stats(values, inp.group_size)
    adv = centred_scores(st, inp.group_size)
    if std_normalize and inp.group_size > 1:  # a constant group is 0 already; never 0 / 0
        adv = torch.where(st.constant, adv, adv / (st.std + adv_eps))
    return adv.reshape(-1)


@needs("reward_components", "reward_weights")
def gdpo(inp: AdvantageInputs, *, std_normalize: bool = True, adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GDPO: A = whiten(sum_k w_k GRPO(r_k)) over the batch's valid tokens; GRPO(r_k) is the group
    advantage of reward component k alone, so a rare success in one component is not drowned by
    a common one in another. One component: whiten(GRPO(r)), GRPO rescaled and shifted by one
    batch-wide affine map (nothing is decoupled)."""
    valid = row_valid(inp.rewards)
    comps = inp.reward_components if inp.reward_components is not None else sequence_scores(inp)[:, None]
    comps = torch.where(valid[:, None], comps, torch.full_like(comps, float("nan")))  # unscorable: out of the stats
    weights = inp.reward_weights if inp.reward_weights is not None else torch.ones(comps.shape[1], device=comps.device)
    if weights.numel() != comps.shape[1]:
        raise ValueError(f"reward_weights has {weights.numel()} entries for {comps.shape[1]} reward components")
    mask = working_mask(inp)
    mask = mask.to(torch.promote_types(mask.dtype, comps.dtype)) * valid[:, None]  # promote, never demote
    total = torch.zeros(comps.shape[0], dtype=mask.dtype, device=mask.device)
    for k in range(comps.shape[1]):
        total = total + float(weights[k]) * _grpo_component(comps[:, k], inp, std_normalize, adv_eps).to(mask.dtype)
    total = torch.where(valid, total, torch.zeros_like(total))
    metrics = group_metrics(group_stats(sequence_scores(inp), inp.group_size))
    metrics["reward_components"] = float(comps.shape[1])
    return whiten(total[:, None] * mask, mask, adv_eps=adv_eps), metrics


def _otb_inputs(inp: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """(returns G_t, cumulative path weight W_t, mask), (B, T), NaN rows masked out."""
    if inp.old_logp is None or inp.sum_pi_squared is None:
        raise ValueError("optimal token baseline needs old_logp and sum_pi_squared (B, T) in AdvantageInputs")
    mask = working_mask(inp) * row_valid(inp.rewards)[:, None]
    rewards = token_level_rewards(inp) * mask
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    keep = mask > 0
    w = 1.0 - 2.0 * torch.exp(inp.old_logp.detach().to(mask.dtype)) + inp.sum_pi_squared.detach().to(mask.dtype)
    w_cum = torch.where(keep, w, torch.zeros_like(w)).cumsum(-1)
    return returns, w_cum, mask


def _otb_baselines(returns: Tensor, w_cum: Tensor, mask: Tensor, group_size: int, zero_tail: bool,
                   min_rows: Callable[[Tensor], int]) -> Tensor:
    """(B, T) per-position baselines, one per group; 0 for a group where `min_rows(lengths)` < 2
    (verl's single-turn form counts every row of the group, its multi-turn form the non-empty ones)."""
    B, T = returns.shape
    base = torch.zeros_like(returns)
    lengths = mask.sum(-1)
    for g in range(0, B, group_size):
        rows = slice(g, g + group_size)
        if min_rows(lengths[rows]) < 2:
            continue
        m = mask[rows]
        b = (returns[rows] * w_cum[rows] * m).sum(0) / ((w_cum[rows] * m).sum(0) + _OTB_EPS)
        base[rows] = b
        if zero_tail:
            ordered = lengths[rows].sort().values
            longest, second = ordered[-1], ordered[-2]
            at_max = (lengths[rows] == longest).nonzero()
            if len(at_max) == 1 and longest > second:
                base[g + int(at_max[0]), int(second):] = 0.0
    return base


_CAUSAL_OTB = Requirement({"model.kind": "causal"}, "the optimal token baseline reads sum_v pi_v^2 of the logits, "
                          "which a diffusion likelihood estimator does not have; use model.kind=causal or another "
                          "estimator")


@requires(_CAUSAL_OTB)
@needs("old_logp", "sum_pi_squared")
def optimal_token_baseline(inp: AdvantageInputs, *, zero_tail: bool = True) -> tuple[Tensor, dict[str, float]]:
    """OTB: A_{i,t} = G_{i,t} - B_t with B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + 1e-8) over the
    group's rows at position t (G_t the reward-to-go, W_t the cumulative path weight above)."""
    returns, w_cum, mask = _otb_inputs(inp)
    base = _otb_baselines(returns, w_cum, mask, inp.group_size, zero_tail, min_rows=len)
    adv = (returns - base) * mask
    return adv, {"scorable_frac": row_valid(inp.rewards).float().mean().item()}


@requires(_CAUSAL_OTB)
@needs("old_logp", "sum_pi_squared")
def optimal_token_baseline_multi_turn(inp: AdvantageInputs, *,
                                      zero_tail: bool = True) -> tuple[Tensor, dict[str, float]]:
    """OTB for masks with interior gaps (tool outputs between turns): positions are counted over
    each row's valid tokens only, so the k-th trained token of every row shares a baseline."""
    returns, w_cum, mask = _otb_inputs(inp)
    order = torch.argsort((mask <= 0).to(torch.int8), dim=-1, stable=True)  # valid tokens first, in order
    pack = lambda x: x.gather(1, order)  # noqa: E731
    packed_mask = pack(mask)
    packed_ret = pack(returns) * packed_mask
    base = _otb_baselines(packed_ret, pack(w_cum) * packed_mask, packed_mask, inp.group_size, zero_tail,
                          min_rows=lambda lengths: int((lengths > 0).sum()))
    adv = torch.zeros_like(returns).scatter(1, order, (packed_ret - base) * packed_mask)
    return adv * mask, {"scorable_frac": row_valid(inp.rewards).float().mean().item()}
