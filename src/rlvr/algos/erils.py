"""ERILS: external rollouts for a masked-diffusion LM, length-controlled and scored per source.

Paper: "External Rollout Integration with Length Control and Source-Specific Processing" (ERILS;
literature/000_*.txt line 169). When the target dLLM rarely succeeds, its on-policy groups carry
little positive signal; ERILS adds higher-reward rollouts of a stronger external policy to the
step, with two fixes that the abstract names: (1) the external rollouts' length is controlled, so
they fit the dLLM's fixed generation window instead of teaching it another length, and (2) the
rewards of on-policy and external rollouts are processed separately (joint processing collapses
training in the paper's ablation).

This module is the pure part: `canvas_rows` (length control: a completion + EOS, padded with EOS
to the window, the way the diffusion sampler's own rollouts and the diffusion SFT look) and
`per_source_advantages` (group-relative standardisation inside each (group, source) cell).
`rlvr.trainer.expert` appends the rows (config section `expert`, `expert.advantage=source`).

Deliberate deviations (only the abstract was available; the formulas are ours):
1. The external policy is the task's reference solutions (Countdown's exact expressions, the
   Sudoku grid), rendered as completions: a deterministic oracle, not a stronger sampled LLM. Its
   behaviour log-prob is 0 (probability 1), as for the causal expert rows.
2. Length control = EOS padding to the window (`rollout.max_new_tokens`); an external completion
   that does not fit with its EOS is dropped, not truncated (a cut answer would be scored as a
   different answer than the one the external policy gave).
3. Source-specific processing = `per_source_advantages`: each source is standardised against its
   own rows only: the on-policy rows by their prompt group (exactly GRPO's advantage), the
   external rows of the step as one group (they come from the expert pool and share no prompt
   with an on-policy group). Joint processing (`expert.advantage=batch`) standardises the external
   rewards against the whole step's. With the oracle every external reward is 1, so its
   source-normalised advantage is 0: the external rows then learn only through an
   advantage-free expert objective (`expert.objective=sft`, the likelihood of the solution under
   the policy's diffusion estimator), which is what the recipes use.
4. External rows enter the loss as a separate term, (1 − μ) L_on + μ L_ext or L_on + μ L_ext
   (`expert.weight`, `expert.keep_onpolicy`), their log-likelihood from the same estimator and
   the same common random masks as the on-policy rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def canvas_rows(completions: list[list[int]], gen_length: int, eos_id: int) -> tuple[Tensor, Tensor]:
    """Length control. completions: token lists without EOS. Returns ((B, gen_length) long: each
    completion + EOS, then EOS up to `gen_length`; (B,) bool: whether it fit). A row that does
    not fit (its tokens + EOS exceed the window) is all EOS and flagged False: drop it."""
    rows, fits = [], []
    for ids in completions:
        fit = len(ids) + 1 <= gen_length
        body = list(ids) if fit else []
        rows.append(body + [eos_id] * (gen_length - len(body)))
        fits.append(fit)
    return torch.tensor(rows, dtype=torch.long).view(len(rows), gen_length), torch.tensor(fits, dtype=torch.bool)


def per_source_advantages(rewards: Tensor, groups: Tensor, sources: Tensor, *, eps: float = 1e-6) -> Tensor:
    """(B,) advantages (R_i − mean_c) / (std_c + eps), c = (groups[i], sources[i]): each row is
    standardised against the scorable rows of its own group and source only (Bessel std, as
    rlvr's GRPO). A cell with fewer than two scorable rewards or none that differ, and a NaN
    reward, give 0.
    rewards (B,) float; groups (B,) and sources (B,) integer ids."""
    rewards = rewards.double()
    scored = ~torch.isnan(rewards)
    out = torch.zeros_like(rewards)
    cells = torch.stack([groups.long(), sources.long()], -1)
    for cell in torch.unique(cells, dim=0):
        rows = (cells == cell).all(-1)
        kept = rows & scored
        if int(kept.sum()) < 2:
            continue
        values = rewards[kept]
        centred, std = values - values.mean(), values.std()
        out[kept] = centred / (std + eps) if std > 0 else torch.zeros_like(centred)  # no spread: no signal
    return out.float()


__all__ = ["canvas_rows", "per_source_advantages"]
