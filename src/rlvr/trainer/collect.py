"""The rollout phase of a step: prompts -> completions -> verifier scores, with DAPO dynamic sampling.

Dynamic sampling (DAPO) keeps only groups whose rewards vary (a zero-variance group has zero
group-relative advantage, so it costs compute and teaches nothing) and backfills with fresh
prompts for up to `max_sampling_rounds` rounds. If the cap is hit the step trains on the groups
it has (verl raises instead); `batch/kept_group_rate` shows how often groups were dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rlvr.agents.batch import TurnTensors
from rlvr.agents.collect import is_agent_task, rollout_batch
from rlvr.algos.shaping import zero_variance_groups
from rlvr.batch import Rollouts, concat_rollouts
from rlvr.codec import decode_completions, encode_prompts
from rlvr.trainer.plan import RolloutPlan
from rlvr.trainer.scoring import score, scored
from rlvr.types import Example


@dataclass
class Collected:
    """B rows, grouped contiguously by prompt (G rows each)."""

    group: list[Example]       # the example of each row
    rollouts: Rollouts
    texts: list[str]
    rewards: torch.Tensor      # (B,) task reward, NaN = not scorable
    correct: torch.Tensor      # (B,) 1.0 where the verifier says correct
    metrics: dict[str, float]
    baseline_rewards: torch.Tensor | None = None  # (P,) reward of each prompt's greedy completion (ReMax)
    turns: object = None       # agent tasks: the per-turn tensors (`rlvr.agents.batch.TurnTensors`)
    components: torch.Tensor | None = None  # (B, K) each reward function's score when there are several
    component_weights: torch.Tensor | None = None  # (K,) their weights in `rewards`
    component_names: tuple[str, ...] = ()  # (K,) their names

    def component_inputs(self, needs: frozenset[str]) -> dict:
        """The `AdvantageInputs` fields of the reward components, for an estimator that declares
        it reads them (GDPO); none without several reward functions."""
        if "reward_components" not in needs or self.components is None:
            return {}
        return {"reward_components": self.components, "reward_weights": self.component_weights}


@dataclass
class Produced:
    """One step's batch as the rollout side hands it to the learner, with what the rollout side's
    draws were: the learner's minibatch seed (drawn right after the prompts, the same draw in the
    same order as a loop doing both), and the prompt RNG and selector state after this batch, which
    a checkpoint of this step records (under async rollouts the live ones are already ahead)."""

    got: Collected
    rollout_s: float
    minibatch_seed: int
    selector_metrics: dict[str, float]
    task_rng: object
    selector_state: dict | None
    version: int = 0    # policy version of the weights that sampled it
    staleness: int = 0  # learner's version when it trains on the batch minus `version`
    facts: dict[str, float] = field(default_factory=dict)  # the rollout side's own metrics (async/...)


def produce(c, step: int) -> Produced:
    """Roll out and score step `step`'s batch, then draw the learner's minibatch seed from the run RNG."""
    t0 = time.perf_counter()
    got = collect(c, step)
    rollout_s = time.perf_counter() - t0
    seed = c.rng.getrandbits(62)
    selector = c.selector
    return Produced(got, rollout_s, seed, selector.metrics() if selector is not None else {}, c.rng.getstate(),
                    selector.state_dict() if selector is not None else None)


def sample_seeds(seed: int, step: int, count: int, offset: int = 0) -> torch.Tensor:
    """Per-completion sampling seeds, a pure function of (run seed, step, index)."""
    return (seed * 1_000_003 + step) * 65_536 + offset + torch.arange(count, dtype=torch.long)


def row_temperatures(r: RolloutPlan, rows: int) -> float | torch.Tensor:
    """The sampling temperature, or with `rollout.greedy_in_group` one per row: 0 (greedy) for the
    last row of every group. The greedy decode is what evaluation scores; as a group member its
    advantage is negative exactly when samples of the same prompt beat it, which moves the mode."""
    if not r.greedy_in_group:
        return r.temperature
    temperature = torch.full((rows,), float(r.temperature))
    temperature[r.group_size - 1::r.group_size] = 0.0
    return temperature


def _prompts(c, n: int) -> list[Example]:
    """This round's `n` prompts: uniform task draws, or the selector's pick from more candidates."""
    if c.selector is None:
        return c.task.sample(n, c.rng)
    return c.selector.choose(c.task.sample(c.selector.num_candidates(n), c.rng), n)


def _one_round(c, step: int, round_index: int) -> Collected:
    r = c.plan.rollout
    examples = _prompts(c, r.prompts_per_step)
    group = [ex for ex in examples for _ in range(r.group_size)]  # rows p*G .. p*G+G-1 share prompt p
    prompt_ids, prompt_mask = encode_prompts(c.tokenizer, [ex.prompt for ex in group])
    seeds = sample_seeds(r.seed, step, len(group), offset=round_index * len(group))
    if is_agent_task(c.task):  # multi-turn episodes: the environment scores them
        got = rollout_batch(c.engine, c.tokenizer, c.task, group, seeds, temperature=row_temperatures(r, len(group)))
        return Collected(group, got.rollouts, got.texts, got.rewards, got.correct, got.metrics, turns=got.turns)
    rollouts = c.engine(prompt_ids, prompt_mask, seeds, temperature=row_temperatures(r, len(group)))
    texts = decode_completions(c.tokenizer, rollouts)
    s = scored(c.reward, c.task, group, texts)
    if c.selector is not None:  # every generated group informs its prompt's posterior, kept or not
        for ex, wins in zip(examples, s.correct.view(-1, r.group_size).sum(-1).tolist()):
            c.selector.observe(ex.prompt, wins, r.group_size)
    return Collected(group, rollouts, texts, s.rewards, s.correct, {f"reward/{k}": v for k, v in s.metrics.items()},
                     components=s.components, component_weights=s.weights, component_names=s.names)


def greedy_baseline(c, group: list[Example]) -> torch.Tensor:
    """ReMax's baseline: (P,) rewards of one greedy completion per prompt of `group` (G rows each)."""
    examples = group[::c.plan.rollout.group_size]
    ids, mask = encode_prompts(c.tokenizer, [ex.prompt for ex in examples])
    out = c.engine(ids, mask, torch.zeros(len(examples), dtype=torch.long), temperature=0.0)
    rewards, _, _ = score(c.reward, c.task, examples, decode_completions(c.tokenizer, out))
    return rewards


def collect(c, step: int) -> Collected:
    """Roll out and score one step's batch (several rounds under dynamic sampling), and the greedy
    baseline when the advantage estimator declared it reads one (ReMax)."""
    got = _collect_rounds(c, step)
    if c.plan.rollout.greedy_baseline:
        got.baseline_rewards = greedy_baseline(c, got.group)
    return got


def _collect_rounds(c, step: int) -> Collected:
    r = c.plan.rollout
    first = _one_round(c, step, 0)
    if not r.dynamic_sampling:
        return first
    reward_metrics = first.metrics
    kept, generated = [], 0
    batch = first
    for round_index in range(r.max_sampling_rounds):
        if round_index:
            batch = _one_round(c, step, round_index)
        generated += r.prompts_per_step
        keep = ~zero_variance_groups(batch.rewards, r.group_size)
        rows = keep.repeat_interleave(r.group_size).nonzero().squeeze(-1)
        if len(rows):
            kept.append(_select(batch, rows))
        if sum(len(k.group) for k in kept) >= r.prompts_per_step * r.group_size:
            break
    kept_groups = sum(len(k.group) for k in kept) // r.group_size
    if not kept:  # nothing varied: train on the first round (its advantages are all 0)
        kept = [first]
    merged = _merge(kept, c.tokenizer.pad_token_id, r.prompts_per_step * r.group_size)
    merged.metrics = {**reward_metrics, "batch/kept_group_rate": kept_groups / generated,
                      "batch/sampling_rounds": float(round_index + 1)}
    return merged


def _select(b: Collected, rows: torch.Tensor) -> Collected:
    idx = rows.tolist()
    return Collected([b.group[i] for i in idx], b.rollouts.select(rows), [b.texts[i] for i in idx],
                     b.rewards[rows], b.correct[rows], {}, turns=None if b.turns is None else b.turns.select(rows),
                     components=None if b.components is None else b.components[rows],
                     component_weights=b.component_weights, component_names=b.component_names)


def _merge(parts: list[Collected], pad_id: int, limit: int) -> Collected:
    merged = Collected(
        group=[g for p in parts for g in p.group][:limit],
        rollouts=concat_rollouts([p.rollouts for p in parts], pad_id),
        texts=[t for p in parts for t in p.texts][:limit],
        rewards=torch.cat([p.rewards for p in parts])[:limit],
        correct=torch.cat([p.correct for p in parts])[:limit],
        metrics={},
        components=None if parts[0].components is None else torch.cat([p.components for p in parts])[:limit],
        component_weights=parts[0].component_weights, component_names=parts[0].component_names,
    )
    merged.rollouts = merged.rollouts.select(torch.arange(len(merged.group)))
    if parts[0].turns is not None:  # agent tasks: the per-turn tensors travel with their rows
        merged.turns = TurnTensors.concat([p.turns for p in parts]).select(torch.arange(len(merged.group)))
    return merged
