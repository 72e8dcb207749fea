"""Preference losses on sequence log-likelihoods: DPO and IPO, VRPO, and the Bradley–Terry
reward-model loss.

- `dpo_loss`: DPO (Rafailov et al. 2023), −log σ(β[(log πθ(y_w) − log πref(y_w)) − (log πθ(y_l) −
  log πref(y_l))]); ``loss_type="ipo"``: IPO (Azar et al. 2023), (h − 1/(2β))² on the margin h of
  the per-token mean log-ratios.
- `vrpo_loss`: VRPO (LLaDA 1.5) — DPO on ELBO estimates of chosen and rejected completions,
  with the same mask seed for policy and reference (shared randomness lowers the variance of
  the margin).
- `bradley_terry_loss`: −log σ(r(y_w) − r(y_l) − m), a reward model's pairwise loss with an
  optional margin m per pair (Llama 2's margin loss; m = 0 is plain Bradley–Terry).

Shapes: every input is (B,) — one value per preference pair (sequence sums of log-probs, or
scalar rewards). Each function returns (mean loss, metrics).

Deliberate deviations:
1. The estimates are whatever the caller passes (e.g. `elbo_mc` sequence values); the losses do
   not draw masks themselves, so shared randomness is the caller's job (same `mask_seed`).
2. IPO divides each log-ratio by its completion's token count before the margin (TRL does the
   same, confirmed with the IPO authors; the paper's formula is on sequence sums).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSSES = ("sigmoid", "ipo")


def dpo_loss(policy_chosen, ref_chosen, policy_rejected, ref_rejected, *, beta: float = 0.1,
             loss_type: str = "sigmoid", chosen_tokens=None, rejected_tokens=None):
    """DPO (``sigmoid``) or IPO (``ipo``) over (B,) sequence log-likelihoods; the reference is
    detached. IPO needs `chosen_tokens` / `rejected_tokens` (B,), the completions' token counts.

    >>> loss, m = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
    ...                    beta=0.5)
    >>> round(float(loss), 4), m["accuracy"]   # margin 0.5·((1) − (−1)) = 1; −log σ(1) = 0.3133
    (0.3133, 1.0)
    """
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss {loss_type!r}; choose one of {', '.join(DPO_LOSSES)}")
    chosen = policy_chosen - ref_chosen.detach()  # (B,) log-ratios
    rejected = policy_rejected - ref_rejected.detach()
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen - rejected))
    else:
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("ipo: pass chosen_tokens and rejected_tokens (each completion's token count)")
        delta = chosen / chosen_tokens.clamp(min=1) - rejected / rejected_tokens.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    margin = (beta * (chosen - rejected)).detach()
    return losses.mean(), {"margin": float(margin.mean()), "accuracy": float((margin > 0).float().mean()),
                           "chosen_reward": float(beta * chosen.detach().mean()),
                           "rejected_reward": float(beta * rejected.detach().mean())}


def vrpo_loss(policy_chosen, ref_chosen, policy_rejected, ref_rejected, *, beta: float = 0.2):
    """VRPO = DPO with ELBO estimates: −log σ(β[(B̂θ(y_w) − B̂ref(y_w)) − (B̂θ(y_l) − B̂ref(y_l))]).
    All (B,) sequence estimates; compute them with the SAME mask seed for policy and reference
    (common random numbers, VRPO's third variance-reduction result). Returns (loss, metrics)."""
    loss, metrics = dpo_loss(policy_chosen, ref_chosen, policy_rejected, ref_rejected, beta=beta)
    return loss, {"margin": metrics["margin"], "accuracy": metrics["accuracy"]}


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, *, margin: torch.Tensor | float = 0.0):
    """−log σ(r_w − r_l − m) over (B,) scalar rewards; accuracy counts r_w > r_l (margin aside).

    >>> loss, m = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]), margin=1.0)
    >>> round(float(loss), 4), m["accuracy"]   # (−log σ(0) − log σ(−2)) / 2 = (0.6931 + 2.1269) / 2
    (1.41, 0.5)
    """
    gap = chosen - rejected
    loss = -F.logsigmoid(gap - margin).mean()
    return loss, {"accuracy": float((gap.detach() > 0).float().mean()), "gap": float(gap.detach().mean())}
