"""Masked-diffusion sampler (LLaDA `generate` / Dream `diffusion_generate` family), batched, seeded.

Window of `gen_length` mask tokens after the left-padded prompt, decoded in `gen_length /
block_length` semi-autoregressive blocks; each block gets `steps / num_blocks` denoising steps and
commits its tokens on LLaDA's schedule (block size split evenly, remainder to the earliest steps).
Every step: one full-window forward, of the distinct rows whose block is not done yet
(`distinct_forward`: rows that coincide, as a group's do at its first step, share one); at every
masked position of the current block draw a candidate by Gumbel-max at `temperature` in float64
(argmax at 0); score positions by `remasking`:
- `low_confidence`: untempered softmax probability of the candidate (LLaDA),
- `random`: an independent uniform,
- `entropy`: sum p log p (negative entropy; Dream's `entropy`),
- `margin`: top-1 minus top-2 probability (Dream's `topk_margin`);
and commit the best-scored ones; the rest stay masked. `threshold` switches to dynamic decoding
(Fast-dLLM / TraceRL `low_confidence_dynamic`): commit every masked position of the block whose
score is >= threshold, at least one per step; `steps` is then ignored.

Per-sample seeding: the noise of row i at its k-th step depends only on (seed_i, k) (hashed
counters, `rlvr.noise`), so a completion does not depend on its batch neighbours, also in
threshold mode where rows advance at different speeds.

Recorded per token: `trace` = the row's step that committed it (0-based) and `logprobs` =
log softmax(logits / temperature) of the committed token at that step (the token choice's
behaviour log-prob; the position choice is not a probability). `completion_mask` follows
`window`: `eos` = up to and including the first EOS (d1, coupled-GRPO, SPG), `full` = the whole
window (ESPO, JustGRPO). Completion ids are the raw window, post-EOS tokens included, so the
trace replays exactly.

Inpainting (IGPO): `fixed` (B, gen_length) long puts a token at every position where it is >= 0
before the first step; those positions are never masked, so the model decodes the rest around
them. Their `trace` is -1 and their `logprobs` 0 (nothing was sampled there).

Step schedules (`step_schedule`, CJ-GRPO's decoding scheduler): `even` is LLaDA's split above;
`ascending` (Ascending Step-Size, ASS) commits 2^s tokens at step s of a block and the rest at its
last step, so a block of 2^k tokens decodes in k steps (16 tokens: 1, 2, 4, 9). EOS Early Rejection
(`eoser_gamma` = γ, EOSER) multiplies an EOS candidate's `low_confidence` score by
γ + (1 − γ)·t(s), t rising from near 0 at the block's first step to near 1 at its last (ascending:
t = (2^(s+1) − 1)/2^k, the share of the block decoded; even: t = s/(k − 1)), so the model cannot end
its answer early on a confident EOS; `suppress_eos` is its hard form.

Deviations: `suppress_eos` moves EOS candidates to the end of the ranking (they are committed
only when nothing else is left in the block), applied to EOS itself (LLaDA's
`confidence_eos_eot_inf` line only ends up suppressing EOT). No CFG (every RL repo
sets w = 0), no top-p/top-k, no KV cache.
"""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts
from rlvr.models.likelihood import distinct_forward, window_mask
from rlvr.noise import gumbel_noise, mix32, uniform_noise

REMASKING = ("low_confidence", "random", "entropy", "margin")
STEP_SCHEDULES = ("even", "ascending")
_EOS_PENALTY = 1e9  # subtracted from an EOS candidate's score: last, but still above non-masked (-inf)


def transfer_schedule(block_length: int, steps_per_block: int) -> list[int]:
    """Tokens committed at each step of a block: even split, remainder to the earliest steps."""
    base, rem = divmod(block_length, steps_per_block)
    return [base + (s < rem) for s in range(steps_per_block)]


def ascending_schedule(block_length: int, steps_per_block: int) -> list[int]:
    """CJ-GRPO's Ascending Step-Size: 2^s tokens at step s, the rest of the block at the last step."""
    if block_length < 2 ** steps_per_block:
        raise ValueError(f"rollout.step_schedule=ascending: a block of {block_length} tokens fits at most "
                         f"{block_length.bit_length() - 1} steps, not {steps_per_block}; lower rollout.diffusion_steps")
    doubling = [2 ** s for s in range(steps_per_block - 1)]
    return [*doubling, block_length - sum(doubling)]


def block_schedule(step_schedule: str, block_length: int, steps_per_block: int) -> list[int]:
    """Tokens committed at each step of a block under `step_schedule` (`STEP_SCHEDULES`)."""
    if step_schedule == "even":
        return transfer_schedule(block_length, steps_per_block)
    if step_schedule == "ascending":
        return ascending_schedule(block_length, steps_per_block)
    raise ValueError(f"unknown rollout.step_schedule {step_schedule!r}; valid: {', '.join(STEP_SCHEDULES)}")


def eoser_scale(gamma: float | None, step: int, steps_per_block: int, step_schedule: str) -> float:
    """EOSER's factor on an EOS candidate's confidence at step `step` of a block: γ + (1 − γ)·t, with
    t the paper's per-schedule progress (module doc); 1 (no change) where γ is None."""
    if gamma is None:
        return 1.0
    if step_schedule == "ascending":
        progress = (2 ** (step + 1) - 1) / 2 ** steps_per_block
    else:
        progress = step / (steps_per_block - 1) if steps_per_block > 1 else 1.0
    return gamma + (1 - gamma) * progress


def _row_keys(seeds: torch.Tensor, row_steps: torch.Tensor, salt: int) -> torch.Tensor:
    return mix32(seeds.to(torch.int64)) ^ mix32(row_steps * 0x9E3779B1 + salt)


def _scores(logits: torch.Tensor, candidates: torch.Tensor, remasking: str, keys: torch.Tensor) -> torch.Tensor:
    """Confidence per position (B, b) from untempered logits (B, b, V) float64."""
    probs = logits.softmax(-1)
    if remasking == "low_confidence":
        return probs.gather(-1, candidates[..., None]).squeeze(-1)
    if remasking == "random":
        return uniform_noise(keys, 0, logits.shape[1])
    if remasking == "entropy":
        return (probs * probs.clamp_min(1e-300).log()).sum(-1)
    if remasking == "margin":
        top = probs.topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    raise ValueError(f"unknown remasking {remasking!r}; valid: {', '.join(REMASKING)}")


def _candidates(logits: torch.Tensor, temperature, seeds, row_steps) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits / T (B, b, V), each masked position's candidate token (B, b)): Gumbel-max over the
    tempered logits, or argmax where T = 0; T a float or per row (B,)."""
    rows_t = torch.as_tensor(temperature, dtype=torch.float64).expand(logits.shape[0])
    sampled = rows_t > 0
    if not bool(sampled.any()):  # greedy decoding (evaluation): no noise to draw
        return logits, logits.argmax(-1)
    tempered = torch.where(sampled[:, None, None], logits / rows_t.clamp_min(1e-30)[:, None, None], logits)
    noise = gumbel_noise(_row_keys(seeds, row_steps, 0x51), 0, logits.shape[1] * logits.shape[-1])
    candidates = (tempered + noise.view_as(logits)).argmax(-1)
    return tempered, torch.where(sampled[:, None], candidates, logits.argmax(-1))


def check_schedule(gen_length: int, block: int, steps: int, threshold, remasking: str, *, what: str,
                   step_schedule: str = "even", eoser_gamma: float | None = None) -> int:
    """The number of blocks, or a ValueError naming the setting that does not fit (`what`: the block's name)."""
    if threshold is not None and (step_schedule != "even" or eoser_gamma is not None):
        raise ValueError("rollout.threshold decodes by confidence, without a step schedule: set rollout.threshold=null "
                         "for rollout.step_schedule=ascending or rollout.eoser_gamma")
    if eoser_gamma is not None and remasking != "low_confidence":
        raise ValueError(f"rollout.eoser_gamma scales a probability: it needs rollout.remasking=low_confidence, "
                         f"not {remasking!r}")
    if gen_length % block:
        raise ValueError(f"gen_length={gen_length} must be a multiple of {what}={block}")
    num_blocks = gen_length // block
    if threshold is None and (steps % num_blocks or steps < num_blocks):
        raise ValueError(f"steps={steps} must be a positive multiple of the number of blocks {num_blocks}")
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; valid: {', '.join(REMASKING)}")
    return num_blocks


def window_state(prompt_ids, prompt_mask, gen_length: int, mask_id: int):
    """(ids with a masked window (B, Tp + L), attention, positions, trace (B, L) of -1, log-probs (B, L) of 0,
    per-row step counters (B,)): a sampler's state before its first step."""
    batch = prompt_ids.shape[0]
    x = torch.cat([prompt_ids, torch.full((batch, gen_length), mask_id, dtype=torch.long)], dim=1)
    attention = torch.cat([prompt_mask, torch.ones((batch, gen_length), dtype=prompt_mask.dtype)], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    trace = torch.full((batch, gen_length), -1, dtype=torch.long)
    return x, attention, positions, trace, torch.zeros((batch, gen_length)), torch.zeros(batch, dtype=torch.long)


def window_rollouts(prompt_ids, prompt_mask, completion, logprobs, trace, forwards: int, *, eos_id: int,
                    window: str) -> Rollouts:
    """A finished window as `Rollouts`: the completion up to EOS (or the full window) scored, the
    rest of the log-probs zeroed, rows without an EOS marked truncated."""
    mask = window_mask(completion, eos_id, window)
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion, completion_mask=mask,
        logprobs=logprobs * mask, truncated=~(completion == eos_id).any(-1), trace=trace, forwards=forwards)


def commit_step(logits, block_ids, seeds, row_steps, *, temperature, remasking, threshold, quota, suppress_eos,
                mask_id: int, eos_id: int, eos_scale: float = 1.0):
    """One denoising step of the current block. logits (B, b, V) float64 of the block,
    block_ids (B, b); `eos_scale` multiplies EOS candidates' scores (EOSER); returns (new block ids,
    commit (B, b) bool, log-probs (B, b), remaining (B,))."""
    masked = block_ids == mask_id
    logits[..., mask_id] = float("-inf")  # the mask token is never a candidate
    tempered, candidates = _candidates(logits, temperature, seeds, row_steps)
    logp = tempered.log_softmax(-1).gather(-1, candidates[..., None]).squeeze(-1)
    score = _scores(logits, candidates, remasking, _row_keys(seeds, row_steps, 0x77))
    if eos_scale != 1.0:
        score = torch.where(candidates == eos_id, score * eos_scale, score)
    if suppress_eos:
        score = torch.where(candidates == eos_id, score - _EOS_PENALTY, score)
    score = torch.where(masked, score, torch.full_like(score, float("-inf")))
    remaining = masked.sum(-1)  # (B,)
    if threshold is None:
        count = torch.clamp(remaining, max=quota)
    else:
        count = torch.minimum(torch.clamp((score >= threshold).sum(-1), min=1), remaining)
    rank = score.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
    commit = (rank < count[:, None]) & masked
    return torch.where(commit, candidates, block_ids), commit, logp, remaining


@torch.no_grad()
def generate_diffusion(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, *,
                       gen_length: int, steps: int, block_length: int | None = None,
                       temperature: float | torch.Tensor = 1.0,
                       remasking: str = "low_confidence", threshold: float | None = None,
                       suppress_eos: bool = False, mask_id: int, eos_id: int,
                       window: str = "eos", fixed: torch.Tensor | None = None, step_schedule: str = "even",
                       eoser_gamma: float | None = None) -> Rollouts:
    """Sample one window per row. prompt_ids/prompt_mask (B, Tp) left-padded, seeds (B,) int.
    `temperature`: one for all rows, or one per row (B,) where 0 decodes that row greedily
    (`rollout.greedy_in_group`). `fixed` (B, gen_length): tokens given in advance, -1 = free.
    `step_schedule`, `eoser_gamma`: CJ-GRPO's decoding scheduler (module doc)."""
    block = block_length or gen_length
    num_blocks = check_schedule(gen_length, block, steps, threshold, remasking, what="block_length",
                                step_schedule=step_schedule, eoser_gamma=eoser_gamma)
    was_training = model.training
    model.eval()
    batch, tp = prompt_ids.shape
    x, attention, positions, trace, logprobs, row_steps = window_state(prompt_ids, prompt_mask, gen_length, mask_id)
    if fixed is not None:
        x[:, tp:] = torch.where(fixed >= 0, fixed.to(torch.long), x[:, tp:])
    forwards = 0
    per_block = steps // num_blocks
    schedule = block_schedule(step_schedule, block, per_block) if threshold is None else None
    for b in range(num_blocks):
        lo, hi = tp + b * block, tp + (b + 1) * block
        s = 0
        while bool((x[:, lo:hi] == mask_id).any()):
            masked = x[:, lo:hi] == mask_id  # (B, b)
            # rows whose block is done skip the forward; rows with identical inputs share one
            logits = distinct_forward(model, x, attention, positions, rows=masked.any(-1))[:, lo:hi].double()
            forwards += 1
            quota = schedule[min(s, len(schedule) - 1)] if schedule is not None else None
            x[:, lo:hi], commit, logp, remaining = commit_step(
                logits, x[:, lo:hi], seeds, row_steps, temperature=temperature, remasking=remasking,
                threshold=threshold, quota=quota, suppress_eos=suppress_eos, mask_id=mask_id, eos_id=eos_id,
                eos_scale=eoser_scale(eoser_gamma, s, per_block, step_schedule))
            trace[:, lo - tp:hi - tp] = torch.where(commit, row_steps[:, None], trace[:, lo - tp:hi - tp])
            logprobs[:, lo - tp:hi - tp] = torch.where(commit, logp.float(), logprobs[:, lo - tp:hi - tp])
            row_steps += (remaining > 0).long()
            s += 1
    model.train(was_training)
    return window_rollouts(prompt_ids, prompt_mask, x[:, tp:], logprobs, trace, forwards, eos_id=eos_id, window=window)


__all__ = ["REMASKING", "STEP_SCHEDULES", "ascending_schedule", "block_schedule", "check_schedule", "commit_step",
           "eoser_scale", "generate_diffusion", "transfer_schedule", "window_state"]
