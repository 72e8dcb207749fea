"""Policy objectives: per-token policy loss (B, T), before aggregation.

Papers (arXiv ids and links in docs/papers.md):
- `ppo_clip`: PPO (Schulman et al. 2017); asymmetric "clip-higher" from DAPO (Yu et al. 2025;
  literature/000_*.txt line 93); dual-clip from "Mastering Complex Control in MOBA Games with
  Deep Reinforcement Learning" (Ye et al. 2020).
- `gspo`: "Group Sequence Policy Optimization" (Zheng et al. 2025), length-normalised sequence
  ratio.
- `cispo`: MiniMax-M1 (MiniMax 2025), clipped importance-sampling weight, gradient kept.
- `sapo`: "Soft Adaptive Policy Optimization" (Qwen, Gao et al. 2025), a smooth gate instead of
  the hard clip. Not the "Swarm sAmpling Policy Optimization" of literature/001_*.txt line 181,
  which shares the acronym.
- `reinforce`: REINFORCE (Williams 1992), the plain policy-gradient surrogate -A * logp.
- `gmpo`, `dppo_tv`, `dppo_kl`, `dro`, `kl_cov`, `clip_cov`: see `objectives_zoo.py`.
- `wd1`: "wd1: Weighted Policy Optimization for Reasoning in Diffusion Language Models"
  (Tang et al. 2025), ratio-free group-softmax weighted likelihood; written for dLLM
  likelihood estimates but model-agnostic.
- `nft`: negative-aware fine-tuning (Chen et al. 2025), defined, with its hyperparameters and
  deviations, in `rlvr.algos.hybrid` and registered here.
- `bgpo`: BGPO (Lin et al. 2025), the per-draw linear bound on the ELBO ratio of a masked-diffusion
  LM, defined in `rlvr.algos.dllm_objectives`; it reads the estimator's draws (`needs`).
- `gdsd`: GDSD (arXiv:2605.29398), squared log-ratio distillation toward the advantage-tilted
  self-teacher log π_old + ψ·A, defined in `rlvr.algos.dllm_objectives`; any likelihood estimator.
- `dipo`: DiPO (DiRL, Zhu et al. 2025), PPO-clip on each denoising step's joint ratio of the
  `trace` estimator's values, defined in `rlvr.algos.dllm_objectives`; it reads the commit steps (`needs`).
- `reverse_kl_distill`: on-policy distillation, token-level reverse KL to a teacher (`model.teacher_path`),
  defined in `rlvr.algos.distill`; it reads the reference's log-probs (`needs`).
- `shiq`: ShiQ (Clavier et al. 2025), token-wise off-policy Bellman loss on logits read as
  Q-values, defined in `rlvr.algos.offpolicy`; it also takes data keywords (`needs`).

Signature of every objective:
    fn(logp, old_logp, advantages, mask, **hparams) -> (loss (B, T), metrics dict[str, (B, T)])
`logp` (B, T) carries the gradient; `old_logp` (B, T) is the policy the ratio is taken against
(detached here whatever the caller passes); `advantages` (B, T) are detached too; `mask` (B, T)
is float 0/1. The loss is zero outside the mask. Metric tensors are detached per-token floats;
the caller takes their masked mean with the same mask. Every objective reports "ratio".

Hyperparameters (config fields `algo.<name>`, same meaning wherever used; the defaults below are
each objective's own and are what a null config field resolves to):
- `clip_low`, `clip_high` (float): half-widths of the ratio clip, [1 - clip_low, 1 + clip_high]
  (`ppo_clip`, `gspo` on the sequence ratio, `cispo` on the detached weight).
- `dual_clip` (float | None): c > 1 caps a negative-advantage token's loss at c * |A|.
- `log_ratio_clamp` (float): |log ratio| is clamped to this before exp (overflow guard).
- `tau_pos`, `tau_neg` (float): SAPO gate temperatures for A > 0 and A <= 0.
- `group_size` (int): G, rows per prompt group (`wd1` takes its softmax over each group);
  the trainer sets it from `rollout.group_size`.
- `wd1_psi` (float): wd1's inverse temperature ψ of the advantage softmax.
- `gdsd_psi` (float): GDSD's guidance scale ψ of the self-teacher log π_old + ψ·A.
- `ratio_cap`, `dro_beta`, `cov_ratio`, `cov_kl_coef`, `cov_lb`, `cov_ub`: DPPO's weight cap, DRO's
  penalty, the KL-Cov / Clip-Cov token selection (see `objectives_zoo.py`).

Deliberate deviations:
1. Dual-clip is off unless `dual_clip` is given (verl always applies it with c = 3).
2. Padding positions are set to exactly 0 with `torch.where`, so junk log-probs there (inf, NaN)
   cannot leak into the sum through 0 * inf.
3. Metrics are per-token indicators; "clip_frac_low" counts tokens whose gradient the lower clip
   removes (A < 0 and rho < 1 - clip_low), "clip_frac_high" the upper (A > 0 and
   rho > 1 + clip_high), "clip_frac_dual" those where the dual clip binds (A < 0, rho > c).
   For `cispo` (which never removes a gradient) they count tokens whose weight was clipped.
4. `gspo` clamps the sequence log-ratio with `log_ratio_clamp` (verl clamps at 10) and has no
   dual clip; its default clip widths are the paper's 3e-4 / 4e-4.
5. `cispo` uses verl's two-sided form -sg[clip(rho, 1-clip_low, 1+clip_high)] * A * logp; TRL's
   absolute cap min(rho, c) is clip_low >= 1, clip_high = c - 1. Defaults: no lower clip
   (clip_low=1.0, as MiniMax-M1) and clip_high=4.0 (TRL's recommended cap 5).
6. `sapo` uses tau_neg for A <= 0 (A = 0 gives zero loss either way).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algos._registry import lookup
from rlvr.algos.distill import reverse_kl_distill
from rlvr.algos.dllm_objectives import bgpo, dipo, gdsd
from rlvr.algos.hybrid import nft
from rlvr.algos.objectives_zoo import clip_cov, dppo_kl, dppo_tv, dro, gmpo, kl_cov
from rlvr.algos.offpolicy import shiq


def wd1(logp, old_logp, advantages, mask, *, group_size: int = 1, wd1_psi: float = 1.0):
    """wd1 (ratio-free weighted likelihood): loss per token (−w⁺_i + w⁻_i) · logp, with
    w± = softmax over the group of ±ψ A_i. Aggregate with `seq_mean_token_sum` to get the paper's
    (1/G) Σ_i (−w⁺_i + w⁻_i) Σ_t logp. `old_logp` is unused (no ratio). Shapes (B, T), B = P·G.

    Deviation: the softmax runs over each group of `group_size` rows (the released code runs it
    over the per-device batch, which is one group only when the two sizes agree).
    """
    adv = advantages.detach()
    seq_adv = (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    grouped = seq_adv.view(-1, group_size)
    w_pos = (wd1_psi * grouped).softmax(-1).reshape(-1)
    w_neg = (-wd1_psi * grouped).softmax(-1).reshape(-1)
    weight = (-w_pos + w_neg)[:, None]
    loss = torch.where(mask > 0, weight * logp, torch.zeros_like(logp))
    return loss, {"wd1_weight": torch.where(mask > 0, weight.expand_as(logp), torch.zeros_like(logp))}


__all__ = ["ADVANTAGE_FREE", "OBJECTIVES", "cispo", "get_objective", "gspo", "ppo_clip", "reinforce", "sapo"]

Metrics = dict[str, Tensor]


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, x, torch.zeros_like(x))


def _clean(logp: Tensor, old_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Replace padding log-probs by 0 before any arithmetic (deviation 2): the gradient that
    reaches a padding position is then exactly 0, never 0 * NaN."""
    keep = mask > 0
    clean_logp = torch.where(keep, logp, torch.zeros_like(logp))
    clean_old = torch.where(keep, old_logp.detach(), torch.zeros_like(old_logp))
    return clean_logp, clean_old


def _ratio(logp: Tensor, old_logp: Tensor, log_ratio_clamp: float) -> Tensor:
    """rho = exp(clamp(logp - old_logp)), differentiable in logp."""
    log_ratio = (logp - old_logp.detach()).clamp(-log_ratio_clamp, log_ratio_clamp)
    return torch.exp(log_ratio)


def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Metrics]:
    """PPO-clip: max(-A*rho, -A*clip(rho, 1-clip_low, 1+clip_high)), with optional dual clip
    min(., -c*A) for A < 0. Shapes (B, T)."""
    adv = advantages.detach()
    logp, old_logp = _clean(logp, old_logp, mask)
    ratio = _ratio(logp, old_logp, log_ratio_clamp)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    r = ratio.detach()
    dual_active = torch.zeros_like(r, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss_dual = -adv * dual_clip
        dual_active = (adv < 0) & (loss_dual < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, loss_dual), loss)
    low = (adv < 0) & (r < 1.0 - clip_low)
    high = (adv > 0) & (r > 1.0 + clip_high)
    metrics = {
        "ratio": _masked(r, mask),
        "clip_frac_low": _masked(low.float(), mask),
        "clip_frac_high": _masked(high.float(), mask),
        "clip_frac_dual": _masked(dual_active.float(), mask),
    }
    return _masked(loss, mask), metrics


def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Metrics]:
    """GSPO: the PPO-clip loss on the length-normalised sequence ratio
    s_i = exp(mean_t over valid tokens of (logp - old_logp)).

    Token surrogate log s_{i,t} = sg[log s_i] + logp_t - sg[logp_t]: its value is s_i on every
    token and its gradient is s_i * grad logp_t, so with `seq_mean_token_mean` the gradient is
    -A_i s_i (1/L_i) sum_t grad logp_t (the paper's). Shapes (B, T); A should be per sequence.
    """
    adv = advantages.detach()
    logp, old_logp = _clean(logp, old_logp, mask)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1)
    diff = torch.where(mask > 0, logp - old_logp.detach(), torch.zeros_like(logp))
    seq_log_ratio = (diff.sum(dim=-1, keepdim=True) / lengths).clamp(-log_ratio_clamp, log_ratio_clamp)
    tok_log_ratio = seq_log_ratio.detach() + logp - logp.detach()
    ratio = torch.exp(tok_log_ratio)  # (B, T), value s_i
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    r = ratio.detach()
    metrics = {
        "ratio": _masked(r, mask),
        "clip_frac_low": _masked(((adv < 0) & (r < 1.0 - clip_low)).float(), mask),
        "clip_frac_high": _masked(((adv > 0) & (r > 1.0 + clip_high)).float(), mask),
    }
    return _masked(loss, mask), metrics


def cispo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 4.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Metrics]:
    """CISPO: -sg[clip(rho, 1-clip_low, 1+clip_high)] * A * logp.

    The importance weight is clipped and detached, but every token keeps its gradient
    -w * A * grad logp (PPO-clip would drop clipped tokens entirely). Shapes (B, T).
    """
    adv = advantages.detach()
    logp, old_logp = _clean(logp, old_logp, mask)
    r = _ratio(logp, old_logp, log_ratio_clamp).detach()
    weight = r.clamp(1.0 - clip_low, 1.0 + clip_high)
    metrics = {
        "ratio": _masked(r, mask),
        "clip_frac_low": _masked((r < 1.0 - clip_low).float(), mask),
        "clip_frac_high": _masked((r > 1.0 + clip_high).float(), mask),
    }
    return _masked(-weight * adv * logp, mask), metrics


def sapo_gate(ratio: Tensor, tau: Tensor | float) -> Tensor:
    """f(rho) = sigmoid(tau (rho - 1)) * 4 / tau: f(1) = 2/tau, f'(1) = 1, flat far from 1."""
    return torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau


def sapo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, Metrics]:
    """SAPO: -f(rho) * A with the soft gate f above, tau = tau_pos if A > 0 else tau_neg.

    The gradient -A f'(rho) rho grad logp fades smoothly as rho leaves 1 instead of being cut at
    a clip boundary. Shapes (B, T).
    """
    adv = advantages.detach()
    logp, old_logp = _clean(logp, old_logp, mask)
    ratio = _ratio(logp, old_logp, log_ratio_clamp)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    loss = -sapo_gate(ratio, tau) * adv
    return _masked(loss, mask), {"ratio": _masked(ratio.detach(), mask)}


def reinforce(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Metrics]:
    """REINFORCE surrogate -A * logp: gradient -A * grad(logp), no ratio, no clipping.

    `old_logp` does not enter the loss; it only feeds the reported "ratio", so the caller's
    metric code does not branch. Off-policy data needs `importance_correction` weights.
    """
    adv = advantages.detach()
    logp, old_logp = _clean(logp, old_logp, mask)
    ratio = torch.exp((logp - old_logp).detach().clamp(-20.0, 20.0))
    return _masked(-adv * logp, mask), {"ratio": _masked(ratio, mask)}


OBJECTIVES: dict[str, Callable[..., tuple[Tensor, Metrics]]] = {
    "wd1": wd1,
    "ppo_clip": ppo_clip,
    "gspo": gspo,
    "cispo": cispo,
    "sapo": sapo,
    "reinforce": reinforce,
    "gmpo": gmpo,
    "dppo_tv": dppo_tv,
    "dppo_kl": dppo_kl,
    "dro": dro,
    "kl_cov": kl_cov,
    "clip_cov": clip_cov,
}
OBJECTIVES["nft"] = nft  # negative-aware fine-tuning (rlvr.algos.hybrid)
OBJECTIVES["shiq"] = shiq  # token-wise off-policy Bellman loss (rlvr.algos.offpolicy)
OBJECTIVES["reverse_kl_distill"] = reverse_kl_distill  # on-policy distillation (rlvr.algos.distill)
OBJECTIVES["bgpo"] = bgpo  # BGPO's per-draw linearised ELBO bound (rlvr.algos.dllm_objectives)
OBJECTIVES["gdsd"] = gdsd  # GDSD's guided denoiser self-distillation (rlvr.algos.dllm_objectives)
OBJECTIVES["dipo"] = dipo  # DiPO's per-denoising-step joint ratio (rlvr.algos.dllm_objectives)

ADVANTAGE_FREE = frozenset({"reverse_kl_distill"})
"""Objectives that never read the advantages: groups whose rewards tie still train them, so a run
of tied groups is not a run that learns nothing."""


def get_objective(name: str) -> Callable[..., tuple[Tensor, Metrics]]:
    """The policy objective registered as `name`; ValueError listing valid names otherwise."""
    return lookup(OBJECTIVES, "objective", name)
