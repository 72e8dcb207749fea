"""KL estimators: per-token estimate (B, T) of a divergence between the policy and a reference.

Papers (arXiv ids and links in docs/papers.md):
- k1, k2, k3: J. Schulman, "Approximating KL Divergence" (2020 note); k3 as GRPO's KL loss
  (DeepSeekMath, Shao et al. 2024). Which placement gives which gradient: "A Comedy of
  Estimators" (literature/000_*.txt line 117) and RPG (literature/000_*.txt line 155).
- k3_iw: DeepSeek-V3.2's "unbiased KL" (k3 times the importance ratio against the old policy).
- forward_kl, js, and the `*_on_reference_samples` functions: DPH-RL, "mass-covering
  f-divergences (forward-KL, JS) as a rehearsal mechanism" (literature/001_*.txt line 223).
- rpg_rkl, rpg_urkl, rpg_fkl, rpg_ufkl: RPG's off-policy KL surrogates, defined in
  `rlvr.algos.rpg` and registered here.
- adaptive_kl_coef: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences".

Signature of every registered estimator:
    fn(logp, ref_logp, *, old_logp=None) -> (B, T) per-token value, differentiable in logp
on tokens sampled from the policy. delta = logp - ref_logp, r = pi_ref / pi = exp(-delta).
`old_logp` is accepted by every estimator (the caller passes it uniformly) and read only by
`k3_iw`. The mask is applied by the aggregation. Value and gradient, on-policy:
- k1 = delta: unbiased for KL(pi || ref); gradient grad logp has mean 0 -> pure noise in the
  loss. Put it in the reward instead (-beta * sum_t k1): that gives the reverse-KL gradient.
- k2 = delta^2 / 2: biased value; in the loss its gradient delta * grad logp is the reverse-KL
  gradient (for one token; for sequences, of the per-token conditional KLs with the prefix
  distribution held fixed).
- k3 = r - 1 - log r >= 0: unbiased for KL(pi || ref); in the loss its gradient (1 - r) grad
  logp is that of the FORWARD KL(ref || pi).
- abs = |delta|.
- k1_st, k3_st: value of k1 / k3, gradient of k2 (straight-through): log the KL you optimise.
- k3_iw = rho * k3 with rho = pi / pi_old (differentiable): unbiased for KL(pi || ref) on samples
  of pi_old, and its gradient rho * delta * grad logp is the reverse-KL gradient off-policy too.
- forward_kl: value r log r - r + 1 >= 0, unbiased for KL(ref || pi) from samples of pi;
  gradient (1 - r) grad logp, the forward-KL gradient.
- js: value f(r) = (r log r - (1 + r) log((1 + r)/2)) / 2 >= 0, unbiased for the Jensen-Shannon
  divergence from samples of pi; gradient (1/2) log(2 / (1 + r)) grad logp, the JS gradient.
The last two use the general rule for D_f(ref || pi) = E_pi[f(r)]: on-policy its gradient is
E_pi[(f(r) - r f'(r)) grad logp], so the loss term sg[f(r)] + sg[f(r) - r f'(r)] (logp - sg[logp])
has the right value and the right expected gradient. (k3_st is this rule for f = r - 1 - log r.)
What is estimable from samples of pi: every f-divergence, given ref_logp on the sampled tokens,
but through r = pi_ref / pi, whose variance explodes exactly where the reference keeps mass the
policy has dropped; those regions are rarely sampled by pi, and they are what a mass-covering
divergence exists to protect. DPH-RL therefore evaluates the divergence on samples of the
initial policy: `forward_kl_on_reference_samples` / `js_on_reference_samples` take (logp,
ref_logp) on tokens sampled from the reference (an offline set, no online reference model),
where the divergence is a plain differentiable function of logp with no importance weight.

Hyperparameters: `kl_target`, `kl_horizon` (adaptive_kl_coef only).

Deliberate deviations:
1. Exponents are clamped to [-20, 20] (overflow guard) but outputs are not; verl also clamps k3
   to [-10, 10] and OpenRLHF clamps every estimator's output, which zeroes far-off gradients.
2. `k3_iw` with old_logp=None uses sg[logp] (on-policy: rho = 1 in value, rho grad logp in
   gradient), so it reduces to k3's value with k2's gradient.
3. `forward_kl` and `js` on policy samples are our construction from DPH-RL's generator
   functions; DPH-RL itself evaluates them on samples of the initial policy (the
   `*_on_reference_samples` functions, not in the registry because their samples differ).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.algos._registry import lookup
from rlvr.algos.rpg import RPG_ESTIMATORS

__all__ = [
    "KL_ESTIMATORS",
    "adaptive_kl_coef",
    "forward_kl",
    "forward_kl_on_reference_samples",
    "get_kl_estimator",
    "js",
    "js_on_reference_samples",
    "k1",
    "k1_st",
    "k2",
    "k3",
    "k3_iw",
    "k3_st",
    "kl_abs",
]

_EXP_CLAMP = 20.0


def _delta(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp.detach()


def _log_r(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """log(ref / pi), clamped for exp."""
    return (ref_logp.detach() - logp).clamp(-_EXP_CLAMP, _EXP_CLAMP)


def _straight_through(value: Tensor, grad_weight: Tensor, logp: Tensor) -> Tensor:
    """Value `value`, gradient grad_weight * grad logp (both detached here)."""
    return value.detach() + grad_weight.detach() * (logp - logp.detach())


def k1(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k1 = logp - ref_logp. Shape (B, T)."""
    return _delta(logp, ref_logp)


def k2(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2. Shape (B, T)."""
    return 0.5 * _delta(logp, ref_logp) ** 2


def k3(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1 >= 0. Shape (B, T)."""
    log_r = _log_r(logp, ref_logp)
    return torch.exp(log_r) - log_r - 1.0


def kl_abs(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """|logp - ref_logp|. Shape (B, T)."""
    return _delta(logp, ref_logp).abs()


def k1_st(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """Value of k1, gradient of k2 (delta * grad logp). Shape (B, T)."""
    delta = _delta(logp, ref_logp)
    return _straight_through(delta, delta, logp)


def k3_st(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """Value of k3, gradient of k2 (delta * grad logp). Shape (B, T)."""
    return _straight_through(k3(logp, ref_logp), _delta(logp, ref_logp), logp)


def k3_iw(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """rho * k3, rho = exp(logp - old_logp) differentiable. Shape (B, T)."""
    old = logp.detach() if old_logp is None else old_logp.detach()
    rho = torch.exp((logp - old).clamp(-_EXP_CLAMP, _EXP_CLAMP))
    return rho * k3(logp, ref_logp)


def forward_kl(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """KL(ref || pi) from samples of pi: value r log r - r + 1, gradient (1 - r) grad logp."""
    log_r = _log_r(logp, ref_logp)
    r = torch.exp(log_r)
    return _straight_through(r * log_r - r + 1.0, 1.0 - r, logp)


def js(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """Jensen-Shannon(pi, ref) from samples of pi: value (r log r - (1+r) log((1+r)/2)) / 2,
    gradient (1/2) log(2 / (1 + r)) grad logp."""
    log_r = _log_r(logp, ref_logp)
    r = torch.exp(log_r)
    log_half_1pr = torch.logaddexp(torch.zeros_like(log_r), log_r) - math.log(2.0)  # log((1+r)/2)
    value = 0.5 * (r * log_r - (1.0 + r) * log_half_1pr)
    return _straight_through(value, -0.5 * log_half_1pr, logp)


def forward_kl_on_reference_samples(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """KL(ref || pi) per token on tokens sampled from the reference: ref_logp - logp.

    Its gradient -grad logp is maximum likelihood on the reference's samples (rehearsal)."""
    return ref_logp.detach() - logp


def js_on_reference_samples(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Jensen-Shannon(pi, ref) per token on tokens sampled from the reference, u = pi / ref:
    (log(2 / (1 + u)) + u log(2u / (1 + u))) / 2, exact in value and gradient."""
    log_u = (logp - ref_logp.detach()).clamp(-_EXP_CLAMP, _EXP_CLAMP)
    u = torch.exp(log_u)
    log_half_1pu = torch.logaddexp(torch.zeros_like(log_u), log_u) - math.log(2.0)  # log((1+u)/2)
    return 0.5 * (-log_half_1pu + u * (log_u - log_half_1pu))


def adaptive_kl_coef(
    beta: float, observed_kl: float, n: int, *, kl_target: float, kl_horizon: float = 10000.0
) -> float:
    """Adaptive KL coefficient: e = clip(observed_kl / kl_target - 1, -0.2, 0.2),
    beta' = beta * (1 + e * n / kl_horizon). `n` is the number of samples (or steps) since the
    last update; `observed_kl` the batch mean of per-sequence KL."""
    if kl_target <= 0 or kl_horizon <= 0:
        raise ValueError("kl_target and kl_horizon must be > 0")
    error = min(max(observed_kl / kl_target - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * n / kl_horizon)


KL_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "abs": kl_abs,
    "k1_st": k1_st,
    "k3_st": k3_st,
    "k3_iw": k3_iw,
    "forward_kl": forward_kl,
    "js": js,
}
KL_ESTIMATORS.update(RPG_ESTIMATORS)  # RPG's off-policy surrogates (rlvr.algos.rpg)


def get_kl_estimator(name: str) -> Callable[..., Tensor]:
    """The KL estimator registered as `name`; ValueError listing valid names otherwise."""
    return lookup(KL_ESTIMATORS, "KL estimator", name)
