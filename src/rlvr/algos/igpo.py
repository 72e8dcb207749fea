"""IGPO: inpainting a partial reference solution into groups that found no correct answer.

Paper: "Inpainting-Guided Policy Optimization for Diffusion Large Language Models" (Zhao et al.
2025, arXiv:2509.10396). When all G completions of a prompt are wrong, every group-relative
advantage is 0 and the group teaches nothing. A masked-diffusion LM can be conditioned on any
subset of its window, so IGPO writes part of the ground-truth solution into the window as fixed
tokens (inpainting), lets the model decode the rest, and puts up to ⌊λG⌋ of the correct
inpainted completions in the place of wrong ones: the group then has reward variance and a
signal, on completions the policy itself finished. Its analysis puts the largest expected
gradient at a replacement ratio of ½ (λ = 0.5 here by default).

This module is the pure part: which tokens to fix (`hint_windows`) and which rows to replace
(`replacements`); `rlvr.trainer.inpaint` runs the sampler and the verifier around them.

Deliberate deviations:
1. The hint is a PREFIX of the reference completion, a fraction η ~ U[hint_low, hint_high] of its
   tokens (at least one, never all of them), one η per group; the paper injects a random subset
   of chunks of length U[s_min, s_max] of the reasoning trace and excludes the final answer. Our
   tasks' references are the answer itself (a Countdown expression, a Sudoku grid), so a prefix
   is the partial trace, and the model must complete the rest.
2. Injected tokens get no gradient (their loss mask is 0); the paper trains the injected tokens
   at the top-entropy positions only. The hinted completions' other tokens train as usual.
3. No Length-Aligned SFT stage; the warm start is the recipe's own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def hint_windows(references: list[list[int]], fractions: Tensor, gen_length: int) -> Tensor:
    """(P, gen_length) long: the first ⌈η_p · n_p⌉ tokens of reference p (clamped to [1, n_p − 1],
    and to the window), −1 elsewhere. references: P token lists; fractions (P,) in [0, 1]."""
    out = torch.full((len(references), gen_length), -1, dtype=torch.long)
    for p, (ref, eta) in enumerate(zip(references, fractions.tolist())):
        if len(ref) < 2:  # nothing to leave for the model: no hint
            continue
        count = min(max(math.ceil(eta * len(ref)), 1), len(ref) - 1, gen_length)
        out[p, :count] = torch.tensor(ref[:count], dtype=torch.long)
    return out


def zero_signal_groups(correct: Tensor, group_size: int) -> Tensor:
    """(P,) bool: the groups with no correct completion. correct (B,) float/bool, B = P·G."""
    return ~(correct.view(-1, group_size) > 0).any(-1)


def replacements(correct: Tensor, hinted_correct: Tensor, group_size: int, max_replace: int) -> list[tuple[int, int]]:
    """[(batch row, hinted row)]: in each group without a correct completion (correct (B,)), its
    first rows are replaced, in order, by that group's correct hinted completions, at most
    `max_replace` per group. hinted_correct (P, k): the verdicts of k hinted completions per group."""
    pairs = []
    for g in zero_signal_groups(correct, group_size).nonzero().flatten().tolist():
        good = (hinted_correct[g] > 0).nonzero().flatten().tolist()[:max_replace]
        pairs.extend((g * group_size + slot, g * hinted_correct.shape[1] + j) for slot, j in enumerate(good))
    return pairs


def signal_groups(rewards: Tensor, group_size: int) -> int:
    """How many groups have rewards that vary (a nonzero group-relative advantage somewhere)."""
    grouped = torch.nan_to_num(rewards.float(), nan=0.0).view(-1, group_size)
    return int((grouped.max(-1).values > grouped.min(-1).values).sum())


__all__ = ["hint_windows", "replacements", "signal_groups", "zero_signal_groups"]
