"""The frozen plans of a run's steps (`trainer.plan`), resolved from the config and from what the
engine, the policy and the bound registry entries declare: every declaration the loop would
otherwise read at call time (`rlvr.algos._registry.needs`) is read here, once.
"""

from __future__ import annotations

import functools
import math

from rlvr.algos._registry import BEHAVIOUR_NEEDS, needs_of
from rlvr.algos.aggregate import counts_tokens
from rlvr.algos.correction import importance_correction
from rlvr.algos.hybrid import chord_mu
from rlvr.algos.kl import adaptive_kl_coef
from rlvr.algos.objectives import ADVANTAGE_FREE
from rlvr.algos.shaping import overlong_penalty
from rlvr.config import AlgoConfig, Config, SamplerConfig, derived_batch_numbers, to_dict
from rlvr.config.binding import bound
from rlvr.config.registries import adapter_sync, engine_kind
from rlvr.errors import ConfigError
from rlvr.protocols import DrawsPolicy, LogitStatsPolicy, PolicyModel
from rlvr.runtime.distributed import ONE_PROCESS, Shard
from rlvr.sampling.base import GroupFilter, PassRateBand, ZeroVariance
from rlvr.sampling.calibration import Calibration
from rlvr.trainer.plan import (
    AdvantageSpec,
    Canvas,
    ExpertPlan,
    InpaintPlan,
    LoopPlan,
    LossSpec,
    Passes,
    Proximal,
    ProximalSource,
    RolloutPlan,
    StepPlan,
)

# Decoupled PPO (AReaL): a stale batch's tokens are reweighted by pi_prox / pi_behav, uncapped unless
# algo.rollout_correction names a cap (TIS) or a mask (MIS).
BEHAVIOUR_WEIGHTS = functools.partial(importance_correction, correction_cap=math.inf)


def reward_kl(config: Config):
    """The bound `algo.kl_estimator` when the KL lives in the reward (`algo.kl_placement=reward`), else None."""
    kl = bound(config, "algo.kl_estimator")  # chosen with algo.kl_coef > 0
    return kl if config.algo.kl_placement == "reward" else None


def correction(config: Config):
    """The bound rollout correction (`algo.rollout_correction`: TIS/MIS weights), else None."""
    return bound(config, "algo.rollout_correction")  # chosen when on (`registries.rollout_correction_on`)


def advantage_spec(estimate, returns) -> AdvantageSpec:
    """The bound estimator, its critic targets, and which optional inputs it declared it reads."""
    needs = needs_of(estimate)
    return AdvantageSpec(estimate, returns, needs, behaviour=tuple(sorted(needs & BEHAVIOUR_NEEDS)),
                         components="reward_components" in needs, trace="trace" in needs)


def passes(loss: LossSpec, advantage: AdvantageSpec) -> Passes:
    """What the old-policy and reference passes compute beside log-probs."""
    declared = needs_of(loss.objective)
    return Passes(old_stats=tuple(s for s in advantage.behaviour if s != "old_logp"),
                  old_draws="old_draws" in declared,
                  reference_stats=("logsumexp",) if "ref_logsumexp" in declared else ())


def needs_reference(loss: LossSpec) -> bool:
    """The objective reads the reference's log-probs (ShiQ): a reference is built whatever `algo.kl_coef`."""
    return bool(needs_of(loss.objective) & {"ref_logp", "ref_logsumexp"})


def check_statistics(policy: PolicyModel, loss: LossSpec, p: Passes, reference: PolicyModel | None = None) -> None:
    """The policies give the statistics the chosen entries declared: per-draw estimates (BGPO's, a
    masked-diffusion policy's) or logit statistics (a causal LM policy's)."""
    asked = [(policy, loss.stats), (policy, p.old_stats + (("draws",) if p.old_draws else ()))]
    if reference is not None:
        asked.append((reference, p.reference_stats))
    for model, stats in asked:
        if "draws" in stats and not isinstance(model, DrawsPolicy):
            raise ConfigError(f"algo.objective: {type(model).__name__} has no per-draw estimates: the objective "
                              "needs model.kind=diffusion with estimator.name=bgpo")
        logit = [s for s in stats if s != "draws"]
        if logit and not isinstance(model, LogitStatsPolicy):
            raise ConfigError(f"algo.objective: {type(model).__name__} returns no logit statistics "
                              f"({', '.join(logit)}): the chosen objective or advantage estimator needs a causal LM "
                              "policy")


def fusable(config: Config, policy: PolicyModel, advantage: AdvantageSpec) -> bool:
    """Whether the steps can take pi_prox from the update's forward (`trainer.proximal`): one
    optimizer step per batch, a policy whose training forward gives the log-probs themselves (a
    diffusion estimator's forward is a sample), and nothing that reads pi_prox before the update
    (expert rows, a KL penalty in the reward, a critic's warm-up steps without a policy update, an
    advantage estimator that reads the old policy)."""
    t = config.trainer
    reads_old = bool(advantage.behaviour)  # its own old-policy pass runs anyway (OTB)
    return (t.ppo_epochs == 1 and t.minibatches == 1 and policy.exact_logprobs
            and not config.expert.per_step and advantage.returns is None and reward_kl(config) is None
            and not reads_old)


def calibration(sm: SamplerConfig) -> Calibration | None:
    """The Monte-Carlo probe of the sampler's predicted pass rates, or None (`sampler.calibration_every=0`)."""
    if sm.calibration_every == 0:
        return None
    return Calibration(every=sm.calibration_every, prompts=sm.calibration_prompts, rollouts=sm.calibration_rollouts)


def group_filter(a: AlgoConfig) -> GroupFilter | None:
    """The post-generation filter of `algo` (its section): TraceRL's pass-rate band when either
    edge is set, else DAPO's zero-variance filter when dynamic sampling is on, else none."""
    if a.pass_rate_low is not None or a.pass_rate_high is not None:
        low, high = a.pass_rate_low or 0.0, 1.0 if a.pass_rate_high is None else a.pass_rate_high
        return PassRateBand(max_rounds=a.max_sampling_rounds, low=low, high=high)
    return ZeroVariance(a.max_sampling_rounds) if a.dynamic_sampling else None


def rollout_plan(config: Config, advantage: AdvantageSpec, *, agent: bool = False,
                 sampler_feedback: bool = False) -> RolloutPlan:
    """How each step's batch is drawn and scored; `agent`: the task's examples are an agent's
    episodes; `sampler_feedback`: the sampler's proposals read the verdicts it observes."""
    r, a = config.rollout, config.algo
    return RolloutPlan(seed=config.seed, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                       temperature=r.temperature, greedy_in_group=r.greedy_in_group,
                       group_filter=group_filter(a),
                       micro_group_size=r.micro_group_size or r.group_size,
                       greedy_baseline="baseline_rewards" in advantage.needs,
                       inpaint=InpaintPlan(r.igpo_hint_low, r.igpo_hint_high, int(r.igpo_replace * r.group_size),
                                           r.max_new_tokens) if r.igpo else None,
                       calibration=calibration(config.sampler), agent=agent, sampler_feedback=sampler_feedback)


def _expert_plan(config: Config, loss: LossSpec) -> ExpertPlan | None:
    e, r = config.expert, config.rollout
    if not e.per_step:
        return None
    return ExpertPlan(mu=functools.partial(chord_mu, weight=e.weight, weight_final=e.weight_final,
                                           decay_steps=e.decay_steps),
                      keep_onpolicy=e.keep_onpolicy, token_units=counts_tokens(loss.aggregation),
                      advantage=e.advantage,
                      canvas=Canvas(r.max_new_tokens, r.window) if config.model.kind == "diffusion" else None)


def step_plan(config: Config, loss: LossSpec, advantage: AdvantageSpec, *, fused: bool,
              shard: Shard = ONE_PROCESS, rollout: RolloutPlan | None = None,
              shares_engine: bool = False) -> StepPlan:
    """What every step of this run does (`trainer.plan.StepPlan`), resolved from the config and the
    declarations of the engine and the bound registry entries. `shard`: this process's rank of
    the data-parallel learners (its engine then samples from a copy of the weights pushed after
    every step); `rollout`: the batch's plan (None: `rollout_plan` of a single-turn task and a
    sampler without feedback); `shares_engine`: the asynchronous rollout side pushes into the run's
    one engine (`placement.shares_engine`), so the step does not."""
    r, t, a = config.rollout, config.trainer, config.algo
    kind = engine_kind(config)
    correcting = correction(config)
    behaviour = correcting or BEHAVIOUR_WEIGHTS
    proximal = ProximalSource.FUSED if fused else ProximalSource.PASS
    on_policy = t.ppo_epochs == 1 and t.minibatches == 1 and correcting is None and kind.exact_logprobs
    shaping = None
    if a.overlong_buffer > 0:
        shaping = functools.partial(overlong_penalty, max_length=r.max_new_tokens, overlong_buffer=a.overlong_buffer,
                                    overlong_factor=a.overlong_factor)
    kl_controller = None
    if a.kl_target is not None and (a.kl_coef > 0 or needs_reference(loss)):
        kl_controller = functools.partial(adaptive_kl_coef, kl_target=a.kl_target, kl_horizon=a.kl_horizon)
    return StepPlan(
        rollout=rollout or rollout_plan(config, advantage), micro_batch_size=t.micro_batch_size,
        ppo_epochs=t.ppo_epochs, minibatches=t.minibatches, grad_clip=config.optim.grad_clip,
        samples_per_step=t.samples_per_step,
        fresh=Proximal(ProximalSource.NONE if on_policy else proximal, correcting),
        stale=Proximal(proximal, behaviour),
        push_weights=(kind.own_weights and not shares_engine) or shard.fsdp,
        overlong_filter=a.overlong_filter, shaping=shaping, token_rewards="token_rewards" in needs_of(loss.objective),
        value_clip=a.value_clip, critic_warmup_steps=a.critic_warmup_steps, kl_controller=kl_controller,
        expert=_expert_plan(config, loss), shard=shard, push_merged=not shard.fsdp,
        push_adapter=adapter_sync(config) and not shard.fsdp,
        passes=passes(loss, advantage), reward_kl=reward_kl(config),
        micro_batch_tokens=t.micro_batch_tokens)


def loop_plan(config: Config, shard: Shard = ONE_PROCESS, *, retie: bool = False) -> LoopPlan:
    """The schedule around the steps and what the run records (`trainer.plan.LoopPlan`); of
    data-parallel learners only rank 0 writes. `retie`: the model ties weights a save drops."""
    t, r = config.trainer, config.rollout
    facts = {"rollout_engine": r.engine, "decode_engine": r.decode_engine} if config.model.kind == "causal" else {}
    return LoopPlan(steps=t.steps, eval_every=t.eval_every, save_every=t.save_every, keep_last=t.keep_last,
                    eval_samples=t.eval_samples, eval_temperature=r.temperature,
                    trackers=tracker_names(config),
                    adapter_checkpoints=config.model.lora.r > 0, retie=retie,
                    push_on_resume=engine_kind(config).own_weights or shard.fsdp,
                    facts={**facts, "learners": shard.size, "fsdp": True} if shard.fsdp else facts,
                    batch_numbers=derived_batch_numbers(config), config_tree=to_dict(config),
                    upper_bounds=config.algo.dynamic_sampling, writer=shard.rank == 0,
                    reads_advantages=config.algo.objective not in ADVANTAGE_FREE)


def tracker_names(config: Config) -> tuple[str, ...]:
    """The sinks `trainer.trackers` names, in order."""
    return tuple(n.strip() for n in config.trainer.trackers.split(",") if n.strip())
