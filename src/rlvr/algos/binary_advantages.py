"""Advantages for pass/fail rewards: maximum-likelihood RL (`maxrl`) and pass@k (`passk`).

Papers (arXiv ids and links in docs/papers.md):
- `maxrl`: "Maximum Likelihood Reinforcement Learning" (MaxRL; literature/000_*.txt line 195).
- `passk`: "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
  Reasoning Models" (Chen et al. 2025), its analytic advantage for binary rewards.

MaxRL, derived. For a prompt with success probability p = E_{y~pi}[r], r in {0, 1}:
- RL maximises p; its gradient is grad p = E[r grad log pi(y)].
- Maximum likelihood maximises log p; its gradient is grad p / p = E[grad log pi(y) | r = 1],
  the average score of the *successful* samples. Small p weighs more: hard prompts count.
- log p = log(1 - (1 - p)) = -sum_{k>=1} (1 - p)^k / k. Truncating at order N gives
  J_N = -sum_{k=1}^{N} (1 - p)^k / k, with grad J_N = grad p * (1 - (1 - p)^N) / p: J_1 = p - 1
  is RL, J_inf = log p is ML. That is the compute-indexed family of the abstract, N = samples.
- With N samples and K = sum_i r_i successes, g = (1/K) sum_{i: r_i=1} grad log pi(y_i)
  (0 if K = 0) is unbiased for grad J_N: given K = k > 0 the successes are iid from
  pi(. | success), so E[g] = (grad p / p) * P(K > 0) = (grad p / p) * (1 - (1 - p)^N).
- Subtracting the control variate (1/N) sum_i grad log pi(y_i) (mean 0 over ALL outcomes,
  including K = 0) keeps it unbiased. Written as (1/N) sum_i A_i grad log pi(y_i), i.e. in the
  per-sequence-mean convention every other estimator here uses, with p_hat = K / N:
      A_i = r_i / p_hat - 1 = (r_i - p_hat) / p_hat
  (successes get (1 - p_hat)/p_hat, failures get -1). Compare GRPO's (r - p_hat)/std: MaxRL
  divides by the success rate, not by sqrt(p_hat (1 - p_hat)).
- Limit cases: p_hat = 1 -> A = 0 for every row (log p is already maximal). p_hat = 0 -> A = -1
  for every row: the r_i/p_hat term is 0 (no success to imitate) but the control variate stays,
  which is what keeps E[g] = grad J_N exactly (tests/algos check this by enumeration). In
  expectation that push-down is useful, not noise: E[-grad log pi(y) | r = 0] = grad p / (1 - p).
  N = 1 gives A = r - 1 in {-1, 0}, an unbiased RL gradient; N -> inf gives grad log p.

Hyperparameters: `pass_k` (int, k of pass@k), `std_normalize`, `adv_eps` (as in `advantages`).

Deliberate deviations:
1. `maxrl` accepts graded rewards in [0, 1] (p_hat = their mean, the same formula) and raises
   on rewards outside [0, 1] or on `token_rewards`: both estimators are defined for pass/fail
   outcomes, and a KL penalty folded into the score would break that.
2. `maxrl` applies the formula to any group with at least one scorable row (also G = 1), as the
   derivation holds for every N >= 1; the G = 1 "A = R" rule of `advantages` does not apply.
3. `passk` takes k = min(pass_k, n) with n scorable rows; groups with n < 2 or zero subset-reward
   std get 0. The std is the population std over all C(n, k) subsets, as in the paper.
4. verl's `grpo_passk` (only the best sample gets s_max - s_second) is a different estimator,
   registered under its own name (`advantages_zoo.grpo_passk`); `passk` is the paper's
   analytic form.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.algos._advantage_core import AdvantageInputs, group_metrics, group_stats, to_tokens, wide

__all__ = ["maxrl", "passk"]


def _binary_scores(inp: AdvantageInputs, name: str, *, strict: bool) -> Tensor:
    if inp.token_rewards is not None:
        raise ValueError(f"{name} is defined for pass/fail rewards; token_rewards are not supported")
    r = inp.rewards.detach().to(wide(inp.rewards))
    ok = r[~torch.isnan(r)]
    bad = (ok != 0) & (ok != 1) if strict else (ok < 0) | (ok > 1)
    if bad.any():
        kind = "in {0, 1}" if strict else "in [0, 1]"
        raise ValueError(f"{name} needs rewards {kind}; got {ok[bad][:4].tolist()}")
    return r


def maxrl(inp: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """MaxRL: A_i = r_i / p_hat - 1 with p_hat the group's success rate (derivation above).

    p_hat = 0 -> A = -1 on every scorable row; p_hat = 1 -> A = 0. NaN rows get 0.
    """
    st = group_stats(_binary_scores(inp, "maxrl", strict=False), inp.group_size)
    p_hat = st.mean  # (P, 1), over scorable rows
    ratio = torch.where(p_hat > 0, st.scores / p_hat.clamp(min=1e-12), torch.zeros_like(st.scores))
    adv = torch.where(st.valid, ratio - 1.0, torch.zeros_like(ratio))
    metrics = group_metrics(st)
    metrics["all_fail_group_frac"] = ((p_hat == 0) & (st.count > 0)).float().mean().item()
    return to_tokens(adv, inp.response_mask), metrics


def _passk_group(n_pos: int, n: int, k: int) -> tuple[float, float, float]:
    """(mean subset reward, A for a success, A for a failure), unnormalised, for one group."""
    n_neg = n - n_pos
    mean = 1.0 - math.comb(n_neg, k) / math.comb(n, k)  # P(a random k-subset holds a success)
    # a failure's subsets: the fraction of k-subsets containing it that hold no success
    all_fail = math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1) if n_neg > 0 else 0.0
    return mean, 1.0 - mean, 1.0 - mean - all_fail


def passk(
    inp: AdvantageInputs, *, pass_k: int = 4, std_normalize: bool = True, adv_eps: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """Pass@k advantage for binary rewards: the group reward of a k-subset is max(r), and each
    response's advantage is the mean of (subset reward - mean) / std over the k-subsets that
    contain it. Closed form with n scorable rows, n_neg failures, R_bar = 1 - C(n_neg,k)/C(n,k),
    sigma = sqrt(R_bar (1 - R_bar)):
        success: (1 - R_bar) / sigma
        failure: (1 - R_bar - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / sigma
    k = 1 is GRPO with the biased std.
    """
    if pass_k < 1:
        raise ValueError(f"pass_k must be >= 1, got {pass_k}")
    st = group_stats(_binary_scores(inp, "passk", strict=True), inp.group_size)
    adv = torch.zeros_like(st.scores)
    counts = st.count[:, 0].long().tolist()
    positives = (st.scores * st.valid).sum(dim=1).long().tolist()
    for p, (n, n_pos) in enumerate(zip(counts, positives)):
        if n < 2:
            continue
        mean, a_pos, a_neg = _passk_group(n_pos, n, min(pass_k, n))
        sigma = math.sqrt(max(mean * (1.0 - mean), 0.0))
        if sigma == 0.0:
            continue
        scale = 1.0 / (sigma + adv_eps) if std_normalize else 1.0
        row = torch.where(st.scores[p] > 0, a_pos * scale, a_neg * scale)
        adv[p] = torch.where(st.valid[p], row, torch.zeros_like(row))
    return to_tokens(adv, inp.response_mask), group_metrics(st)
