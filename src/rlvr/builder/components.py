"""Everything a run needs, built once from the config: the model and its policy, the rollout
engine, the task and its verifier, the loss, the optimizer, the run's RNG, the frozen plans of its
steps (`builder.plans`) and where each side runs (`builder.placement`), assembled into the run's
parts (`trainer.parts`).

`build_components(config)` reads the config; the keyword arguments let the Python API pass
objects instead (a model and tokenizer in memory, a task built from a dataset, reward callables).
This is the only module of the loop's side that reads a `Config` (with the plans and the placement
it calls): the parts it returns never see it. Process-wide settings are not applied here:
`rlvr.runtime.process.configure_process` does that, and its `Runtime` is passed in.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import random

import torch

from rlvr.agents.task import is_agent_task
from rlvr.backends.ray import RayReward
from rlvr.builder import build
from rlvr.builder.placement import DTYPES, as_verifier, learner_engine, rollout_sides, shares_engine, thread_layout
from rlvr.builder.plans import check_statistics, fusable, loop_plan, needs_reference, rollout_plan, step_plan
from rlvr.builder.vision import check_vision_run
from rlvr.config import Config
from rlvr.config.binding import bound
from rlvr.config.checks import check_fsdp_options, check_learners
from rlvr.config.registries import engine_kind
from rlvr.engines.ranks import LeadEngine, LeadReward, RankEngine
from rlvr.engines.rows import split_engine
from rlvr.errors import ConfigError
from rlvr.models.lora import AdapterDisabled
from rlvr.models.value import ValueModel
from rlvr.protocols import RolloutEngine, Task
from rlvr.rewards.runner import RewardRunner
from rlvr.runtime.distributed import Shard
from rlvr.runtime.fsdp import ShardedState, shard_model
from rlvr.runtime.process import Runtime, resolve_device
from rlvr.sampling.base import Sampler
from rlvr.sampling.replay import ReplayBuffer
from rlvr.trainer.collect import draws_ahead
from rlvr.trainer.expert import ExpertSource
from rlvr.trainer.parts import Components, Critic, LearnerParts, RolloutParts, StepState
from rlvr.trainer.plan import AdvantageSpec


def build_components(config: Config, *, runtime: Runtime | None = None, model: torch.nn.Module | None = None,
                     tokenizer=None, task: Task | None = None, reward: RewardRunner | None = None) -> Components:
    """Build a run's components from `config`; any of `model` (with `tokenizer`), `task` and
    `reward` given here is used instead of the one the config names."""
    runtime = runtime or Runtime()
    model, tokenizer = build.build_model(config) if model is None else (build.prepare_model(config, model), tokenizer)
    shard = runtime.shard
    plain = model  # what the engine samples with and the reference copies: the full weights
    check_fsdp_options(config, shard, resolve_device(config.trainer.device, config.model.kind).type)
    if shard.fsdp:  # FSDP2 learners: the engine keeps a plain copy, the learner trains shards
        check_learners(config, shard)
        plain = copy.deepcopy(model)
        t = config.trainer
        shard_model(model, param_dtype=DTYPES[t.fsdp_param_dtype], reduce_dtype=DTYPES[t.fsdp_reduce_dtype],
                    offload=t.fsdp_cpu_offload)
    o, a = config.optim, config.algo
    total = config.trainer.steps * config.trainer.minibatches * config.trainer.ppo_epochs  # optimizer steps
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer, scheduler = build.build_optimizer(trainable, lr=o.lr, warmup_steps=o.warmup_steps,
                                                 weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                                                 total_steps=total, schedule=o.schedule, min_lr_ratio=o.min_lr_ratio)
    lora = config.model.lora.r > 0
    loss = build.build_loss(config)
    # The KL reference (or the one an objective reads, ShiQ's): under LoRA the base itself (the
    # adapter switched off), else a frozen copy taken before a policy hooks `model`.
    with_reference = a.kl_coef > 0 or needs_reference(loss)
    frozen = copy.deepcopy(plain).requires_grad_(False) if with_reference and not lora else None
    if config.model.teacher_path:  # on-policy distillation: the reference is the teacher checkpoint
        frozen = build.teacher_model(config, tokenizer).requires_grad_(False)
    policy = build.build_policy(config, model, sharded=shard.fsdp)
    reference = build.build_policy(config, frozen) if frozen is not None else None
    if with_reference and lora:
        reference = AdapterDisabled(policy)
    advantage = build.build_advantage(config)
    critic = build_critic(config, plain, shard) if advantage.returns is not None else None
    task = task if task is not None else build.build_task(config, tokenizer)
    build.check_context(config, plain, tokenizer, task)
    layout = thread_layout(config, runtime)
    check_vision_run(config, plain, tokenizer, task, rows_split=layout.learner_rows is not None, sharded=shard.fsdp)
    engine = learner_engine(config, plain, tokenizer, shard)
    if layout.learner_rows is not None and not engine_kind(config).batches_itself:
        engine = split_engine(engine, layout.learner_rows, tokenizer.pad_token_id, model)
    if shard.fsdp and not isinstance(engine, LeadEngine):
        engine = RankEngine(engine, plain, shard, tokenizer.pad_token_id)
    reward = reward if reward is not None else build.build_reward(config, task)
    build.check_reward_components(config, reward)
    if shard.fsdp and config.trainer.ray_learners and config.trainer.reward_workers > 1:
        reward = LeadReward(RayReward(functools.partial(build.build_verifier, config), tokenizer,
                                      workers=config.trainer.reward_workers, local=reward)
                            if shard.rank == 0 else None, shard)
    expert = build_expert(config, task)
    rollout = build_rollout(config, advantage, tokenizer, task, reward, engine, plain)
    plan = step_plan(config, loss, advantage, fused=fusable(config, policy, advantage) and not shard.fsdp,
                     shard=shard, rollout=rollout.plan, shares_engine=shares_engine(config))
    check_statistics(policy, loss, plan.passes, reference)
    learner = LearnerParts(model, policy, reference, optimizer, scheduler, loss, advantage, critic=critic,
                           rows=layout.learner_rows, expert=expert,
                           shards=ShardedState(model, optimizer, shard) if shard.fsdp else None,
                           full_model=plain if shard.fsdp else None)
    c = Components(rollout, learner, plan, loop_plan(config, shard, retie=hasattr(plain, "tie_weights")),
                   StepState(kl_coef=a.kl_coef), heap_kept=runtime.heap_kept, asynchronous=layout.plan)
    if layout.plan is None:
        return c
    check_lanes(config, c)
    return dataclasses.replace(c, rollout_side=rollout_sides(config, rollout, model, plain, shard, layout))


def build_critic(config: Config, plain: torch.nn.Module, shard: Shard) -> Critic:
    """The value model of an estimator with critic targets (gae): a copy of the full body, with its
    own optimizer; sharded learners shard it as the policy."""
    t, o = config.trainer, config.optim
    model = ValueModel(plain)
    mode = build.packing_mode(t.packing, plain, sharded=shard.fsdp)
    if mode is not None:  # the probe passed on the policy's architecture: the body packs the same way
        model.use_packing(mode)
    if shard.fsdp:
        shard_model(model, param_dtype=DTYPES[t.fsdp_param_dtype], reduce_dtype=DTYPES[t.fsdp_reduce_dtype],
                    offload=t.fsdp_cpu_offload, in_float32=(model.head,))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.algo.critic_lr, betas=(o.beta1, o.beta2))
    shards = ShardedState(model, optimizer, shard, ShardedState.CRITIC_FOLDER) if shard.fsdp else None
    return Critic(model, optimizer, shards)


def build_expert(config: Config, task: Task) -> ExpertSource | None:
    """The off-policy expert problems (config section `expert`), or None when off."""
    e = config.expert
    if not e.per_step:
        return None
    if not hasattr(task, "solution"):
        raise ConfigError(f"expert.per_step: task {type(task).__name__} has no reference solutions; set it to 0")
    return ExpertSource(task, seed=config.seed, per_step=e.per_step, pool_size=e.pool_size)


def build_rollout(config: Config, advantage: AdvantageSpec, tokenizer, task: Task, reward, engine: RolloutEngine,
                  plain: torch.nn.Module) -> RolloutParts:
    """The rollout side's parts: the run's prompt RNG and the sampler drawing with it, rollout
    replay, SPEC-RL's drafts, a process reward model's turn rewards, and their plan."""
    rng = random.Random(config.seed)
    sampler = build_sampler(config, task, rng)
    replay = ReplayBuffer(capacity=config.rollout.replay_capacity, fraction=config.rollout.replay_fraction,
                          seed=config.seed) if config.rollout.replay_fraction > 0 else None
    speculative = build.build_speculative(config, plain, tokenizer)
    turn_reward = build.build_turn_reward(config, task, reward)
    plan = rollout_plan(config, advantage, agent=is_agent_task(task), sampler_feedback=sampler.reads_feedback)
    return RolloutParts(plan, tokenizer, task, as_verifier(reward), engine, sampler, rng, replay=replay,
                        speculative=speculative, turn_reward=turn_reward)


def check_lanes(config: Config, c: Components) -> None:
    """`trainer.rollout_lanes` > 1 rolls batches out side by side: each lane's engine is a snapshot
    of the weights in this process (an engine with its own weights is refused at load), and every
    batch's draws come first (`collect.draws_ahead`)."""
    lanes = config.trainer.rollout_lanes
    why = (f"{c.plan.shard.size} data-parallel learners" if c.plan.shard.size > 1
           else "a reward that reads the trainer's step (TRL-form trainer_state)" if c.rollout.reward.reads_step
           else draws_ahead(c.rollout))
    if lanes > 1 and why:
        raise ConfigError(f"trainer.rollout_lanes: {lanes} lanes cannot run with {why}; set trainer.rollout_lanes=1")


def build_sampler(config: Config, task: Task, rng: random.Random) -> Sampler:
    """The `sampler.name` sampler over `task`, drawing prompts with the run's prompt RNG `rng`."""
    make = bound(config, "sampler.name")
    return make(task=task, rng=rng)  # one that predicts pass rates where calibrated (config.checks)
