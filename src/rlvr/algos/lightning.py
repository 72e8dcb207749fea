"""LightningRL's advantage: reinforce the correct masked-diffusion rollouts that commit more tokens per forward.

Paper: "LightningRL" (SJTU-DENG-Lab; code github.com/SJTU-DENG-Lab/LightningRL): GRPO for dLLMs that
optimises the speed-quality frontier with (1) per-reward decoupled normalisation of an accuracy and a
parallelism reward, (2) a token-level NLL regulariser on correct trajectories, (3) dynamic sampling
with TPF-aware (tokens-per-forward) filtering.

Here, per row i of B = P·G (groups of G completions of one prompt), window length L:
    steps_i = max_t trace_it + 1           (the denoising steps the row took part in)
    tpf_i   = L / steps_i                  (tokens committed per forward)
    c_i     = 1[r_i >= correct_at]
    s_i     = c_i · tpf_i                  (the parallelism reward: speed counts only when correct)
    A_i     = whiten_kept(GRPO(r)_i + λ·GRPO(s)_i) + β·c_i
GRPO(x) = (x − mean_g) / (std_g + eps) within the group (0 for a constant group), λ = `speed_weight`,
β = `nll_coef`; whitening is over the valid tokens of the kept groups. A group is kept
(`tpf_filter`) when r or s varies within it: all-wrong groups and all-correct groups whose rows
were equally fast carry no signal in either reward and get advantage 0 (apart from β).

Hyperparameters (`algo.*`): `speed_weight` λ (default 1.0), `nll_coef` β (0.0), `correct_at` (1.0),
`tpf_filter` (true), `adv_eps` added to every std (1e-6).

Deliberate deviations:
1. The NLL term enters as an advantage offset β on correct rows: its gradient −β∇log π(y) equals the
   policy-gradient term of advantage β at ratio 1 (the on-policy first update); later PPO epochs clip it
   as any advantage, where the paper adds it to the loss unclipped.
2. TPF-aware filtering masks groups (advantage 0, out of the whitening) instead of drawing more
   prompts to refill the batch (use `algo.dynamic_sampling` for refilling on the task reward).
3. The parallelism reward is the correct-gated TPF; the paper's exact form and normalisation constants
   are not in its abstract, so this is the simplest reward with its stated aim (fast wrong answers
   earn nothing).
4. Rollouts use one decoding rule (`rollout.threshold`), so row speeds differ only through the
   model's confidence along each sampled trajectory; no mix of thresholds per group.
5. Correctness is read off the reward (`correct_at`, Countdown's 1.0 for a right answer, 0.1 for a
   formatted wrong one), not the verifier's separate verdict.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr.algos._advantage_core import (
    AdvantageInputs,
    centred_scores,
    group_metrics,
    group_stats,
    row_valid,
    whiten,
    working_mask,
)
from rlvr.algos._registry import Requirement, needs, requires

__all__ = ["lightning", "tokens_per_forward"]


def tokens_per_forward(trace: Tensor) -> Tensor:
    """(B,) window length / denoising steps of each row; trace (B, L) long, −1 = given in advance.

    >>> tokens_per_forward(torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])).tolist()
    [1.0, 2.0]
    """
    steps = (trace.max(dim=-1).values + 1).clamp(min=1)
    return trace.shape[-1] / steps.to(torch.float64)


def _group_advantage(values: Tensor, group_size: int, adv_eps: float) -> tuple[Tensor, Tensor]:
    """((B,) GRPO advantage of `values`, (P,) bool: the group's scorable values are not all equal)."""
    st = group_stats(values, group_size)
    adv = torch.where(st.constant, centred_scores(st, group_size), centred_scores(st, group_size) / (st.std + adv_eps))
    return adv.reshape(-1), ~st.constant.reshape(-1)


@requires(Requirement({"model.kind": "diffusion"}, "lightning reads each row's denoising steps from the diffusion "
                     "sampler; set model.kind=diffusion or use grpo"))
@needs("trace")
def lightning(inp: AdvantageInputs, *, speed_weight: float = 1.0, nll_coef: float = 0.0, correct_at: float = 1.0,
              tpf_filter: bool = True, adv_eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """LightningRL's advantage (module docstring); needs the rollouts' `trace`."""
    if inp.trace is None:
        raise ValueError("lightning reads each row's denoising steps from the rollouts' trace: "
                         "use a masked-diffusion model (model.kind=diffusion)")
    if inp.group_size < 2:
        raise ValueError(f"lightning compares completions within a group; needs rollout.group_size >= 2, "
                         f"got {inp.group_size}")
    valid = row_valid(inp.rewards)
    rewards = inp.rewards.detach().to(torch.float64)
    correct = valid & (rewards >= correct_at)
    tpf = tokens_per_forward(inp.trace).to(rewards.device)
    speed = torch.where(valid, correct.to(torch.float64) * tpf, torch.full_like(tpf, float("nan")))
    acc_adv, acc_varies = _group_advantage(rewards, inp.group_size, adv_eps)
    speed_adv, speed_varies = _group_advantage(speed, inp.group_size, adv_eps)
    kept = acc_varies | speed_varies if tpf_filter else torch.ones_like(acc_varies)
    kept_rows = kept.repeat_interleave(inp.group_size) & valid
    mask = working_mask(inp).to(torch.float64)
    total = (acc_adv + speed_weight * speed_adv)[:, None] * mask
    adv = whiten(total, mask * kept_rows[:, None], adv_eps=adv_eps) + nll_coef * correct[:, None] * mask
    metrics = group_metrics(group_stats(rewards, inp.group_size))
    n_correct = int(correct.sum())
    metrics.update({
        "lightning/tpf_mean": float(tpf[valid].mean()) if bool(valid.any()) else 0.0,
        "lightning/tpf_correct": float(tpf[correct].mean()) if n_correct else 0.0,
        "lightning/kept_groups": float(kept.to(torch.float64).mean()),
    })
    return adv.to(working_mask(inp).dtype), metrics
