"""Advantage estimators: rewards -> token advantages (B, T), and the ADVANTAGES registry.

Papers (arXiv ids and links in docs/papers.md):
- `grpo`: DeepSeekMath (Shao et al. 2024), group-normalised outcome advantage.
- `dr_grpo`: "Understanding R1-Zero-Like Training" (Liu et al. 2025), no std division.
- `rloo`: "Back to Basics: Revisiting REINFORCE Style Optimization" (Ahmadian et al. 2024).
- `opo`: "On-Policy RL with Optimal Reward Baseline" (Hao et al. 2025), length-weighted baseline.
- `lite_ppo`: "Tricks or Traps? A Deep Dive into RL for LLM Reasoning" (Liu et al. 2025;
  literature/000_*.txt line 27), group mean with batch std.
- `maxrl`, `passk` (binary rewards): see `binary_advantages.py`.
- `reinforce_pp`, `reinforce_pp_baseline`, `remax`, `gae` (token-level): see `returns.py`.
- `lightning` (LightningRL's tokens-per-forward reward): see `lightning.py`.
- `dmpo` (DMPO's centred self-normalised weights toward π_ref·exp(r/β)): see `dmpo.py`.
- `gpg`, `grpo_passk`, `gdpo`, `optimal_token_baseline`, `optimal_token_baseline_multi_turn`:
  see `advantages_zoo.py`.
- `gigpo`, `turn_return` (turn-level, multi-turn agents): see `turn_advantages.py`.

Conventions (see `_advantage_core.py`): rows [p*G:(p+1)*G] share prompt p, B = P*G; NaN reward
= not scorable -> advantage 0 and left out of every statistic. Outcome estimators use the
sequence score s_i = R_i + sum_t m*token_rewards. Every estimator is
`fn(inp, **hparams) -> (advantages (B, T), metrics dict[str, float])`; the advantages are
already multiplied by `response_mask`.

Hyperparameters of the whole registry (config fields `algo.<name>`, same meaning wherever used):
- `std_normalize` (bool): divide by a standard deviation (group std for GRPO and grpo_passk,
  the subset-reward std for pass@k); False keeps only the centring.
- `adv_eps` (float): added to a standard deviation before dividing (never to the variance).
- `pass_k` (int): k of the pass@k objective (`passk`).
- `gamma` (float): discount of token-level returns (`reinforce_pp`, `gae`) or of turn-level ones
  (`gigpo`, `turn_return`).
- `omega` (float): GiGPO's weight of the anchor-state step advantage.
- `lam` (float): GAE lambda (`gae`).
- `zero_tail` (bool): the optimal token baseline's tail rule (see `advantages_zoo.py`).
- `f_norm` (float): GPG's constant divisor of the advantage (see `advantages_zoo.py`).

Deliberate deviations:
1. std is Bessel-corrected (as verl, TRL and OpenRLHF do) and `adv_eps` defaults to verl's 1e-6.
2. `group_size == 1` means "no baseline": A = s for the group-centred estimators (verl's rule
   for GRPO and RLOO; verl's vectorised RLOO returns 0 instead).
3. A group of size G > 1 with fewer than two scorable rewards gets A = 0: it carries no
   comparison, and switching to the G = 1 rule because a verifier failed would change the
   estimator silently. TRL would produce NaN there.
4. A group whose scorable scores are all equal gets exactly 0 (tested with max == min), not
   the tiny 1e-17/(1e-17 + eps) that float round-off in the mean would leave.
5. `lite_ppo` uses the Bessel std of the raw scores of the whole batch (TRL's
   `scale_rewards="batch"` reading); the batch is whatever the caller passes (one process).
6. `opo` weights the baseline by the number of valid tokens L_j (verl's form); a row with no
   valid token has weight 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algos._advantage_core import (
    AdvantageInputs,
    GroupStats,
    centred_scores,
    group_metrics,
    group_stats,
    sequence_scores,
    to_tokens,
)
from rlvr.algos._registry import lookup
from rlvr.algos.advantages_zoo import (
    gdpo,
    gpg,
    grpo_passk,
    optimal_token_baseline,
    optimal_token_baseline_multi_turn,
)
from rlvr.algos.binary_advantages import maxrl, passk
from rlvr.algos.dmpo import dmpo
from rlvr.algos.lightning import lightning
from rlvr.algos.returns import gae, gae_returns, reinforce_pp, reinforce_pp_baseline, remax
from rlvr.algos.turn_advantages import gigpo, turn_return

__all__ = [
    "ADVANTAGES",
    "AdvantageInputs",
    "GroupStats",
    "dr_grpo",
    "gae",
    "gae_returns",
    "get_advantage",
    "gigpo",
    "group_stats",
    "grpo",
    "grpo_passk",
    "lite_ppo",
    "maxrl",
    "opo",
    "passk",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "rloo",
    "turn_return",
]

Estimator = Callable[..., tuple[Tensor, dict[str, float]]]


def grpo(
    inp: AdvantageInputs, *, std_normalize: bool = True, adv_eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GRPO: A_i = (s_i - mean_g) / (std_g + adv_eps), broadcast to the completion tokens.

    `std_normalize=False` gives s_i - mean_g (the Dr.GRPO advantage). G = 1: A = s.
    """
    st = group_stats(sequence_scores(inp), inp.group_size)
    adv = centred_scores(st, inp.group_size)
    if std_normalize and inp.group_size > 1:
        adv = adv / (st.std + adv_eps)
    return to_tokens(adv, inp.response_mask), group_metrics(st)


def dr_grpo(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """Dr.GRPO: A_i = s_i - mean_g (no std division; the length fix lives in the aggregation,
    `seq_mean_token_sum_norm`)."""
    st = group_stats(sequence_scores(inp), inp.group_size)
    return to_tokens(centred_scores(st, inp.group_size), inp.response_mask), group_metrics(st)


def rloo(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """RLOO: A_i = s_i - mean of the other scorable scores of the group.

    Equal to n/(n-1) * (s_i - mean_g) with n scorable scores in the group. G = 1: A = s.
    """
    st = group_stats(sequence_scores(inp), inp.group_size)
    adv = centred_scores(st, inp.group_size)
    if inp.group_size > 1:
        adv = adv * st.count / (st.count - 1).clamp(min=1)
    return to_tokens(adv, inp.response_mask), group_metrics(st)


def opo(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """OPO: A_i = s_i - b_g with the length-weighted baseline b_g = sum_j L_j s_j / sum_j L_j.

    For an exactly on-policy update OPO shows this baseline minimises gradient variance when the
    gradient norm of a sequence grows with its length. G = 1: A = s.
    """
    st = group_stats(sequence_scores(inp), inp.group_size)
    G = inp.group_size
    lengths = inp.response_mask.sum(dim=-1).view(-1, G).to(st.scores.dtype)  # (P, G)
    w = torch.where(st.valid, lengths, torch.zeros_like(lengths))
    baseline = (w * st.scores).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp(min=1e-12)
    if G == 1:
        adv = st.scores
    else:
        adv = torch.where(st.valid & ~st.constant, st.scores - baseline, torch.zeros_like(st.scores))
    return to_tokens(adv, inp.response_mask), group_metrics(st)


def lite_ppo(inp: AdvantageInputs, *, adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """LitePPO advantage: A_i = (s_i - mean_g) / (std_batch + adv_eps).

    Group mean for the baseline, but the std of every scorable score in the batch: groups with
    a small spread are not blown up (the "Tricks or Traps" finding for sparse binary rewards).
    Pair with `token_mean` aggregation for the paper's LitePPO.
    """
    scores = sequence_scores(inp)
    st = group_stats(scores, inp.group_size)
    flat = scores[~torch.isnan(scores)]
    batch_std = flat.std() if flat.numel() >= 2 else torch.zeros((), dtype=scores.dtype)
    adv = centred_scores(st, inp.group_size) / (batch_std + adv_eps)
    metrics = group_metrics(st)
    metrics["batch_std"] = float(batch_std)
    return to_tokens(adv, inp.response_mask), metrics


ADVANTAGES: dict[str, Estimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "opo": opo,
    "lite_ppo": lite_ppo,
    "maxrl": maxrl,
    "passk": passk,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
    "gae": gae,
    "gpg": gpg,
    "grpo_passk": grpo_passk,
    "gdpo": gdpo,
    "lightning": lightning,
    "dmpo": dmpo,
    "optimal_token_baseline": optimal_token_baseline,
    "optimal_token_baseline_multi_turn": optimal_token_baseline_multi_turn,
    "gigpo": gigpo,
    "turn_return": turn_return,
}


def get_advantage(name: str) -> Estimator:
    """The advantage estimator registered as `name`; ValueError listing valid names otherwise."""
    return lookup(ADVANTAGES, "advantage", name)
