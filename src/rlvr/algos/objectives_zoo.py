"""More policy objectives, the rest of verl 0.9.1's policy-loss registry: GMPO, DPPO, DRO, KL-Cov
and Clip-Cov. Same signature and conventions as `objectives` (registered there, in OBJECTIVES):
    fn(logp, old_logp, advantages, mask, **hparams) -> (loss (B, T), metrics dict[str, (B, T)])

Papers (arXiv ids and links in docs/papers.md):
- `gmpo`: "Geometric-Mean Policy Optimization" (Zhao et al. 2025), verl's `geo_mean`.
- `dppo_tv`, `dppo_kl`: DPPO (arXiv 2602.04879), a trust region on the token's probability
  (total variation, or the binary KL of "this token vs the rest") instead of on the ratio.
- `dro`: verl's `dro`, "Direct Reward Optimization with a quadratic log-ratio penalty"
  (Richemond et al. 2024 name the method); the policy term A * logp - beta/2 (log rho)^2.
- `kl_cov`, `clip_cov`: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models" (Cui et al. 2025). Entropy falls fastest through tokens whose log-prob and advantage
  covary most; these two act only on such tokens: KL-Cov adds beta |log rho| to the top-k
  covariance tokens, Clip-Cov detaches the gradient of a random few whose covariance lies in
  [cov_lb, cov_ub].

Hyperparameters (config fields `algo.<name>`):
- `clip_low`, `clip_high`: gmpo: the token log-ratio clip [-clip_low, clip_high] (the paper's
  (e^-0.4, e^0.4)); dppo_*: the divergence thresholds of A <= 0 and A > 0 tokens; clip_cov:
  PPO's ratio clip.
- `ratio_cap` (float): DPPO's truncated importance weight min(rho, cap), detached (20;
  deviation 5).
- `dro_beta` (float, required): weight of the quadratic log-ratio penalty.
- `cov_ratio` (float): fraction of the micro-batch's valid tokens the covariance rule acts on.
- `cov_kl_coef` (float): KL-Cov's beta on |log rho|.
- `cov_lb`, `cov_ub` (float): Clip-Cov's covariance window.
- `log_ratio_clamp` (float): |log rho| is clamped before exp, as everywhere in rlvr.

Deliberate deviations from verl 0.9.1 (bench/parity_verl.py checks the rest agrees):
1. Every log-ratio is clamped to +-log_ratio_clamp (20) before use; verl clamps in DPPO but not
   in geo_mean, kl_cov or clip_cov, where rho = e^{30} overflows float32 on an A < 0 token.
2. `gmpo` returns a per-token loss whose row mean is the sequence loss -A_i r_i (each valid
   token holds it): with `seq_mean_token_mean` it is verl's torch.mean over rows,
   except that verl also counts rows with no valid token in the mean (here num_seqs does not).
3. Padding positions are exactly 0 (`torch.where`), never 0 * inf.
4. KL-Cov / Clip-Cov select tokens within the micro-batch the objective sees, as verl does;
   the selection therefore depends on `trainer.micro_batch_size`. Clip-Cov's random choice
   uses torch's global generator (seeded by the trainer), like verl's torch.randperm.
5. DPPO's `ratio_cap` defaults to 20, the value verl's dppo functions fall back to
   (`config.get("clip_ratio_c", 20.0)`, with a comment recommending a large cap against the
   truncation bias, citing the paper's Section 5.4). A verl run never reaches that fallback: its
   actor config always sets `clip_ratio_c`, the key it shares with dual-clip PPO, to 3.0, so
   verl's effective default is 3.0 (set `algo.ratio_cap: 3.0` for it).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clip_cov", "dppo_kl", "dppo_tv", "dro", "gmpo", "kl_cov"]

Metrics = dict[str, Tensor]


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _clean(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Padding log-probs -> 0 before any arithmetic (deviation 3)."""
    keep = mask > 0
    return (torch.where(keep, logp, torch.zeros_like(logp)),
            torch.where(keep, old_logp.detach(), torch.zeros_like(old_logp)))


def _log_ratio(logp: Tensor, old_logp: Tensor, log_ratio_clamp: float) -> Tensor:
    return (logp - old_logp.detach()).clamp(-log_ratio_clamp, log_ratio_clamp)


def gmpo(logp, old_logp, advantages, mask, *, clip_low: float = 0.4, clip_high: float = 0.4,
         log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """GMPO: sequence loss -A_i exp(mean_t c_{i,t}), the geometric mean of the token ratios, with
    c = sgn(A_t) min(sgn(A_t) l, sgn(A_t) clip(l, -clip_low, clip_high)) and l = log rho: PPO's
    pessimistic clip applied to each log-ratio before the mean, in the direction of the token's
    own advantage A_t (verl's); A_i is the row's mean advantage. With one advantage per row
    (every outcome estimator) sgn(A_t) = sgn(A_i). Each valid token holds -A_i r_i (deviation 2);
    aggregate with `seq_mean_token_mean`."""
    logp, old_logp = _clean(logp, old_logp, mask)
    keep = mask > 0
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)
    adv_tok = torch.where(keep, advantages.detach(), torch.zeros_like(logp))  # (B, T)
    adv = adv_tok.sum(-1, keepdim=True) / lengths  # (B, 1)
    lr = _log_ratio(logp, old_logp, log_ratio_clamp)
    sgn = torch.sign(adv_tok)
    clipped = lr.clamp(-clip_low, clip_high)
    c = sgn * torch.minimum(sgn * lr, sgn * clipped)
    seq_ratio = torch.exp(torch.where(keep, c, torch.zeros_like(c)).sum(-1, keepdim=True) / lengths)  # (B, 1)
    loss = (-adv * seq_ratio).expand_as(logp)
    lr_d = lr.detach()
    metrics = {
        "ratio": _masked(seq_ratio.detach().expand_as(logp), mask),
        "clip_frac_low": _masked(((adv_tok < 0) & (lr_d < -clip_low)).to(logp.dtype), mask),
        "clip_frac_high": _masked(((adv_tok > 0) & (lr_d > clip_high)).to(logp.dtype), mask),
    }
    return _masked(loss, mask), metrics


def _dppo(logp, old_logp, advantages, mask, valid_pos, valid_neg, ratio_cap, lr) -> tuple[Tensor, Metrics]:
    """-A * sg[min(rho, cap)] * logp on tokens inside the trust region (gradient -A min(rho, cap)
    grad logp), 0 on tokens the region rejects."""
    adv = advantages.detach()
    ratio = torch.exp(lr).detach()
    inside = torch.where(adv > 0, valid_pos, valid_neg).detach()
    weight = ratio.clamp(max=ratio_cap)
    loss = torch.where(inside, -adv * weight * logp, torch.zeros_like(logp))
    metrics = {
        "ratio": _masked(ratio, mask),
        "clip_frac_low": _masked(((adv <= 0) & ~inside).to(logp.dtype), mask),
        "clip_frac_high": _masked(((adv > 0) & ~inside).to(logp.dtype), mask),
        "ratio_capped_frac": _masked((inside & (ratio > ratio_cap)).to(logp.dtype), mask),
    }
    return _masked(loss, mask), metrics


def dppo_tv(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
            ratio_cap: float = 20.0, log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """DPPO-Binary-TV: a token trains only while its probability has moved less than the
    threshold in the advantage's direction: p - p_old <= clip_high (A > 0), >= -clip_low (A <= 0)."""
    logp, old_logp = _clean(logp, old_logp, mask)
    move = (torch.exp(logp) - torch.exp(old_logp)).detach()
    lr = _log_ratio(logp, old_logp, log_ratio_clamp)
    return _dppo(logp, old_logp, advantages, mask, move <= clip_high, move >= -clip_low, ratio_cap, lr)


def dppo_kl(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
            ratio_cap: float = 20.0, log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """DPPO-Binary-KL: as dppo_tv with the binary KL of (p_old, 1 - p_old) || (p, 1 - p),
    p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)), as the
    divergence; a token moving against the advantage's direction always trains."""
    logp, old_logp = _clean(logp, old_logp, mask)
    p, p_old = torch.exp(logp.detach()), torch.exp(old_logp)
    bkl = p_old * (old_logp - logp.detach()) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    lr = _log_ratio(logp, old_logp, log_ratio_clamp)
    return _dppo(logp, old_logp, advantages, mask, (bkl <= clip_high) | (p <= p_old),
                 (bkl <= clip_low) | (p >= p_old), ratio_cap, lr)


def dro(logp, old_logp, advantages, mask, *, dro_beta: float, log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """DRO (verl's form): -(A logp - dro_beta/2 (logp - old_logp)^2); gradient
    -(A - dro_beta log rho) grad logp, a REINFORCE step pulled back toward the old policy."""
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"dro_beta must be > 0, got {dro_beta}")
    logp, old_logp = _clean(logp, old_logp, mask)
    lr = _log_ratio(logp, old_logp, log_ratio_clamp)
    loss = -(logp * advantages.detach() - 0.5 * dro_beta * lr.square())
    return _masked(loss, mask), {"ratio": _masked(torch.exp(lr).detach(), mask)}


def _covariance(advantages: Tensor, logp: Tensor, keep: Tensor) -> Tensor:
    """(n,) centred products (A - mean A)(logp - mean logp) over the valid tokens, row-major."""
    a, lp = advantages.detach()[keep], logp.detach()[keep]
    return (a - a.mean()) * (lp - lp.mean())


def kl_cov(logp, old_logp, advantages, mask, *, cov_ratio: float = 2e-4, cov_kl_coef: float = 0.1,
           log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """KL-Cov: -A rho on every token (no clip), plus cov_kl_coef |log rho| on the
    max(1, floor(cov_ratio n)) valid tokens with the largest covariance (A - mean A)(logp - mean logp)."""
    if cov_ratio <= 0:
        raise ValueError(f"cov_ratio must be > 0, got {cov_ratio}")
    logp, old_logp = _clean(logp, old_logp, mask)
    adv = advantages.detach()
    keep = mask > 0
    lr = _log_ratio(logp, old_logp, log_ratio_clamp)
    ratio = torch.exp(lr)
    selected = torch.zeros_like(keep)
    n = int(keep.sum())
    if n:
        top = torch.topk(_covariance(adv, logp, keep), max(1, int(n * cov_ratio))).indices
        selected.view(-1)[keep.view(-1).nonzero(as_tuple=True)[0][top]] = True
    loss = -adv * ratio + torch.where(selected, cov_kl_coef * lr.abs(), torch.zeros_like(lr))
    metrics = {"ratio": _masked(ratio.detach(), mask), "cov_selected_frac": _masked(selected.to(logp.dtype), mask)}
    return _masked(loss, mask), metrics


def clip_cov(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
             cov_ratio: float = 2e-4, cov_lb: float = 1.0, cov_ub: float = 5.0,
             log_ratio_clamp: float = 20.0) -> tuple[Tensor, Metrics]:
    """Clip-Cov: PPO-clip (no dual clip), with the gradient of max(1, floor(cov_ratio n)) tokens
    detached, drawn uniformly among the valid tokens PPO does not already clip whose covariance
    lies strictly inside (cov_lb, cov_ub)."""
    if cov_ratio <= 0:
        raise ValueError(f"cov_ratio must be > 0, got {cov_ratio}")
    logp, old_logp = _clean(logp, old_logp, mask)
    adv = advantages.detach()
    keep = mask > 0
    ratio = torch.exp(_log_ratio(logp, old_logp, log_ratio_clamp))
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    by_ppo = (loss_clipped > loss_unclipped) & keep
    cov = torch.full_like(logp, -torch.inf)
    cov[keep] = _covariance(adv, logp, keep).to(cov.dtype)
    candidates = ((cov > cov_lb) & (cov < cov_ub) & keep & ~by_ppo).nonzero()
    detach = torch.zeros_like(keep)
    if len(candidates):
        pick = candidates[torch.randperm(len(candidates))[: max(int(cov_ratio * int(keep.sum())), 1)]]
        detach[pick[:, 0], pick[:, 1]] = True
    loss = torch.where(detach, torch.zeros_like(logp), torch.maximum(loss_unclipped, loss_clipped))
    r = ratio.detach()
    metrics = {
        "ratio": _masked(r, mask),
        "clip_frac_low": _masked(((adv < 0) & (r < 1.0 - clip_low)).to(logp.dtype), mask),
        "clip_frac_high": _masked(((adv > 0) & (r > 1.0 + clip_high)).to(logp.dtype), mask),
        "cov_selected_frac": _masked(detach.to(logp.dtype), mask),
    }
    return _masked(loss, mask), metrics
