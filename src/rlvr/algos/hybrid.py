"""Hybrid on-/off-policy objectives: losses on expert rows, their mixing weights, and NFT.

Papers (arXiv ids and links in docs/papers.md):
- `sft`: plain negative log-likelihood of expert tokens (the SFT term of SFT-then-RL, and
  CHORD-μ's auxiliary loss).
- `chord_phi`: CHORD, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised
  Fine-Tuning and Reinforcement Learning via Dynamic Weighting" (Zhang et al. 2025;
  literature/001_*.txt line 105): the token-wise weight φ(p) = p (1 − p) on the SFT loss, with
  p = sg[π_θ(y_t)], so tokens the policy already knows (p ≈ 1) or finds wildly unlikely (p ≈ 0)
  barely move it. `mix_weights` + `chord_mu` give the global coefficient μ:
  L = (1 − μ) L_RL + μ L_SFT.
- `rlplus`: RL-PLUS, "RL-PLUS: Countering Capability Boundary Collapse of LLMs in Reinforcement
  Learning with Hybrid-policy Optimization" (Dong et al. 2025; literature/001_*.txt line 77):
  multiple importance sampling on external data, ratio π_θ / ((π_old + π_ω)/2), times the
  exploration-based advantage A · (1 − sg[π_θ])^γ.
- `main`: no loss of its own; the expert rows go through the main objective (`algo.objective`).
- `nft`: NFT, "Bridging Supervised Learning and Reinforcement Learning in Math Reasoning"
  (Chen et al. 2025; literature/001_*.txt line 219), negative-aware fine-tuning: maximise
  log R on positives and log((1 − r̂ R)/(1 − r̂)) on negatives, R = π_θ/π_old, r̂ the group's
  accuracy (an on-policy objective of `OBJECTIVES`).

Signature of every expert objective (`EXPERT_OBJECTIVES`):
    fn(logp, old_logp, expert_logp, advantages, mask, **hparams) -> (loss (B, T), metrics)
`logp` (B, T) carries the gradient; `old_logp` is the policy before this update on the expert
tokens (= sg[logp] for one update per batch); `expert_logp` (B, T) is the expert's behaviour
log-prob of its own tokens, 0 (probability 1) for a deterministic expert such as Countdown's exact
solutions; `advantages` (B, T) the expert rows' advantages (`expert_advantages`). Zero outside
`mask`. Metric tensors are per-token detached floats, as for `OBJECTIVES`.

Hyperparameters (config fields `expert.<name>` for expert objectives, `algo.<name>` for NFT):
- `rlplus_gamma` (float): γ of RL-PLUS's exploration weight (1 − p)^γ.
- `nft_eps` (float): ε of NFT's clip max((1 − r̂ R)/(1 − r̂), ε) on the negative likelihood.
- `nft_weight` (str): NFT's prompt weight ω(r̂): `grpo` √((1 − r̂)/r̂) (the weight under which
  NFT's on-policy gradient is GRPO's with population std), `one`, or `hard` (1 − r̂).
- `log_ratio_clamp` (float): |log R| is clamped to this before exp in `nft` (overflow guard).
- `group_size` (int): rows per prompt group (`nft` computes r̂ per group); from
  `rollout.group_size`.

Deliberate deviations:
1. `nft` reads correctness from the sign of the advantage: a row is positive when its (mean)
   advantage is > 0. With binary rewards and any centred advantage (GRPO, Dr.GRPO, RLOO) this is
   the verifier's verdict; with Countdown's 0.1 partial credit a parseable wrong answer in a
   group of unparseable ones counts as positive. An all-correct group (A = 0) therefore counts as
   all-negative and gets no gradient, where the paper would fine-tune on it (ω = 0 under `grpo`
   weighting, so the two agree there).
2. `nft` leaves the positive term unclipped (−log R, SFT on positives); the ε default 0.1 is
   ours, the abstract does not give one.
3. `rlplus` uses π_ω = exp(expert_logp), which is 1 for a deterministic expert (the papers'
   experts are unknown LLMs whose log-probs were not stored; LUFFY makes the same choice). The
   MIS ratio is not clipped (with π_ω = 1 it is at most 2).
4. `rlplus` applies the exploration weight to expert rows only; on-policy rows keep the main
   objective. Its γ default 1.0 is ours.
5. The expert rows' advantage (`expert_advantages`) is standardised against the step's whole
   batch of rewards (on-policy rows and expert rows together), not against a group of the same
   prompt: expert problems come from their own pool, so no on-policy group shares their prompt.
   `expert.advantage=source` standardises them against the expert rows only instead (ERILS,
   `rlvr.algos.erils.per_source_advantages`).
6. `chord_mu` decays μ linearly from `weight` to `weight_final` over `decay_steps` steps, then
   holds it (CHORD's schedule shape is a warm-up-then-decay; a linear ramp is our choice).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

Metrics = dict[str, Tensor]

NFT_WEIGHTS = ("grpo", "one", "hard")
"""NFT's prompt weights ω(r̂) (`algo.nft_weight`)."""


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _clean(logp: Tensor, mask: Tensor) -> Tensor:
    """Padding log-probs -> 0 before any arithmetic, so junk there never reaches the gradient."""
    return torch.where(mask > 0, logp, torch.zeros_like(logp))


def sft(logp: Tensor, old_logp: Tensor, expert_logp: Tensor | None, advantages: Tensor,
        mask: Tensor) -> tuple[Tensor, Metrics]:
    """Negative log-likelihood −logp of every expert token. Shapes (B, T)."""
    logp = _clean(logp, mask)
    return _masked(-logp, mask), {"prob": _masked(logp.detach().exp(), mask)}


def chord_phi(logp: Tensor, old_logp: Tensor, expert_logp: Tensor | None, advantages: Tensor,
              mask: Tensor) -> tuple[Tensor, Metrics]:
    """CHORD-φ: −φ(p) logp with φ(p) = p (1 − p), p = sg[exp(logp)]. Its gradient is
    −p (1 − p) ∇logp: largest for tokens the policy gives probability 1/2. Shapes (B, T)."""
    logp = _clean(logp, mask)
    p = logp.detach().exp()
    phi = p * (1.0 - p)
    return _masked(-phi * logp, mask), {"prob": _masked(p, mask), "chord_phi": _masked(phi, mask)}


def rlplus(logp: Tensor, old_logp: Tensor, expert_logp: Tensor | None, advantages: Tensor, mask: Tensor, *,
           rlplus_gamma: float = 1.0) -> tuple[Tensor, Metrics]:
    """RL-PLUS on external data: −r_m · A · (1 − sg[p])^γ with the multiple-importance-sampling
    ratio r_m = π_θ / ((π_old + π_ω) / 2) (differentiable in logp), p = sg[π_θ]. Shapes (B, T)."""
    logp = _clean(logp, mask)
    old = _clean(old_logp.detach(), mask)
    expert = torch.zeros_like(logp) if expert_logp is None else _clean(expert_logp.detach(), mask)
    behaviour = 0.5 * (old.exp() + expert.exp())  # the mixture both samplers draw from
    ratio = logp.exp() / behaviour
    explore = (1.0 - logp.detach().exp()).clamp(min=0.0) ** rlplus_gamma
    adv = advantages.detach() * explore
    return _masked(-ratio * adv, mask), {"mis_ratio": _masked(ratio.detach(), mask),
                                         "explore_weight": _masked(explore, mask)}


def main(logp: Tensor, old_logp: Tensor, expert_logp: Tensor | None, advantages: Tensor,
         mask: Tensor) -> tuple[Tensor, Metrics]:
    """`expert.objective=main`: the expert rows are trained by `algo.objective` itself, like the
    on-policy rows (an objective that learns from any rows, such as ShiQ, needs no second loss).
    Never called: the builder binds no separate expert loss for this entry."""
    raise TypeError("expert.objective=main has no loss of its own: the update step applies algo.objective")


EXPERT_OBJECTIVES: dict[str, Callable[..., tuple[Tensor, Metrics]]] = {
    "sft": sft,
    "chord_phi": chord_phi,
    "rlplus": rlplus,
    "main": main,
}


def chord_mu(step: int, *, weight: float, weight_final: float | None, decay_steps: int) -> float:
    """CHORD's global coefficient μ at `step` (1-based): `weight` decayed linearly to
    `weight_final` over `decay_steps` steps, then held (deviation 6); constant when either is unset."""
    if weight_final is None or decay_steps <= 0:
        return weight
    progress = min(max(step - 1, 0) / decay_steps, 1.0)
    return weight + (weight_final - weight) * progress


def mix_weights(expert: Tensor, mu: float, *, keep_onpolicy: bool = False,
                units: Tensor | None = None) -> Tensor:
    """(B,) per-row weights that turn one aggregation over all rows into
    (1 − μ) L_on + μ L_expert (or L_on + μ L_expert with `keep_onpolicy`), each term normalised
    over its own rows as if it were aggregated alone.

    `expert` (B,) bool; `units` (B,) what the aggregation divides by per row (1 per row for the
    seq-mean aggregations, the token count for `token_mean`); default one per row. A side with no
    rows gets weight 0 and the other keeps its own normalisation."""
    units = torch.ones(expert.shape, dtype=torch.float32) if units is None else units.float()
    total = units.sum()
    on_units, ex_units = units[~expert].sum(), units[expert].sum()
    on_share = 1.0 if keep_onpolicy else 1.0 - mu
    w_on = on_share * total / on_units if on_units > 0 else torch.zeros(())
    w_ex = mu * total / ex_units if ex_units > 0 else torch.zeros(())
    return torch.where(expert, w_ex, w_on).float()


def expert_advantages(expert_rewards: Tensor, onpolicy_rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """(E,) advantage of each expert row: (R_e − mean) / (std + eps) over all the step's scorable
    rewards, on-policy and expert together (deviation 5; Bessel std, as rlvr's GRPO). Fewer than
    two scorable rewards, or NaN expert rewards, give 0."""
    pooled = torch.cat([onpolicy_rewards.double(), expert_rewards.double()])
    scored = pooled[~torch.isnan(pooled)]
    if len(scored) < 2:
        return torch.zeros_like(expert_rewards, dtype=torch.float32)
    adv = (expert_rewards.double() - scored.mean()) / (scored.std() + eps)
    return torch.nan_to_num(adv, nan=0.0).float()


def nft_prompt_weight(accuracy: Tensor, nft_weight: str) -> Tensor:
    """ω(r̂) for r̂ in [0, 1]: `grpo` √((1 − r̂)/r̂) (0 where r̂ = 0: no positive to weigh),
    `one` 1, `hard` 1 − r̂."""
    if nft_weight == "grpo":
        return torch.where(accuracy > 0, ((1.0 - accuracy) / accuracy.clamp(min=1e-12)).sqrt(),
                           torch.zeros_like(accuracy))
    if nft_weight == "one":
        return torch.ones_like(accuracy)
    if nft_weight == "hard":
        return 1.0 - accuracy
    raise ValueError(f"nft_weight must be one of {', '.join(NFT_WEIGHTS)}, got {nft_weight!r}")


def nft(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, group_size: int = 1,
        nft_eps: float = 0.1, nft_weight: str = "grpo", log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """NFT per-token loss −ω(r̂) [y log R + (1 − y) log max((1 − r̂ R)/(1 − r̂), ε)], R = π_θ/π_old,
    y = 1 on positive rows (deviation 1), r̂ = the fraction of positive rows in the row's group of
    `group_size`. On-policy (R = 1) its gradient is −ω ∇logp on positives and
    +ω r̂/(1 − r̂) ∇logp on negatives: with ω = √((1 − r̂)/r̂) exactly GRPO's (population std).
    Shapes (B, T), B a multiple of `group_size`. Aggregate with `token_mean` as the paper does."""
    if logp.shape[0] % group_size:
        raise ValueError(f"nft: {logp.shape[0]} rows are not whole groups of {group_size}")
    keep = mask > 0
    logp = torch.where(keep, logp, torch.zeros_like(logp))
    old = torch.where(keep, old_logp.detach(), torch.zeros_like(logp))
    seq_adv = (advantages.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    positive = (seq_adv > 0).to(logp.dtype)  # (B,)
    accuracy = positive.view(-1, group_size).mean(-1).repeat_interleave(group_size)  # r̂ per row
    log_ratio = (logp - old).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = log_ratio.exp()
    acc = accuracy[:, None]
    # The implicit negative policy's likelihood ratio (1 − r̂R)/(1 − r̂); undefined for r̂ = 1 (no negatives).
    neg_ratio = (1.0 - acc * ratio) / (1.0 - acc).clamp(min=1e-12)
    clipped = neg_ratio < nft_eps
    neg_term = torch.where(clipped, torch.full_like(neg_ratio, math.log(nft_eps)),
                           neg_ratio.clamp(min=nft_eps).log())
    pos = positive[:, None]
    weight = nft_prompt_weight(accuracy, nft_weight)[:, None]
    loss = -weight * (pos * log_ratio + (1.0 - pos) * neg_term)
    metrics = {"ratio": _masked(ratio.detach(), mask),
               "nft_neg_clip_frac": _masked((clipped & (pos == 0)).float(), mask),
               "nft_accuracy": _masked(acc.expand_as(logp), mask)}
    return _masked(loss, mask), metrics

