"""Off-policy expert rows in an RL step (CHORD, RL-PLUS; config section `expert`).

Each step, `expert.per_step` problems are drawn from a fixed pool (or fresh, `pool_size=0`), their
reference solutions (`task.solution`) become completions, and they are appended to the step's
`TrainBatch` after the on-policy rows, marked by `TrainBatch.expert`. Their `rollout_logp` is the
expert's behaviour log-prob: 0 (probability 1) for a task's exact solutions, the papers' "expert
distribution" whose log-probs are unknown. `TrainBatch.sample_weight` mixes the two losses as
(1 − μ) L_on + μ L_expert (`rlvr.algos.hybrid.mix_weights`). The on-policy rows keep their own
advantages and objective; the update step sends the expert rows to the expert objective
(`split_loss`). The draws are a pure function of (seed, step), so a resumed run redraws them
exactly and the on-policy prompt stream is the one a run without expert rows sees.

Masked-diffusion models (ERILS, `rlvr.algos.erils`): the rows are length-controlled to the
sampler's window (`Canvas`: solution + EOS, EOS-padded to `rollout.max_new_tokens`, their mask the
rollout's `window`), so the estimator scores them exactly as it scores the engine's rollouts;
`expert.advantage=source` standardises the external rewards against their own source only.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from rlvr.algos.erils import canvas_rows, per_source_advantages
from rlvr.algos.hybrid import expert_advantages, mix_weights
from rlvr.batch import TrainBatch, concat_train_batches
from rlvr.codec import completion_batch, encode_prompts
from rlvr.errors import ConfigError
from rlvr.models.likelihood import window_mask
from rlvr.protocols import BatchVerifier, PolicyModel, Task
from rlvr.trainer.logit_stats import reward_tokens
from rlvr.trainer.parts import ExpertRows
from rlvr.trainer.plan import Canvas, ExpertPlan
from rlvr.trainer.scoring import score
from rlvr.types import Example

__all__ = ["Canvas", "ExpertSource", "add_expert_rows", "canvas_part", "expert_part", "extend", "external_advantages",
           "split_loss"]


class ExpertSource:
    """The expert problems of a run: a fixed pool of `pool_size` (or fresh draws) and their solutions."""

    def __init__(self, task: Task, *, seed: int, per_step: int, pool_size: int):
        self.task, self.seed, self.per_step = task, seed, per_step
        self.pool = task.sample(pool_size, random.Random(f"expert-pool/{seed}")) if pool_size else None

    def draw(self, step: int) -> list[Example]:
        """This step's expert problems: distinct pool entries while the pool is large enough."""
        rng = random.Random(f"expert/{self.seed}/{step}")
        if self.pool is None:
            return self.task.sample(self.per_step, rng)
        if self.per_step <= len(self.pool):
            return rng.sample(self.pool, self.per_step)
        return rng.choices(self.pool, k=self.per_step)

    def solutions(self, examples: list[Example]) -> tuple[list[Example], list[str]]:
        """(examples, solution texts), leaving out problems without a solution."""
        kept, texts = [], []
        for ex in examples:
            try:
                text = self.task.solution(ex)
            except NotImplementedError as err:
                raise ConfigError(f"expert.per_step: {err}; set the task's solution_key or expert.per_step=0") from None
            if text:
                kept.append(ex)
                texts.append(text)
        return kept, texts


def expert_part(tokenizer, examples: list[Example], texts: list[str]) -> TrainBatch:
    """The expert rows as a TrainBatch: prompts left-padded, solution + EOS right-padded,
    behaviour log-probs 0 (a deterministic expert), advantages still 0."""

    return _expert_batch(tokenizer, examples, *completion_batch(tokenizer, texts))


def _expert_batch(tokenizer, examples: list[Example], completion_ids: torch.Tensor,
                  completion_mask: torch.Tensor) -> TrainBatch:
    """Expert rows from their completions: prompts left-padded, behaviour log-probs and advantages 0."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [ex.prompt for ex in examples])
    zeros = torch.zeros_like(completion_mask)
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, advantages=zeros.clone(),
                      rollout_logp=zeros, expert=torch.ones(len(examples), dtype=torch.bool))


def canvas_part(tokenizer, examples: list[Example], texts: list[str],
                canvas: Canvas) -> tuple[TrainBatch, list[bool]]:
    """Length-controlled expert rows for a diffusion model (`canvas_rows`): (the rows that fit
    the window, as `expert_part` builds them, and which of `texts` fit)."""
    ids, fits = canvas_rows([tokenizer(t, add_special_tokens=False).input_ids for t in texts], canvas.gen_length,
                            tokenizer.eos_token_id)
    kept = fits.tolist()
    completion_ids = ids[fits]
    part = _expert_batch(tokenizer, [ex for ex, k in zip(examples, kept) if k], completion_ids,
                         window_mask(completion_ids, tokenizer.eos_token_id, canvas.window))
    return part, kept


ADVANTAGES = ("batch", "source")
"""How expert rows' rewards become advantages (`expert.advantage`)."""


def external_advantages(kind: str, expert_rewards: torch.Tensor, onpolicy_rewards: torch.Tensor,
                        group_size: int) -> torch.Tensor:
    """(E,) the expert rows' advantages: `batch` standardises them against the whole step's
    rewards (`expert_advantages`, joint processing); `source` against the expert rows' own
    (`per_source_advantages` with the on-policy rows in their prompt groups, ERILS)."""
    if kind == "batch":
        return expert_advantages(expert_rewards, onpolicy_rewards)
    if kind != "source":
        raise ValueError(f"expert.advantage must be one of {', '.join(ADVANTAGES)}, got {kind!r}")
    n, e = len(onpolicy_rewards), len(expert_rewards)
    groups = torch.cat([torch.arange(n) // group_size, torch.zeros(e, dtype=torch.long)])
    sources = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(e, dtype=torch.long)])
    return per_source_advantages(torch.cat([onpolicy_rewards.float(), expert_rewards.float()]), groups, sources)[n:]


def extend(batch: TrainBatch, part: TrainBatch, *, onpolicy_rewards: torch.Tensor, expert_rewards: torch.Tensor,
           mu: float, keep_onpolicy: bool, token_units: bool, pad_id: int,
           logprobs: Callable[..., dict[str, torch.Tensor]], advantage: str = "batch",
           group_size: int = 1) -> TrainBatch:
    """`batch` (on-policy rows) with the expert rows `part` appended: their advantages, the
    old / reference log-probs (and the reference's logsumexp, the token rewards) and correction
    weights the on-policy rows have (from `logprobs(kind, part, stats)` -> {"logp", *stats}, kind
    `old` or `ref`), the expert flags and the mixing weights. `advantage`: `external_advantages`'
    kind, `group_size` the on-policy rows' prompt groups."""
    adv = external_advantages(advantage, expert_rewards, onpolicy_rewards, group_size)
    part.advantages = adv[:, None] * part.completion_mask
    if batch.old_logp is not None:
        part.old_logp = logprobs("old", part, ())["logp"]
    if batch.ref_logp is not None:
        ref = logprobs("ref", part, () if batch.ref_logsumexp is None else ("logsumexp",))
        part.ref_logp, part.ref_logsumexp = ref["logp"], ref.get("logsumexp")
    if batch.token_rewards is not None:
        part.token_rewards = reward_tokens(expert_rewards, part.completion_mask)
    if batch.loss_weights is not None:  # the rollout correction is for the engine's samples only
        part.loss_weights = part.completion_mask.clone()
    if batch.trace is not None:
        part.trace = torch.zeros_like(part.completion_ids)
    batch.expert = torch.zeros(len(batch), dtype=torch.bool)
    if batch.rollout_logp is None:
        batch.rollout_logp = torch.zeros_like(batch.completion_mask)
    merged = concat_train_batches([batch, part], pad_id)
    units = merged.completion_mask.sum(-1) if token_units else (merged.completion_mask.sum(-1) > 0).float()
    merged.sample_weight = mix_weights(merged.expert, mu, keep_onpolicy=keep_onpolicy, units=units)
    return merged


def split_loss(objective: Callable, expert_objective: Callable, logp: torch.Tensor, old: torch.Tensor,
               mb: TrainBatch, mask: torch.Tensor,
               data: dict | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (B, T): the on-policy objective on on-policy rows, the expert objective on
    expert rows (with the expert's behaviour log-probs); metrics of both, the expert's prefixed
    `expert_`, zero on the other side's rows. The step divides every metric by all its tokens, so
    an expert metric's mean over expert tokens is `actor/expert_<name>` / `actor/expert_token_frac`.
    `data`: the objective's data keywords (B, T) (`rlvr.trainer.logit_stats.loss_outputs`), sliced to its rows."""
    flags = mb.expert.to(logp.device)
    data = data or {}
    loss = torch.zeros_like(logp)
    metrics: dict[str, torch.Tensor] = {}
    sides = ((~flags, "", lambda rows: objective(logp[rows], old[rows], mb.advantages[rows], mask[rows],
                                                 **{k: v[rows] for k, v in data.items()})),
             (flags, "expert_", lambda rows: expert_objective(
                 logp[rows], old[rows], None if mb.rollout_logp is None else mb.rollout_logp[rows],
                 mb.advantages[rows], mask[rows])))
    for chosen, prefix, run in sides:
        rows = chosen.nonzero().squeeze(-1)
        if not len(rows):
            continue
        part_loss, part_metrics = run(rows)
        loss = loss.index_put((rows,), part_loss)
        for name, value in part_metrics.items():
            metrics[prefix + name] = torch.zeros_like(logp).index_put((rows,), value.detach().to(logp.dtype))
    metrics["expert_token_frac"] = flags[:, None].to(logp.dtype).expand_as(logp)
    return loss, metrics


def add_expert_rows(source: ExpertRows, e: ExpertPlan, batch: TrainBatch, rewards: torch.Tensor, step: int, *,
                    tokenizer, task: Task, reward: BatchVerifier, policies: dict[str, PolicyModel | None],
                    group_size: int, logprobs: Callable) -> tuple[TrainBatch, dict]:
    """The step's batch with `source`'s rows appended (`extend`), and their metrics. `policies`:
    the `old` (the learner's) and `ref` (the reference) policies; `logprobs(policy, part, stats)`:
    the loop's no-grad pass, {"logp", *stats}."""
    examples, texts = source.solutions(source.draw(step))
    dropped = {}
    if e.canvas is None:
        part = expert_part(tokenizer, examples, texts)
    else:  # length control: only solutions that fit the diffusion window, EOS-padded to it
        part, kept = canvas_part(tokenizer, examples, texts, e.canvas)
        dropped = {"expert/dropped_too_long": float(len(kept) - sum(kept))}
        examples, texts = [x for x, k in zip(examples, kept) if k], [t for t, k in zip(texts, kept) if k]
    if not examples:
        return batch, dropped
    expert_rewards, correct, _ = score(reward, task, examples, texts)
    mu = e.mu(step)
    merged = extend(batch, part, onpolicy_rewards=rewards,
                    expert_rewards=expert_rewards, mu=mu, keep_onpolicy=e.keep_onpolicy,
                    token_units=e.token_units, pad_id=tokenizer.pad_token_id,
                    logprobs=lambda kind, part, stats: logprobs(policies[kind], part, stats),
                    advantage=e.advantage, group_size=group_size)
    adv = merged.advantages[merged.expert].sum(-1) / merged.completion_mask[merged.expert].sum(-1).clamp(min=1)
    return merged, {"expert/mu": mu, "expert/rows": float(len(examples)), "expert/accuracy": float(correct.mean()),
                    "expert/advantage_mean": float(adv.mean()), **dropped}
