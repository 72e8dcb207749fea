"""One RL step: task -> rollouts -> verifier -> advantages -> update, and the synchronous schedule.

`rl_step()` is one step of the algorithm and reads as the algorithm's diagram would; what it does
(where the old policy's log-probs come from, the behaviour weights, shaping, the critic, expert
rows) is the run's frozen `StepPlan`, never a config field or an engine's type.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch

from rlvr.algos.advantages import AdvantageInputs
from rlvr.batch import TrainBatch
from rlvr.models.lora import adapter_weights, merged_weights
from rlvr.protocols import WeightSyncEngine
from rlvr.runtime.memory import PEAKS
from rlvr.tracking.run_dir import now
from rlvr.trainer.budget import layout_metrics, micro_batches
from rlvr.trainer.collect import Produced, produce, sample_seeds
from rlvr.trainer.critic import critic_step, critic_values
from rlvr.trainer.expert import add_expert_rows
from rlvr.trainer.logit_stats import no_grad_outputs, old_pass, reference_pass, reward_tokens
from rlvr.trainer.parts import Components, LearnerParts
from rlvr.trainer.plan import ProximalSource, StepPlan
from rlvr.trainer.proximal import gap_metrics, placed
from rlvr.trainer.scoring import Collected
from rlvr.trainer.step import optimizer_step


def _shaped_rewards(c: Components, rewards: torch.Tensor, batch: TrainBatch,
                    lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(task reward + DAPO overlong penalty - β·KL, the (B,) per-sequence KL charged in the reward
    or None when the KL does not live there)."""
    shaped = rewards.clone()
    if c.plan.shaping is not None:
        shaped = shaped + c.plan.shaping(lengths)
    charged = None
    if c.learner.reference is not None and c.plan.reward_kl is not None:
        charged = reward_kl(c.plan.reward_kl, batch)
        shaped = shaped - c.state.kl_coef * charged
    return shaped, charged


def reward_kl(estimator, batch: TrainBatch) -> torch.Tensor:
    """(B,) sum over completion tokens of `algo.kl_estimator` between the behaviour policy (old
    log-probs, else the sampler's) and the reference: the KL that `kl_placement=reward` charges."""
    behaviour = batch.old_logp if batch.old_logp is not None else batch.rollout_logp
    keep = batch.completion_mask > 0
    per_token = estimator(behaviour.detach(), batch.ref_logp.detach(), old_logp=behaviour.detach()).detach()
    return torch.where(keep, per_token, torch.zeros_like(per_token)).sum(-1)


def _minibatches(num_groups: int, count: int, group_size: int, generator: torch.Generator, extra: int = 0):
    """Row indices of `count` minibatches of whole groups, in a seeded random order; the `extra`
    rows after the groups (expert rows) are split over the minibatches in order."""
    order = torch.randperm(num_groups, generator=generator)
    tails = torch.tensor_split(num_groups * group_size + torch.arange(extra), count)
    for groups, tail in zip(torch.tensor_split(order, count), tails):
        yield torch.cat([(groups[:, None] * group_size + torch.arange(group_size)).flatten(), tail])


def rl_step(c: Components, step: int, produced: Produced | None = None) -> tuple[dict[str, float], list[dict]]:
    """One step of the algorithm, as `c.plan` says. Returns (metrics, a few sample records).

    `produced`: the step's batch from an asynchronous rollout side (None = roll out here). A batch
    sampled by an older policy version (`produced.staleness` > 0) is trained as `plan.stale` says:
    the decoupled PPO objective, its clip centred on the proximal policy (this learner's weights
    before the update) and each token weighted by pi_prox / pi_behav."""
    plan = c.plan
    group_size, micro = plan.rollout.group_size, plan.micro_batch_size
    PEAKS.begin()
    peaks = {}
    plan.shard.mark(step, "rollout")  # where this rank is, for naming a hung one (data-parallel learners)
    if produced is None:
        produced = produce(c.rollout, step)
        peaks["rollout"] = PEAKS.end()
    got = produced.got
    rollouts, rewards = got.rollouts, got.rewards
    timings, t0 = {"rollout": produced.rollout_s}, now()
    learner = c.learner
    forwards_before = learner.policy.forwards
    proximal = plan.stale if produced.staleness > 0 else plan.fresh
    plan.shard.mark(step, "logprob")

    mask = rollouts.completion_mask
    if plan.overlong_filter:  # DAPO: a truncated completion has no verdict on its ending; drop it from the loss
        mask = mask * (~rollouts.truncated)[:, None].float()
    if produced.within_bound is not None:  # tokens staler than `trainer.max_token_staleness` train nothing
        mask = mask * produced.within_bound
    batch = TrainBatch(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, mask,
                       advantages=torch.zeros_like(mask), rollout_logp=rollouts.logprobs, trace=rollouts.trace,
                       vision=rollouts.vision)
    for policy in (learner.policy, learner.reference):  # common random numbers: one step seed, shared
        if policy is not None:
            policy.begin_step(int(sample_seeds(plan.rollout.seed, step, 1)[0]))
    kept = [] if proximal.source is ProximalSource.FUSED else None  # pi_prox from the update's own forward
    # The old-policy pass, with what the advantage estimator declared (the optimal token baseline's Σπ²).
    batch.old_logp, behaviour_inputs = old_pass(learner.policy, batch, learner.advantage, plan.passes, micro,
                                                learner.rows, needed=proximal.source is ProximalSource.PASS,
                                                shard=plan.shard, micro_batch_tokens=plan.micro_batch_tokens)
    if batch.old_logp is not None and proximal.weights is not None:
        batch.loss_weights = proximal.weights(batch.old_logp, rollouts.logprobs, mask)[0]
    if learner.reference is not None:  # its log-probs, and its logsumexp when the objective declared it (ShiQ)
        reference_pass(learner.reference, batch, plan.passes, micro, learner.rows, plan.shard, plan.micro_batch_tokens)
    critic = learner.critic
    old_values = (critic_values(critic.model, batch, micro, plan.shard, plan.micro_batch_tokens)
                  if critic is not None else None)
    shaped, charged_kl = _shaped_rewards(c, rewards, batch, rollouts.lengths)
    if plan.token_rewards:  # an objective that learns from rewards, not advantages
        batch.token_rewards = reward_tokens(shaped, mask)
    advantage = learner.advantage
    inputs = AdvantageInputs(rewards=shaped, group_size=group_size, response_mask=mask, values=old_values,
                             baseline_rewards=got.baseline_rewards, **_turn_inputs(got.turns), **behaviour_inputs,
                             **got.component_inputs(advantage.components),
                             **({"trace": rollouts.trace} if advantage.trace else {}))
    batch.advantages, adv_metrics = advantage.estimate(inputs)
    returns = advantage.returns(inputs) if critic is not None else None
    expert_metrics = {}
    if learner.expert is not None:  # off-policy expert rows after the groups (trainer/expert.py)
        r = c.rollout
        batch, expert_metrics = add_expert_rows(
            learner.expert, plan.expert, batch, rewards, step, tokenizer=r.tokenizer, task=r.task, reward=r.reward,
            policies={"old": learner.policy, "ref": learner.reference}, group_size=group_size,
            logprobs=lambda policy, part, stats: no_grad_outputs(policy, part, micro, learner.rows, stats, plan.shard,
                                                                 plan.micro_batch_tokens))
    timings["logprob"], t0 = now() - t0, now()
    peaks["logprob"] = PEAKS.end()

    plan.shard.mark(step, "update")
    updates = _update(c, step, batch, old_values, returns, produced.minibatch_seed, len(rewards),
                      None if kept is None else (kept, proximal.weights))
    timings["update"] = now() - t0
    peaks["update"] = PEAKS.end()
    if kept is not None:
        batch.old_logp = placed(kept, updates.rows, mask)
    old_logp = None if batch.old_logp is None else batch.old_logp[:len(mask)]  # the engine's rows (not expert)
    gap, behaviour = gap_metrics(old_logp, rollouts.logprobs, mask, proximal.weights)
    if plan.push_weights:
        plan.shard.mark(step, "weight_sync")
        timings["weight_sync"], pushed = push_weights(learner, plan, c.rollout.engine)
    forwards = learner.policy.forwards - forwards_before

    metrics = _step_metrics(rewards, got.correct, rollouts, group_size, timings, batch)
    metrics.update(got.metrics)
    metrics.update({f"rollout/{k}": v for k, v in gap.items()})
    metrics.update(produced.sampler_metrics)
    if produced.staleness > 0:  # how far the behaviour policy is from the proximal one, and how much the weights cut
        metrics.update({"async/behaviour_kl_k3": behaviour["mismatch_k3"],
                        "async/weight_clip_frac": behaviour["correction_clip_frac"]})
    if got.turns is not None:  # the loss sees only sampled tokens: say how many it trained on
        metrics["agent/trained_tokens"] = float(mask.sum())
    if forwards:  # module forwards (dLLM estimators); the fused causal fast path bypasses the module
        metrics["perf/forwards_per_update"] = forwards / max(sum(1 for m in updates.metrics if "actor/grad_norm" in m),
                                                             1)
    if plan.push_weights:
        metrics["perf/weight_sync_mb"] = pushed / 2**20  # what one push moved
    metrics["perf/peak_rss_mb"] = PEAKS.lifetime  # the process's, since it started
    # padding a padded forward would carry, prompts a shared one computes once, tokens per forward
    metrics.update(layout_metrics(batch, plan.shard.size * len(micro_batches(batch, plan.shard, micro,
                                                                             plan.micro_batch_tokens))))
    metrics.update({f"perf/peak_rss_mb/{phase}": mb for phase, mb in peaks.items()})
    metrics.update({f"adv/{k}": v for k, v in adv_metrics.items()})
    metrics.update(expert_metrics)
    for key in sorted({k for m in updates.metrics for k in m}):
        metrics[key] = sum(m.get(key, 0.0) for m in updates.metrics) / len(updates.metrics)
    _adapt_kl(c, metrics, len(batch), charged_kl)
    return metrics, _samples(step, got, rewards, plan.samples_per_step)


class Updates(NamedTuple):
    metrics: list[dict]  # one per minibatch update
    rows: torch.Tensor  # the last minibatch's rows, in the order its update saw them


def _update(c: Components, step: int, batch: TrainBatch, old_values, returns, seed: int, rollout_rows: int,
            fused: tuple[list, object] | None) -> Updates:
    """Every minibatch update of the step (`ppo_epochs` passes over `minibatches` of whole groups):
    the critic's, then the policy's once the critic's warm-up is over. `fused`: (a list that keeps
    the forward's log-probs, the weights applied to them) when the update's own forward gives pi_prox."""
    plan, learner = c.plan, c.learner
    group_size = plan.rollout.group_size
    updates: list[dict] = []
    generator = torch.Generator().manual_seed(seed)
    critic = learner.critic
    train_policy = critic is None or step > plan.critic_warmup_steps
    spec = learner.loss if fused is None else dataclasses.replace(learner.loss, proximal_weights=fused[1])
    for _ in range(plan.ppo_epochs):
        for rows in _minibatches(rollout_rows // group_size, plan.minibatches, group_size, generator,
                                 extra=len(batch) - rollout_rows):
            m = {}
            if critic is not None:
                m.update(critic_step(critic.model, critic.optimizer, batch.select(rows), old_values[rows],
                                     returns[rows], value_clip=plan.value_clip, micro_batch_size=plan.micro_batch_size,
                                     grad_clip=plan.grad_clip, shard=plan.shard,
                                     micro_batch_tokens=plan.micro_batch_tokens))
            if train_policy:
                m.update(optimizer_step(learner.policy, learner.optimizer, learner.scheduler, batch.select(rows), spec,
                                        micro_batch_size=plan.micro_batch_size, grad_clip=plan.grad_clip,
                                        kl_coef=c.state.kl_coef, rows=learner.rows,
                                        keep=None if fused is None else fused[0], shard=plan.shard,
                                        micro_batch_tokens=plan.micro_batch_tokens))
            updates.append(m)
    return Updates(updates, rows)


def _samples(step: int, got: Collected, rewards: torch.Tensor, count: int) -> list[dict]:
    """A few of the step's rollouts, evenly spaced, with each reward function's own score when there
    are several (`rewards`). An unscorable or failed sample's reward is NaN here; JSON has no NaN,
    so samples.jsonl says null."""
    def number(value) -> float | None:
        return float(value) if math.isfinite(float(value)) else None

    stride = max(1, len(got.group) // max(count, 1))
    records = []
    for i in range(0, len(got.group), stride):
        record = {"step": step, "prompt": got.group[i].prompt, "completion": got.texts[i],
                  "reward": number(rewards[i])}
        if got.component_names:
            record["rewards"] = {name: number(v) for name, v in zip(got.component_names, got.components[i])}
        records.append(record)
    return records[:count]


def push_weights(learner: LearnerParts, plan: StepPlan, engine: WeightSyncEngine) -> tuple[float, int]:
    """Send the trainer's weights (LoRA: merged, or the adapter alone) to an engine that holds its own
    copy, tagged with the optimizer-step count; returns the seconds it took and the bytes it sent.
    Rollouts come only at the start of a step, so one push after a step's last optimizer step serves
    every rollout that follows it."""
    t0 = now()
    if plan.push_adapter:
        weights = adapter_weights(learner.model)
    else:
        weights = merged_weights(learner.model) if plan.push_merged else list(learner.model.named_parameters())
    engine.push_weights(weights, version=learner.scheduler.last_epoch)
    return now() - t0, sum(t.numel() * t.element_size() for _, t in weights)


def _turn_inputs(turns) -> dict:
    """Agent tasks: the per-turn tensors the turn-level advantages read."""
    if turns is None:
        return {}
    return {"turn_index": turns.turn_index, "turn_rewards": turns.rewards, "turn_states": turns.states,
            "turn_valid": turns.valid}


def charged_seq_kl(metrics: dict, charged: torch.Tensor | None) -> float | None:
    """The batch mean of the per-sequence KL the step charged: in the reward, the mean of the rows'
    charged sums (`charged`, (B,)); in the loss, the update's mean per-token KL times the mean
    completion length; None when the step charged none."""
    if charged is not None:
        return float(charged.mean())
    if "actor/kl" in metrics:
        return metrics["actor/kl"] * metrics["response/length_mean"]
    return None


def _adapt_kl(c: Components, metrics: dict, n: int, charged: torch.Tensor | None) -> None:
    """Adaptive KL controller (PPO-style): move β toward the target per-sequence KL, from the KL
    the step charged wherever it lives (the loss or the reward)."""
    if c.learner.reference is not None:
        metrics["kl/coef"] = c.state.kl_coef
    seq_kl = charged_seq_kl(metrics, charged)
    if c.plan.kl_controller is None or seq_kl is None:
        return
    c.state.kl_coef = c.plan.kl_controller(c.state.kl_coef, seq_kl, n)


def _step_metrics(rewards, correct, rollouts, group_size, timings, batch) -> dict[str, float]:
    grouped = rewards.view(-1, group_size)
    scored = rewards[~torch.isnan(rewards)]
    lengths = rollouts.lengths
    completion_tokens = float(lengths.sum())
    train_tokens = completion_tokens + float(batch.prompt_mask.sum())
    metrics = {
        "reward/mean": float(scored.mean()) if len(scored) else 0.0,  # over scorable samples
        "reward/std": float(scored.std()) if len(scored) > 1 else 0.0,
        "reward/scorable_frac": len(scored) / max(len(rewards), 1),
        "reward/accuracy": float(correct.mean()),
        "batch/zero_variance_group_frac": float((grouped.std(-1) == 0).float().mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncation_rate": float(rollouts.truncated.float().mean()),
        "perf/rollout_tokens_per_s": completion_tokens / max(timings["rollout"], 1e-9),
        "perf/train_tokens_per_s": train_tokens / max(timings["update"], 1e-9),
    }
    metrics.update({f"time/{k}_s": v for k, v in timings.items()})
    metrics["time/step_s"] = sum(timings.values())
    return metrics


class SyncSteps:
    """The synchronous schedule: each step rolls out with the current weights, then trains.

    The loop's other schedule, `rlvr.trainer.async_loop.AsyncSteps`, offers the same methods and
    `engine`, what evaluation samples with."""

    def __init__(self, c: Components):
        self.c = c
        self.engine = c.rollout.engine  # what evaluation samples with

    def step(self, step: int) -> tuple[dict[str, float], list[dict]]:
        self.c.rollout.reward.on_step_begin(step, self.c.loop.steps)  # TRL's `trainer_state`: which step scores
        return rl_step(self.c, step)

    def rollout_state(self) -> dict:
        """The prompt RNG and the sampler as of the last trained step: what its checkpoint records."""
        r = self.c.rollout
        return {"task_rng": r.rng.getstate(), "sampler": r.sampler.state_dict(),
                "replay": r.replay.state_dict() if r.replay is not None else None}

    def close(self) -> None:
        pass


