"""The rollout phase of a step: the sampler's requests -> completions -> verifier scores, the
group filter, and the sampler's feedback.

The sampler (`RolloutParts.sampler`, `rlvr.sampling`) proposes the prompts and each one's number of
completions; after scoring, every request's verdicts go back to it, kept or not. The plan's group
filter (DAPO dynamic sampling) keeps only groups whose rewards vary (a zero-variance group has
zero group-relative advantage, so it costs compute and teaches nothing) and asks for more rounds
until the batch is full or its cap is spent. At the cap the step trains on the groups it has
(verl raises instead); `batch/kept_group_rate` shows how often groups were dropped, and
`batch/generated_tokens` counts every completion token generated, dropped groups' included (the
cost to compare samplers by).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from rlvr.agents.batch import TurnTensors
from rlvr.agents.collect import rollout_batch
from rlvr.batch import Rollouts, concat_rollouts
from rlvr.codec import completion_token_ids, decode_completions, encode_examples, encode_prompts
from rlvr.protocols import RolloutEngine
from rlvr.sampling.base import GroupFeedback, Request
from rlvr.sampling.calibration import Calibration, calibration_metrics, mc_pass_rates
from rlvr.trainer.inpaint import inpaint_round
from rlvr.trainer.parts import RolloutParts
from rlvr.trainer.plan import RolloutPlan
from rlvr.trainer.scoring import Collected, score, scored
from rlvr.types import Example

__all__ = ["Collected", "Drawn", "Produced", "collect", "draw", "draws_ahead", "produce", "produce_ahead", "roll",
           "sample_seeds", "scores_ahead", "stale_by"]


@dataclass(frozen=True)
class Produced:
    """One step's batch as the rollout side hands it to the learner, with what the rollout side's
    draws were: the learner's minibatch seed (drawn right after the prompts, the same draw in the
    same order as a loop doing both), and the prompt RNG and sampler state after this batch, which
    a checkpoint of this step records (under async rollouts the live ones are already ahead)."""

    got: Collected
    rollout_s: float
    minibatch_seed: int
    sampler_metrics: dict[str, float]
    task_rng: object
    sampler_state: dict | None
    replay_state: dict | None = None  # the replay buffer after this batch (rollout replay on)
    version: int = 0    # policy version of the weights that sampled it
    staleness: int = 0  # learner's version when it trains on the batch minus `version`
    facts: dict[str, float] = field(default_factory=dict)  # the rollout side's own metrics (async/...)
    # (B, Tc) float: 1 on the tokens within the per-token staleness bound (`token_staleness.within_bound`);
    # None = every token trains
    within_bound: torch.Tensor | None = None


def produce(r: RolloutParts, step: int, version: int | None = None) -> Produced:
    """Roll out and score step `step`'s batch with policy version `version` (None: step - 1, as
    the synchronous loop samples it), then draw the learner's minibatch seed from the run RNG."""
    t0 = time.perf_counter()
    version = step - 1 if version is None else version
    got = collect(r, step, version)
    rollout_s = time.perf_counter() - t0
    seed = r.rng.getrandbits(62)
    sampler_metrics = r.sampler.metrics()
    probe = r.plan.calibration
    if probe is not None and step % probe.every == 0:
        sampler_metrics.update(calibrate(r, step, got.group[::r.plan.group_size], probe))
    produced = Produced(got, rollout_s, seed, sampler_metrics, r.rng.getstate(), r.sampler.state_dict(),
                        r.replay.state_dict() if r.replay is not None else None, version=version)
    return replace(produced, staleness=stale_by(produced, step))


def draws_ahead(r: RolloutParts) -> str:
    """Why a batch's draws (its prompts, seeds and the learner's minibatch seed) cannot all be made
    before the batches ahead of it are scored; '' when they can. Nothing that samples may read a
    reward first: one round (a group filter that never refills), no replay, no hints (IGPO), no
    greedy baseline, no calibration probe, no drafts kept between batches (SPEC-RL), and a sampler
    that reads no feedback (uniform draws)."""
    p = r.plan
    one_round = p.group_filter is None or not p.group_filter.refill(0, 1, 1)  # a filter that only drops groups
    reasons = [(p.sampler_feedback, "a prompt sampler that reads rewards (sampler.name)"),
               (not one_round, "dynamic sampling's refill rounds (algo.max_sampling_rounds > 1)"),
               (r.replay is not None, "rollout replay"), (p.inpaint is not None, "hinted groups (IGPO)"),
               (p.greedy_baseline, "a greedy baseline (ReMax)"), (p.calibration is not None, "the calibration probe"),
               (r.speculative is not None, "SPEC-RL's drafts")]
    return next((why for hit, why in reasons if hit), "")


def scores_ahead(r: RolloutParts) -> bool:
    """Whether a batch can be scored while the next one samples (`produce_ahead`): its draws come
    first (`draws_ahead`) and it is a single-turn task (an agent's environment scores as it goes)."""
    return not draws_ahead(r) and not r.plan.agent


@dataclass
class Drawn:
    """A batch's draws from the run RNG and the sampler, made in step order before it is rolled out:
    the requests, each row's example and sampling seed, the learner's minibatch seed, and the
    prompt RNG and sampler state after them (what a checkpoint of its step records)."""

    requests: list[Request]
    group: list[Example]
    seeds: torch.Tensor
    minibatch_seed: int
    sampler_metrics: dict[str, float]
    task_rng: object
    sampler_state: dict | None


def draw(r: RolloutParts, step: int) -> Drawn:
    """Step `step`'s draws, in `produce`'s order (the uniform sampler's feedback draws nothing, so
    nothing drawn later depends on how the batch fares: `draws_ahead`)."""
    requests, group, seeds = _requests(r, step, 0, r.plan.prompts_per_step)
    return Drawn(requests, group, seeds, r.rng.getrandbits(62), r.sampler.metrics(), r.rng.getstate(),
                 r.sampler.state_dict())


def roll(r: RolloutParts, d: Drawn, step: int, version: int) -> Produced:
    """Roll out and score the drawn batch of `step` with policy version `version` (the engine's):
    the same batch `produce` makes from the same draws, in any thread, beside other batches."""
    t0 = time.perf_counter()
    first = _agent_round(r, d.group, d.seeds) if r.plan.agent else \
        _score_round(r, _sampled(r, d.requests, d.group, d.seeds))
    got = _filled(r, step, version, r.plan.prompts_per_step, d.requests, first)
    produced = Produced(got, time.perf_counter() - t0, d.minibatch_seed, d.sampler_metrics, d.task_rng,
                        d.sampler_state, version=version)
    return replace(produced, staleness=stale_by(produced, step))


def produce_ahead(r: RolloutParts, step: int, version: int) -> tuple[Callable[[], Produced], float]:
    """Sample step `step`'s batch with policy version `version` now; (the job that scores it,
    the seconds sampling took). The run RNG's draws all happen here, in `produce`'s order (`draw`),
    so the job may run while the next batch samples, and with the batches trained in order the run
    is `produce`'s draw for draw."""
    t0 = time.perf_counter()
    d = draw(r, step)
    sampled = _sampled(r, d.requests, d.group, d.seeds)
    sample_s = time.perf_counter() - t0

    def score_it() -> Produced:
        t1 = time.perf_counter()
        got = _filled(r, step, version, r.plan.prompts_per_step, sampled.requests, _score_round(r, sampled))
        produced = Produced(got, sample_s + time.perf_counter() - t1, d.minibatch_seed, d.sampler_metrics,
                            d.task_rng, d.sampler_state, version=version)
        return replace(produced, staleness=stale_by(produced, step))

    return score_it, sample_s


CALIBRATION_OFFSET = 1 << 15
"""Seed offset of the calibration probe's completions: past any step's training rows (fewer than
2^15 per step), so the probe never reuses a training completion's seed."""


def calibrate(r: RolloutParts, step: int, examples: list[Example], probe: Calibration) -> dict[str, float]:
    """Roll the first `probe.prompts` distinct prompts of `examples` out `probe.rollouts` times with
    the current engine and seeds of their own, and score the sampler's predicted pass rates for
    them against the solved fractions (`sampling.calibration`). The completions go nowhere else."""
    unique = list({ex.prompt: ex for ex in examples}.values())[:probe.prompts]
    group = [ex for ex in unique for _ in range(probe.rollouts)]
    ids, mask = encode_prompts(r.tokenizer, [ex.prompt for ex in group])
    seeds = sample_seeds(r.plan.seed, step, len(group), offset=CALIBRATION_OFFSET)
    out = r.engine(ids, mask, seeds, temperature=r.plan.temperature)
    rewards, correct, _ = score(r.reward, r.task, group, decode_completions(r.tokenizer, out))
    estimated = mc_pass_rates(correct.tolist(), (~torch.isnan(rewards)).tolist(), probe.rollouts)
    _, metrics = calibration_metrics(r.sampler.predict(step, unique), estimated, rollouts=probe.rollouts)
    return {**metrics, "sampler/calibration_tokens": float(out.lengths.sum())}


def stale_by(produced: Produced, step: int) -> int:
    """How many versions the batch of `step` is behind the learner (which trains it with step - 1):
    its sampling version's, or its oldest replayed group's if older."""
    oldest = produced.got.oldest_version
    return (step - 1) - (produced.version if oldest is None else min(oldest, produced.version))


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


def generate(engine: RolloutEngine, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
             temperature: float | torch.Tensor, *, group_size: int, micro_group_size: int, pad_id: int,
             extras: dict | None = None):
    """The engine's completions of B rows grouped by `group_size`, generated in passes of
    `micro_group_size` rows per group (Infinite Sampling's micro-groups). A row's completion
    depends only on its prompt and seed, so the passes give the completions of one pass; the
    groups are whole again before anything reads them. `extras`: the rows' other engine keywords
    (a vision-language model's `vision` rows), indexed by row as the prompts are."""
    extras = extras or {}
    passes = group_size // micro_group_size
    if passes == 1:
        return engine(prompt_ids, prompt_mask, seeds, temperature=temperature, **extras)
    rows = torch.arange(len(seeds)).view(-1, passes, micro_group_size)  # (groups, passes, m)
    parts = []
    for j in range(passes):
        idx = rows[:, j].reshape(-1)
        t = temperature[idx] if isinstance(temperature, torch.Tensor) else temperature
        parts.append(engine(prompt_ids[idx], prompt_mask[idx], seeds[idx], temperature=t,
                            **{k: v[idx] for k, v in extras.items()}))
    order = torch.cat([rows[:, j].reshape(-1) for j in range(passes)])  # merged row i is batch row order[i]
    return concat_rollouts(parts, pad_id).select(torch.argsort(order))


def feedback(requests: list[Request], got: Collected, kept: torch.Tensor | None, *, step: int, version: int,
             group_size: int) -> list[GroupFeedback]:
    """One record per request of a round: its rows' rewards, verdicts and truncations, its
    generated tokens, and whether the filter kept any of its groups (`kept` (groups,) bool)."""
    records, row = [], 0
    lengths = got.rollouts.lengths.tolist()
    for req in requests:
        end = row + req.n_rollouts
        kept_any = True if kept is None else bool(kept[row // group_size:end // group_size].any())
        records.append(GroupFeedback(
            prompt_id=req.prompt_id, source=req.source, step=step, policy_version=version,
            rewards=tuple(got.rewards[row:end].tolist()), correct=tuple(got.correct[row:end].tolist()),
            truncated=tuple(got.rollouts.truncated[row:end].tolist()), gen_tokens=int(sum(lengths[row:end])),
            kept=kept_any))
        row = end
    return records


@dataclass
class Sampled:
    """One round's completions before the verifier has seen them."""

    requests: list[Request]
    group: list[Example]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    seeds: torch.Tensor
    rollouts: Rollouts
    texts: list[str]
    metrics: dict[str, float]  # of the sampling (SPEC-RL's reuse), beside the verifier's


def _requests(r: RolloutParts, step: int, round_index: int,
              n_prompts: int) -> tuple[list[Request], list[Example], torch.Tensor]:
    """The round's prompt requests, the example of each row and the rows' sampling seeds."""
    requests = r.sampler.propose(step, n_prompts, n_prompts * r.plan.group_size)
    group = [req.example for req in requests for _ in range(req.n_rollouts)]  # each group of G rows shares a prompt
    return requests, group, sample_seeds(r.plan.seed, step, len(group), offset=round_index * len(group))


def _sample_round(r: RolloutParts, step: int, round_index: int, n_prompts: int) -> Sampled:
    return _sampled(r, *_requests(r, step, round_index, n_prompts))


def _sampled(r: RolloutParts, requests: list[Request], group: list[Example], seeds: torch.Tensor) -> Sampled:
    """The round's completions of `group` (one row per example) with `seeds`, not yet scored."""
    p = r.plan
    prompt_ids, prompt_mask, extras = encode_examples(r.tokenizer, group)
    metrics = {}
    if r.speculative is not None:  # SPEC-RL: each row's draft is its (prompt, slot)'s last completion
        keys = [(req.prompt_id, j) for req in requests for j in range(req.n_rollouts)]
        rollouts, metrics = r.speculative(keys, prompt_ids, prompt_mask, seeds)
    else:
        rollouts = generate(r.engine, prompt_ids, prompt_mask, seeds, row_temperatures(p, len(group)),
                            group_size=p.group_size, micro_group_size=p.micro_group_size,
                            pad_id=r.tokenizer.pad_token_id, extras=extras)
    return Sampled(requests, group, prompt_ids, prompt_mask, seeds, rollouts, decode_completions(r.tokenizer, rollouts),
                   metrics)


def _score_round(r: RolloutParts, s: Sampled) -> Collected:
    p = r.plan
    v = scored(r.reward, r.task, s.group, s.texts, completion_token_ids(r.tokenizer, s.rollouts))
    metrics = {**{f"reward/{k}": x for k, x in v.metrics.items()}, **s.metrics}
    got = Collected(s.group, s.rollouts, s.texts, v.rewards, v.correct, metrics,
                    components=v.components, component_weights=v.weights, component_names=v.names)
    if p.inpaint is not None:  # IGPO: groups with no correct completion get hinted ones (trainer/inpaint.py)
        got = inpaint_round(r, p.inpaint, got, s.prompt_ids, s.prompt_mask, s.seeds,
                            row_temperatures(p, len(s.group)), p.group_size)
    return got


def _one_round(r: RolloutParts, step: int, round_index: int, n_prompts: int) -> tuple[list[Request], Collected]:
    if r.plan.agent:  # multi-turn episodes: the environment scores them
        requests, group, seeds = _requests(r, step, round_index, n_prompts)
        return requests, _agent_round(r, group, seeds)
    sampled = _sample_round(r, step, round_index, n_prompts)
    return sampled.requests, _score_round(r, sampled)


def _agent_round(r: RolloutParts, group: list[Example], seeds: torch.Tensor) -> Collected:
    """One episode per row of `group`, scored by its environment (and a process reward model's turn rewards)."""
    got = rollout_batch(r.engine, r.tokenizer, r.task, group, seeds,
                        temperature=row_temperatures(r.plan, len(group)))
    if r.turn_reward is not None:
        got = r.turn_reward(got, r.tokenizer, [ex.prompt for ex in group])
    return Collected(group, got.rollouts, got.texts, got.rewards, got.correct, got.metrics, turns=got.turns)


def greedy_baseline(r: RolloutParts, group: list[Example]) -> torch.Tensor:
    """ReMax's baseline: (P,) rewards of one greedy completion per prompt of `group` (G rows each)."""
    examples = group[::r.plan.group_size]
    ids, mask = encode_prompts(r.tokenizer, [ex.prompt for ex in examples])
    out = r.engine(ids, mask, torch.zeros(len(examples), dtype=torch.long), temperature=0.0)
    rewards, _, _ = score(r.reward, r.task, examples, decode_completions(r.tokenizer, out))
    return rewards


def collect(r: RolloutParts, step: int, version: int | None = None) -> Collected:
    """Roll out and score one step's batch (several rounds under dynamic sampling) sampled by
    policy version `version` (None: step - 1), and the greedy baseline when the advantage
    estimator declared it reads one (ReMax)."""
    version = step - 1 if version is None else version
    p = r.plan
    replayed = r.replay.draw(r.replay.slots(p.prompts_per_step)) if r.replay is not None else []
    got = _collect_rounds(r, step, version, p.prompts_per_step - len(replayed))
    if r.replay is not None:  # the fresh groups join the buffer; the drawn ones join the batch
        r.replay.add(version, [_select(got, torch.arange(g, g + p.group_size))
                               for g in range(0, len(got.group), p.group_size)])
        if replayed:
            merged = _merge([got, *(g for _, g in replayed)], r.tokenizer.pad_token_id,
                            len(got.group) + len(replayed) * p.group_size)
            got = replace(merged, metrics={**got.metrics, "batch/replayed_groups": float(len(replayed))},
                          oldest_version=min(v for v, _ in replayed))
    if p.greedy_baseline:
        got = replace(got, baseline_rewards=greedy_baseline(r, got.group))
    return got


def _collect_rounds(r: RolloutParts, step: int, version: int, n_prompts: int) -> Collected:
    """`n_prompts` fresh groups, filtered and refilled as the plan's group filter says."""
    requests, first = _one_round(r, step, 0, n_prompts)
    return _filled(r, step, version, n_prompts, requests, first)


def _filled(r: RolloutParts, step: int, version: int, n_prompts: int, requests: list[Request],
            first: Collected) -> Collected:
    """The first round's groups, filtered and refilled as the plan's group filter says."""
    group_size = r.plan.group_size
    flt = r.plan.group_filter
    if flt is None:
        records = feedback(requests, first, None, step=step, version=version, group_size=group_size)
        r.sampler.observe(step, records)
        return replace(first, metrics={**first.metrics, **_cost(records), **generated_scores([first])})
    kept, generated, kept_groups, batch, rounds, every = [], 0, 0, first, 0, []
    rolled = []  # every round's batch, kept or not: what `generated_scores` averages
    while True:
        if rounds:
            requests, batch = _one_round(r, step, rounds, n_prompts)
        rounds += 1
        rolled.append(batch)
        generated += n_prompts
        keep = flt.keep(batch.rewards, batch.correct, group_size)
        records = feedback(requests, batch, keep, step=step, version=version, group_size=group_size)
        r.sampler.observe(step, records)  # every generated group informs the sampler, kept or not
        every += records
        rows = keep.repeat_interleave(group_size).nonzero().squeeze(-1)
        if len(rows):
            kept.append(_select(batch, rows))
        kept_groups = sum(len(k.group) for k in kept) // group_size
        if not flt.refill(kept_groups, n_prompts, rounds):
            break
    if not kept:  # nothing varied: train on the first round (its advantages are all 0)
        kept = [first]
    merged = _merge(kept, r.tokenizer.pad_token_id, n_prompts * group_size)
    return replace(merged, metrics={**first.metrics, "batch/kept_group_rate": kept_groups / generated,
                                    "batch/sampling_rounds": float(rounds), **_cost(every),
                                    **generated_scores(rolled)})


def generated_scores(batches: list[Collected]) -> dict[str, float]:
    """Reward and accuracy over every completion the step generated, the groups a filter dropped
    included (TRL's `reward`); `reward/mean` and `reward/accuracy` are over the trained batch."""
    rewards = torch.cat([b.rewards for b in batches])
    scored = rewards[~torch.isnan(rewards)]
    correct = torch.cat([b.correct for b in batches])
    return {"reward/generated_mean": float(scored.mean()) if len(scored) else 0.0,
            "reward/generated_max": float(scored.max()) if len(scored) else 0.0,
            "reward/generated_accuracy": float(correct.float().mean()) if len(correct) else 0.0}


def _cost(records: list[GroupFeedback]) -> dict[str, float]:
    """What the step's generations cost and how many taught nothing about correctness: completion
    tokens of every generated request, and the fraction of requests whose verdicts all agree (all
    solved or none; shaped rewards such as a format credit can still vary inside such a group)."""
    ties = sum(len(set(f.correct)) <= 1 for f in records)
    return {"batch/generated_tokens": float(sum(f.gen_tokens for f in records)),
            "batch/solve_tie_group_frac": ties / max(len(records), 1)}


def _select(b: Collected, rows: torch.Tensor) -> Collected:
    idx = rows.tolist()
    return Collected([b.group[i] for i in idx], b.rollouts.select(rows), [b.texts[i] for i in idx],
                     b.rewards[rows], b.correct[rows], {}, turns=None if b.turns is None else b.turns.select(rows),
                     components=None if b.components is None else b.components[rows],
                     component_weights=b.component_weights, component_names=b.component_names)


def _merge(parts: list[Collected], pad_id: int, limit: int) -> Collected:
    group = [g for p in parts for g in p.group][:limit]
    rows = torch.arange(len(group))
    return Collected(
        group=group,
        rollouts=concat_rollouts([p.rollouts for p in parts], pad_id).select(rows),
        texts=[t for p in parts for t in p.texts][:limit],
        rewards=torch.cat([p.rewards for p in parts])[:limit],
        correct=torch.cat([p.correct for p in parts])[:limit],
        metrics={},
        # agent tasks: the per-turn tensors travel with their rows
        turns=None if parts[0].turns is None else TurnTensors.concat([p.turns for p in parts]).select(rows),
        components=None if parts[0].components is None else torch.cat([p.components for p in parts])[:limit],
        component_weights=parts[0].component_weights, component_names=parts[0].component_names,
    )
