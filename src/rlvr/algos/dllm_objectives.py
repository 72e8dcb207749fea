"""Objectives written for masked-diffusion LMs: BGPO's per-draw bound, GDSD's self-distillation and DiPO's
per-step joint ratio.

Paper: BGPO, "Boundary-Guided Policy Optimization for Memory-efficient RL of Diffusion Large
Language Models" (Lin et al. 2025, arXiv:2510.11683). With per-draw ELBO terms e_j (j = 1..n,
each length-normalised, e_j / L) and d_j = e_j^θ − e_j^old, the ELBO ratio exp(mean_j d_j)
couples the n draws, so every draw's graph must stay alive. BGPO replaces it by a lower bound
that is a sum of single-draw terms:
    A >= 0:  R = A · (1/n) Σ_j (1 + d_j)       (e^x >= 1 + x)
    A <  0:  R = A · (1/n) Σ_j e^{d_j}         (Jensen: exp(mean d) <= mean exp(d))
each per-draw ratio r_j PPO-clipped; loss −(1/G) Σ_i R_i. On-policy (d = 0) value and gradient
equal those of the ELBO objective −A · exp(mean_j d_j); off-policy it is a lower bound. Linear in
the draws, so each draw's gradient can be taken alone and memory stays flat in n (the policy's
`draws` come from `likelihood.stack_of_recomputed`, which recomputes each draw in the backward).

`bgpo` is the `OBJECTIVES` entry. It declares (`needs`) `draws` (B, n), the current policy's
per-draw estimates from the update's forward (with their recomputing graph), and `old_draws`
(B, n), the same draws (same masks: common random numbers) under the policy before the update,
from the old-policy pass; on-policy (no old pass) they are `draws` detached. Its loss is the row's
R_i on each of its valid tokens, so `seq_mean_token_mean` aggregates it to −(1/B) Σ_i R_i.

Deliberate deviations:
1. The "ratio" 1 + d_j for A >= 0 is used as is (DARE's port goes through a log/exp round trip,
   which is NaN for d_j < −1); its clip range is the same [1 − clip_low, 1 + clip_high].
2. No dual clip (the port applies c = 3); `clip_low` / `clip_high` are the trainer's fields.
3. The advantage of a row is its masked mean over tokens (the trainer's advantages are (B, T),
   constant along a row for the outcome-reward estimators).

Paper: GDSD, "Reinforcement Learning as Guided Denoiser Self-Distillation for Diffusion Language
Models" (arXiv:2605.29398; code github.com/GaryBall/GDSD). The reverse-KL regularised RL optimum is
π* ∝ π_old · exp(A/β); GDSD distils the denoiser toward this advantage-guided self-teacher,
log π_T = log π_old + ψ·A (ψ = 1/β), with a normalisation-free squared loss on the log-ratio
(log Z dropped, as the group-centred advantages make it small):
    loss_t = (ℓ_old + clip(ℓ_θ − ℓ_old, log(1 − ε_low), log(1 + ε_high)) − log π_T)²
           = (clip(ℓ_θ − ℓ_old, ...) − ψ·A)²,
ℓ the estimator's per-token log-likelihood (a sequence ELBO spread over the row, B̂/L: the released
code's (ΔELBO / L − ψA)²). On-policy (ℓ_old = sg ℓ_θ) its gradient is −2ψ·A·∇ℓ_θ, a policy gradient;
off-policy it stops where the log-ratio reaches the teacher's ψ·A or the clip. `gdsd` is the
`OBJECTIVES` entry; `seq_mean_token_mean` aggregates it to the code's mean over rows.
Hyperparameters: `gdsd_psi` (ψ, the code's `psi`, 1.0), `clip_low` / `clip_high` (ε of the log-ratio clip, 0.2).

Deliberate deviations:
1. The clip bounds the per-token (length-normalised) log-ratio, like every ratio in rlvr; the code
   clamps the sequence ELBO gap before dividing by L (ε = 4e-4 there, with 8 updates per batch).
2. The code's coupled-complement ELBO is `elbo_mc` with `antithetic=true` in the recipes
   (rlvr.models.likelihood deviation 3); its logit centralisation (GDSD-TLC) is not built.

Paper: DiPO, in "DiRL: An Efficient Training Framework for Diffusion Language Models" (Zhu et al.
2025, code github.com/OpenMOSS/DiRL). What is unbiased: the likelihood whose ratio GRPO takes. A
masked-diffusion sampler's trajectory τ = (x_S, ..., x_0) has the exact probability
    π_θ(τ) = Π_s Π_{k committed at s} p_θ(y_k | x_s)
(the unmasking choice taken as given), so the score-function gradient E_τ[A ∇log π_θ(τ)] is the
exact policy gradient of E[R]; the ELBO and d1's mean-field one-step likelihood are proxies whose
score is not, so GRPO on them is biased (tests/dllm/test_dipo.py shows both by exact enumeration).
DiPO optimises at the generation-step level: the `trace` estimator replays each step's state
(log p(y_k | x_s)), and the ratio of step s is the joint one over that step's tokens,
exp(Σ_{k∈s} (log p_θ − log p_old)), PPO-clipped per step (`dipo`, `needs` `trace`: the sampler's
commit step of each token). On-policy its gradient equals CJ-GRPO's (`ppo_clip` on `trace`
values); off-policy (`trainer.ppo_epochs` > 1) a step's tokens share the step's ratio.

Deliberate deviations: no dynamic sampling or speed reward (DiRL's rollout-side additions, which
are `algo.dynamic_sampling` and reward options here); a step's loss is spread over its tokens
(−A r_s / n_s each) so that with `seq_mean_token_mean` a row's gradient is its per-step score sum
over its length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlvr.algos._registry import Requirement, needs, requires


def bgpo_surrogate(draws: Tensor, old_draws: Tensor, advantages: Tensor, *, clip_low: float = 0.2,
                   clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-row BGPO bound R_i (B,) from per-draw estimates (B, n) and row advantages (B,);
    metrics (B,): the mean per-draw ratio and the fraction of draws whose clip removes the gradient."""
    d = draws - old_draws.detach()
    adv = advantages.detach()[:, None]  # (B, 1)
    ratio = torch.where(adv >= 0, 1 + d, torch.exp(d))  # (B, n)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    r = ratio.detach()
    low, high = (adv < 0) & (r < 1 - clip_low), (adv > 0) & (r > 1 + clip_high)
    return surrogate.mean(-1), {"ratio": r.mean(-1), "clip_frac_low": low.float().mean(-1),
                                "clip_frac_high": high.float().mean(-1)}


@requires(Requirement({"model.kind": "diffusion", "estimator.name": "bgpo"}, "bgpo reads the per-draw ELBO "
                     "estimates of estimator.name=bgpo; set model.kind=diffusion and estimator.name=bgpo, or use "
                     "ppo_clip"))
@needs("draws", "old_draws")
def bgpo(logp, old_logp, advantages, mask, *, draws: Tensor, old_draws: Tensor, clip_low: float = 0.2,
         clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """BGPO's bound as a per-token loss (B, T): −R_i on each valid token of row i. `logp` and
    `old_logp` (the draws' mean, spread) are not read: the draws carry the same numbers."""
    keep = mask > 0
    row_adv = (advantages.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    value, metrics = bgpo_surrogate(draws, old_draws, row_adv, clip_low=clip_low, clip_high=clip_high)
    spread = {k: torch.where(keep, v[:, None], torch.zeros_like(mask)) for k, v in metrics.items()}
    return torch.where(keep, -value[:, None], torch.zeros_like(mask)), spread


def group_product_ppo(logp, old_logp, advantages, mask, *, group_of: Tensor, clip_low: float = 0.2,
                      clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with one ratio per group of a row's tokens (`group_of` (B, T) long, the group index
    of each token), the product of its tokens' ratios exp(Σ_{k∈g} d_k). The group's clipped loss is
    spread over its n_g valid tokens (−A·r_g / n_g on each), so on-policy (r = 1) the gradient is
    Σ_k −A ∇d_k, and off-policy every token of a group is weighted by the whole group's ratio.
    Shapes (B, T)."""
    keep = mask > 0
    d = torch.where(keep, logp - old_logp.detach(), torch.zeros_like(logp))
    groups = group_of.long().clamp(min=0)
    width = int(groups.max()) + 1 if groups.numel() else 1
    per_group = d.new_zeros(d.shape[0], width).scatter_add(1, groups, d).gather(1, groups)
    count = keep.to(d.dtype)
    size = count.new_zeros(d.shape[0], width).scatter_add(1, groups, count).gather(1, groups)
    ratio = torch.exp(per_group.clamp(-20, 20))
    adv = advantages.detach()
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)) / size.clamp(min=1)
    return torch.where(keep, loss, torch.zeros_like(loss)), {"ratio": torch.where(keep, ratio.detach(),
                                                                                   torch.zeros_like(loss))}


def block_product_ppo(logp, old_logp, advantages, mask, *, block_length: int, clip_low: float = 0.2,
                      clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with one ratio per block, the product of its tokens' ratios: the block-product
    weighting PBPO compares its token-local one (`ppo_clip` on `prefix_block` values) against."""
    block_of = torch.arange(logp.shape[1], device=logp.device) // block_length
    return group_product_ppo(logp, old_logp, advantages, mask, group_of=block_of.expand_as(logp),
                             clip_low=clip_low, clip_high=clip_high)


@requires(Requirement({"model.kind": "diffusion", "estimator.name": "trace", "estimator.shrink": (None, 0, 1)},
                     "dipo takes each sampler step's joint ratio of the trace estimator's values; set "
                     "model.kind=diffusion, estimator.name=trace and estimator.shrink=1"))
@needs("trace")
def dipo(logp, old_logp, advantages, mask, *, trace: Tensor, clip_low: float = 0.2,
         clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """DiPO: PPO-clip on each denoising step's joint ratio π_θ(step s | x_s) / π_old(step s | x_s),
    the product over the tokens the sampler committed at step s (`trace`, (B, T)) of their ratios
    under the `trace` estimator (log p(y_k | the sampler's state before step s)). See the module
    docstring for why this score is the sampler trajectory's, hence unbiased."""
    return group_product_ppo(logp, old_logp, advantages, mask, group_of=trace, clip_low=clip_low,
                             clip_high=clip_high)


def bgpo_objective(draw_logp: Tensor, draw_old: Tensor, advantages: Tensor, *, clip_low: float = 0.2,
                   clip_high: float = 0.2) -> Tensor:
    """The scalar BGPO loss −(1/B) Σ_i R_i; draws (n, B) as the paper indexes them, advantages (B,)."""
    value, _ = bgpo_surrogate(draw_logp.T, draw_old.T, advantages, clip_low=clip_low, clip_high=clip_high)
    return -value.mean()


def gdsd_teacher(old_logp: Tensor, advantages: Tensor, *, gdsd_psi: float = 1.0) -> Tensor:
    """GDSD's self-teacher, per token (B, T): the policy before the update tilted by the advantage,
    log π_old + ψ·A, unnormalised (detached: the teacher is a target, never trained)."""
    return old_logp.detach() + gdsd_psi * advantages.detach()


def gdsd(logp, old_logp, advantages, mask, *, gdsd_psi: float = 1.0, clip_low: float = 0.2,
         clip_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """GDSD's per-token loss (B, T): (ℓ_old + clip(ℓ_θ − ℓ_old) − ℓ_teacher)², the clip zeroing the gradient
    past [log(1 − ε_low), log(1 + ε_high)]; metrics: the teacher's gap and the clip fractions."""
    keep = mask > 0
    old = old_logp.detach()
    floor = math.log1p(-clip_low) if clip_low < 1 else float("-inf")
    ceiling = math.log1p(clip_high)
    log_ratio = torch.where(keep, logp - old, torch.zeros_like(logp))
    clipped = log_ratio.clamp(floor, ceiling)
    residual = old + clipped - gdsd_teacher(old, advantages, gdsd_psi=gdsd_psi)
    zero = torch.zeros_like(logp)
    r = log_ratio.detach()
    metrics = {"gdsd_teacher_gap": torch.where(keep, residual.detach(), zero),
               "clip_frac_low": torch.where(keep & (r < floor), 1.0, zero),
               "clip_frac_high": torch.where(keep & (r > ceiling), 1.0, zero)}
    return torch.where(keep, residual ** 2, zero), metrics


__all__ = ["bgpo", "bgpo_objective", "bgpo_surrogate", "block_product_ppo", "dipo", "gdsd", "gdsd_teacher",
           "group_product_ppo"]
