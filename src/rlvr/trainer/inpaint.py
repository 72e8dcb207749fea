"""The rollout side of IGPO (`rlvr.algos.igpo`): after a round is scored, each group with no
correct completion gets k hinted completions (a prefix of its reference inpainted into the
window), and up to k of its rows are replaced by the hinted ones the verifier accepts.

The hinted rows keep their own seeds (drawn past the round's) and sample at the rollout
temperature; their injected tokens have loss mask 0. Metrics: `igpo/zero_signal_groups` (groups
with no correct completion before inpainting), `igpo/replaced_rows`, and
`igpo/signal_groups_before` / `_after` (groups whose rewards vary, so some advantage is nonzero).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlvr.algos.igpo import hint_windows, replacements, signal_groups, zero_signal_groups
from rlvr.batch import concat_rollouts
from rlvr.codec import completion_token_ids, decode_completions
from rlvr.trainer.parts import RolloutParts
from rlvr.trainer.plan import InpaintPlan
from rlvr.trainer.scoring import Collected, scored


def inpaint_round(r: RolloutParts, plan: InpaintPlan, got: Collected, prompt_ids: torch.Tensor,
                  prompt_mask: torch.Tensor, seeds: torch.Tensor, temperature: float | torch.Tensor,
                  group_size: int) -> Collected:
    """`got` (one round) with IGPO's replacements made, and its metrics added."""
    empty = zero_signal_groups(got.correct, group_size)
    before = signal_groups(got.rewards, group_size)
    metrics = {"igpo/zero_signal_groups": float(empty.sum()), "igpo/signal_groups_before": float(before)}
    if not bool(empty.any()) or plan.max_replace == 0:
        return replace(got, metrics={**got.metrics, **metrics, "igpo/replaced_rows": 0.0,
                                     "igpo/signal_groups_after": float(before)})
    k, groups = plan.max_replace, empty.nonzero().flatten()
    rows = (groups[:, None] * group_size + torch.arange(k)).flatten()  # the first k rows of each such group
    examples = [got.group[i] for i in rows.tolist()]
    gen = torch.Generator().manual_seed(int(seeds[0]) ^ 0x1F0)
    eta = plan.hint_low + (plan.hint_high - plan.hint_low) * torch.rand(len(groups), generator=gen)
    refs = [r.tokenizer(ex.answer, add_special_tokens=False).input_ids for ex in examples[::k]]
    fixed = hint_windows(refs, eta, plan.gen_length).repeat_interleave(k, 0)  # (len(groups)·k, Tc)
    hinted = r.engine(prompt_ids[rows], prompt_mask[rows], seeds[rows] + len(seeds), fixed=fixed,
                      temperature=temperature[rows] if isinstance(temperature, torch.Tensor) else temperature)
    free = (fixed[:, :hinted.completion_mask.shape[1]] < 0).float()
    hinted = replace(hinted, completion_mask=hinted.completion_mask * free, logprobs=hinted.logprobs * free)
    texts = decode_completions(r.tokenizer, hinted)
    s = scored(r.reward, r.task, examples, texts, completion_token_ids(r.tokenizer, hinted))
    verdicts = torch.zeros(len(empty), k)
    verdicts[groups] = s.correct.view(-1, k).float()
    pairs = replacements(got.correct, verdicts, group_size, k)
    # hinted row j of the whole (P, k) grid is row position(j) of `hinted` (empty groups only)
    position = {int(g) * k + j: i * k + j for i, g in enumerate(groups.tolist()) for j in range(k)}
    index = torch.arange(len(got.group))
    new_texts = list(got.texts)
    for row, j in pairs:
        index[row] = len(got.group) + position[j]
        new_texts[row] = texts[position[j]]
    rewards = torch.cat([got.rewards, s.rewards])[index]
    metrics.update({"igpo/replaced_rows": float(len(pairs)),
                    "igpo/signal_groups_after": float(signal_groups(rewards, group_size))})
    return replace(got, rollouts=concat_rollouts([got.rollouts, hinted], r.tokenizer.pad_token_id).select(index),
                   texts=new_texts, rewards=rewards,
                   correct=torch.cat([got.correct, s.correct.to(got.correct.dtype)])[index],
                   components=None if got.components is None else torch.cat([got.components, s.components])[index],
                   metrics={**got.metrics, **metrics})


__all__ = ["InpaintPlan", "inpaint_round"]
