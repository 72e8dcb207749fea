"""The rollout phase of a step: the sampler's requests -> completions -> verifier scores, the
group filter, and the sampler's feedback.

The sampler (`c.sampler`, `rlvr.sampling`) proposes the prompts and each one's number of
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
from dataclasses import dataclass, field

import torch

from rlvr.agents.batch import TurnTensors
from rlvr.agents.collect import is_agent_task, rollout_batch
from rlvr.batch import Rollouts, concat_rollouts
from rlvr.codec import completion_token_ids, decode_completions, encode_prompts
from rlvr.sampling.base import GroupFeedback, Request, Uniform
from rlvr.sampling.calibration import Calibration, calibration_metrics, mc_pass_rates
from rlvr.trainer.inpaint import inpaint_round
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
    oldest_version: int | None = None  # rollout replay: the policy version of its oldest replayed group
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


def produce(c, step: int, version: int | None = None) -> Produced:
    """Roll out and score step `step`'s batch with policy version `version` (None: step - 1, as
    the synchronous loop samples it), then draw the learner's minibatch seed from the run RNG."""
    t0 = time.perf_counter()
    version = step - 1 if version is None else version
    got = collect(c, step, version)
    rollout_s = time.perf_counter() - t0
    seed = c.rng.getrandbits(62)
    sampler_metrics = c.sampler.metrics()
    probe = c.plan.rollout.calibration
    if probe is not None and step % probe.every == 0:
        sampler_metrics.update(calibrate(c, step, got.group[::c.plan.rollout.group_size], probe))
    produced = Produced(got, rollout_s, seed, sampler_metrics, c.rng.getstate(), c.sampler.state_dict(),
                        c.replay.state_dict() if c.replay is not None else None, version=version)
    produced.staleness = stale_by(produced, step)
    return produced


def draws_ahead(c) -> str:
    """Why a batch's draws (its prompts, seeds and the learner's minibatch seed) cannot all be made
    before the batches ahead of it are scored; '' when they can. Nothing that samples may read a
    reward first: one round (a group filter that never refills), no replay, no hints (IGPO), no
    greedy baseline, no calibration probe, no drafts kept between batches (SPEC-RL), and a sampler
    that reads no feedback (uniform draws)."""
    r = c.plan.rollout
    one_round = r.group_filter is None or not r.group_filter.refill(0, 1, 1)  # a filter that only drops groups
    reasons = [(not isinstance(c.sampler, Uniform), "a prompt sampler that reads rewards (sampler.name)"),
               (not one_round, "dynamic sampling's refill rounds (algo.max_sampling_rounds > 1)"),
               (c.replay is not None, "rollout replay"), (r.inpaint is not None, "hinted groups (IGPO)"),
               (r.greedy_baseline, "a greedy baseline (ReMax)"), (r.calibration is not None, "the calibration probe"),
               (c.speculative is not None, "SPEC-RL's drafts")]
    return next((why for hit, why in reasons if hit), "")


def scores_ahead(c) -> bool:
    """Whether a batch can be scored while the next one samples (`produce_ahead`): its draws come
    first (`draws_ahead`) and it is a single-turn task (an agent's environment scores as it goes)."""
    return not draws_ahead(c) and not is_agent_task(c.task)


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


def draw(c, step: int) -> Drawn:
    """Step `step`'s draws, in `produce`'s order (the uniform sampler's feedback draws nothing, so
    nothing drawn later depends on how the batch fares: `draws_ahead`)."""
    requests, group, seeds = _requests(c, step, 0, c.plan.rollout.prompts_per_step)
    return Drawn(requests, group, seeds, c.rng.getrandbits(62), c.sampler.metrics(), c.rng.getstate(),
                 c.sampler.state_dict())


def roll(c, d: Drawn, step: int, version: int) -> Produced:
    """Roll out and score the drawn batch of `step` with policy version `version` (the engine's):
    the same batch `produce` makes from the same draws, in any thread, beside other batches."""
    t0 = time.perf_counter()
    first = _agent_round(c, d.group, d.seeds) if is_agent_task(c.task) else \
        _score_round(c, _sampled(c, d.requests, d.group, d.seeds))
    got = _filled(c, step, version, c.plan.rollout.prompts_per_step, d.requests, first)
    produced = Produced(got, time.perf_counter() - t0, d.minibatch_seed, d.sampler_metrics, d.task_rng,
                        d.sampler_state, version=version)
    produced.staleness = stale_by(produced, step)
    return produced


def produce_ahead(c, step: int, version: int) -> tuple[Callable[[], Produced], float]:
    """Sample step `step`'s batch with policy version `version` now; (the job that scores it,
    the seconds sampling took). The run RNG's draws all happen here, in `produce`'s order (`draw`),
    so the job may run while the next batch samples, and with the batches trained in order the run
    is `produce`'s draw for draw."""
    t0 = time.perf_counter()
    d = draw(c, step)
    sampled = _sampled(c, d.requests, d.group, d.seeds)
    sample_s = time.perf_counter() - t0

    def score_it() -> Produced:
        t1 = time.perf_counter()
        got = _filled(c, step, version, c.plan.rollout.prompts_per_step, sampled.requests, _score_round(c, sampled))
        produced = Produced(got, sample_s + time.perf_counter() - t1, d.minibatch_seed, d.sampler_metrics,
                            d.task_rng, d.sampler_state, version=version)
        produced.staleness = stale_by(produced, step)
        return produced

    return score_it, sample_s


CALIBRATION_OFFSET = 1 << 15
"""Seed offset of the calibration probe's completions: past any step's training rows (fewer than
2^15 per step), so the probe never reuses a training completion's seed."""


def calibrate(c, step: int, examples: list[Example], probe: Calibration) -> dict[str, float]:
    """Roll the first `probe.prompts` distinct prompts of `examples` out `probe.rollouts` times with
    the current engine and seeds of their own, and score the sampler's predicted pass rates for
    them against the solved fractions (`sampling.calibration`). The completions go nowhere else."""
    unique = list({ex.prompt: ex for ex in examples}.values())[:probe.prompts]
    group = [ex for ex in unique for _ in range(probe.rollouts)]
    ids, mask = encode_prompts(c.tokenizer, [ex.prompt for ex in group])
    seeds = sample_seeds(c.plan.rollout.seed, step, len(group), offset=CALIBRATION_OFFSET)
    out = c.engine(ids, mask, seeds, temperature=c.plan.rollout.temperature)
    rewards, correct, _ = score(c.reward, c.task, group, decode_completions(c.tokenizer, out))
    estimated = mc_pass_rates(correct.tolist(), (~torch.isnan(rewards)).tolist(), probe.rollouts)
    _, metrics = calibration_metrics(c.sampler.predict(step, unique), estimated, rollouts=probe.rollouts)
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


def generate(engine, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor, temperature,
             *, group_size: int, micro_group_size: int, pad_id: int):
    """The engine's completions of B rows grouped by `group_size`, generated in passes of
    `micro_group_size` rows per group (Infinite Sampling's micro-groups). A row's completion
    depends only on its prompt and seed, so the passes give the completions of one pass; the
    groups are whole again before anything reads them."""
    passes = group_size // micro_group_size
    if passes == 1:
        return engine(prompt_ids, prompt_mask, seeds, temperature=temperature)
    rows = torch.arange(len(seeds)).view(-1, passes, micro_group_size)  # (groups, passes, m)
    parts = []
    for j in range(passes):
        idx = rows[:, j].reshape(-1)
        t = temperature[idx] if isinstance(temperature, torch.Tensor) else temperature
        parts.append(engine(prompt_ids[idx], prompt_mask[idx], seeds[idx], temperature=t))
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


def _requests(c, step: int, round_index: int, n_prompts: int) -> tuple[list[Request], list[Example], torch.Tensor]:
    """The round's prompt requests, the example of each row and the rows' sampling seeds."""
    r = c.plan.rollout
    requests = c.sampler.propose(step, n_prompts, n_prompts * r.group_size)
    group = [req.example for req in requests for _ in range(req.n_rollouts)]  # each group of G rows shares a prompt
    return requests, group, sample_seeds(r.seed, step, len(group), offset=round_index * len(group))


def _sample_round(c, step: int, round_index: int, n_prompts: int) -> Sampled:
    return _sampled(c, *_requests(c, step, round_index, n_prompts))


def _sampled(c, requests: list[Request], group: list[Example], seeds: torch.Tensor) -> Sampled:
    """The round's completions of `group` (one row per example) with `seeds`, not yet scored."""
    r = c.plan.rollout
    prompt_ids, prompt_mask = encode_prompts(c.tokenizer, [ex.prompt for ex in group])
    metrics = {}
    if c.speculative is not None:  # SPEC-RL: each row's draft is its (prompt, slot)'s last completion
        keys = [(req.prompt_id, j) for req in requests for j in range(req.n_rollouts)]
        rollouts, metrics = c.speculative(keys, prompt_ids, prompt_mask, seeds)
    else:
        rollouts = generate(c.engine, prompt_ids, prompt_mask, seeds, row_temperatures(r, len(group)),
                            group_size=r.group_size, micro_group_size=r.micro_group_size,
                            pad_id=c.tokenizer.pad_token_id)
    return Sampled(requests, group, prompt_ids, prompt_mask, seeds, rollouts, decode_completions(c.tokenizer, rollouts),
                   metrics)


def _score_round(c, s: Sampled) -> Collected:
    r = c.plan.rollout
    v = scored(c.reward, c.task, s.group, s.texts, completion_token_ids(c.tokenizer, s.rollouts))
    metrics = {**{f"reward/{k}": x for k, x in v.metrics.items()}, **s.metrics}
    got = Collected(s.group, s.rollouts, s.texts, v.rewards, v.correct, metrics,
                    components=v.components, component_weights=v.weights, component_names=v.names)
    if r.inpaint is not None:  # IGPO: groups with no correct completion get hinted ones (trainer/inpaint.py)
        got = inpaint_round(c, r.inpaint, got, s.prompt_ids, s.prompt_mask, s.seeds,
                            row_temperatures(r, len(s.group)), r.group_size)
    return got


def _one_round(c, step: int, round_index: int, n_prompts: int) -> tuple[list[Request], Collected]:
    if is_agent_task(c.task):  # multi-turn episodes: the environment scores them
        requests, group, seeds = _requests(c, step, round_index, n_prompts)
        return requests, _agent_round(c, group, seeds)
    sampled = _sample_round(c, step, round_index, n_prompts)
    return sampled.requests, _score_round(c, sampled)


def _agent_round(c, group: list[Example], seeds: torch.Tensor) -> Collected:
    """One episode per row of `group`, scored by its environment (and a process reward model's turn rewards)."""
    got = rollout_batch(c.engine, c.tokenizer, c.task, group, seeds,
                        temperature=row_temperatures(c.plan.rollout, len(group)))
    if c.turn_reward is not None:
        got = c.turn_reward(got, c.tokenizer, [ex.prompt for ex in group])
    return Collected(group, got.rollouts, got.texts, got.rewards, got.correct, got.metrics, turns=got.turns)


def greedy_baseline(c, group: list[Example]) -> torch.Tensor:
    """ReMax's baseline: (P,) rewards of one greedy completion per prompt of `group` (G rows each)."""
    examples = group[::c.plan.rollout.group_size]
    ids, mask = encode_prompts(c.tokenizer, [ex.prompt for ex in examples])
    out = c.engine(ids, mask, torch.zeros(len(examples), dtype=torch.long), temperature=0.0)
    rewards, _, _ = score(c.reward, c.task, examples, decode_completions(c.tokenizer, out))
    return rewards


def collect(c, step: int, version: int | None = None) -> Collected:
    """Roll out and score one step's batch (several rounds under dynamic sampling) sampled by
    policy version `version` (None: step - 1), and the greedy baseline when the advantage
    estimator declared it reads one (ReMax)."""
    version = step - 1 if version is None else version
    r = c.plan.rollout
    replayed = c.replay.draw(c.replay.slots(r.prompts_per_step)) if c.replay is not None else []
    got = _collect_rounds(c, step, version, r.prompts_per_step - len(replayed))
    if c.replay is not None:  # the fresh groups join the buffer; the drawn ones join the batch
        c.replay.add(version, [_select(got, torch.arange(g, g + r.group_size))
                               for g in range(0, len(got.group), r.group_size)])
        if replayed:
            metrics = got.metrics
            got = _merge([got, *(g for _, g in replayed)], c.tokenizer.pad_token_id,
                         len(got.group) + len(replayed) * r.group_size)
            got.metrics = {**metrics, "batch/replayed_groups": float(len(replayed))}
            got.oldest_version = min(v for v, _ in replayed)
    if r.greedy_baseline:
        got.baseline_rewards = greedy_baseline(c, got.group)
    return got


def _collect_rounds(c, step: int, version: int, n_prompts: int) -> Collected:
    """`n_prompts` fresh groups, filtered and refilled as the plan's group filter says."""
    requests, first = _one_round(c, step, 0, n_prompts)
    return _filled(c, step, version, n_prompts, requests, first)


def _filled(c, step: int, version: int, n_prompts: int, requests: list[Request], first: Collected) -> Collected:
    """The first round's groups, filtered and refilled as the plan's group filter says."""
    r = c.plan.rollout
    flt = r.group_filter
    if flt is None:
        records = feedback(requests, first, None, step=step, version=version, group_size=r.group_size)
        c.sampler.observe(step, records)
        first.metrics.update(_cost(records))
        return first
    kept, generated, kept_groups, batch, rounds, every = [], 0, 0, first, 0, []
    while True:
        if rounds:
            requests, batch = _one_round(c, step, rounds, n_prompts)
        rounds += 1
        generated += n_prompts
        keep = flt.keep(batch.rewards, batch.correct, r.group_size)
        records = feedback(requests, batch, keep, step=step, version=version, group_size=r.group_size)
        c.sampler.observe(step, records)  # every generated group informs the sampler, kept or not
        every += records
        rows = keep.repeat_interleave(r.group_size).nonzero().squeeze(-1)
        if len(rows):
            kept.append(_select(batch, rows))
        kept_groups = sum(len(k.group) for k in kept) // r.group_size
        if not flt.refill(kept_groups, n_prompts, rounds):
            break
    if not kept:  # nothing varied: train on the first round (its advantages are all 0)
        kept = [first]
    merged = _merge(kept, c.tokenizer.pad_token_id, n_prompts * r.group_size)
    merged.metrics = {**first.metrics, "batch/kept_group_rate": kept_groups / generated,
                      "batch/sampling_rounds": float(rounds), **_cost(every)}
    return merged


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
