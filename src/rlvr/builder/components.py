"""Everything a run needs, built once from the config: the model and its policy, the rollout
engine, the task and its verifier, the loss, the optimizer, the run's RNG and the frozen plans of
its steps (`trainer.plan`).

`build_components(config)` reads the config; the keyword arguments let the Python API pass
objects instead (a model and tokenizer in memory, a task built from a dataset, reward callables).
This is the only module of the loop's side that reads a `Config`: the components it returns never
see it. Process-wide settings are not applied here: `rlvr.runtime.process.configure_process` does
that, and its `Runtime` is passed in.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
from dataclasses import dataclass

import torch

from rlvr.algos._registry import BEHAVIOUR_NEEDS, needs_of
from rlvr.algos.aggregate import counts_tokens
from rlvr.algos.correction import importance_correction
from rlvr.algos.hybrid import chord_mu
from rlvr.algos.kl import adaptive_kl_coef
from rlvr.algos.objectives import ADVANTAGE_FREE
from rlvr.algos.shaping import overlong_penalty
from rlvr.backends import ray_rollouts
from rlvr.backends.ray import RayEngine, RayReward, ensure_ray
from rlvr.builder import build
from rlvr.config import AlgoConfig, Config, SamplerConfig, derived_batch_numbers, to_dict
from rlvr.config.binding import bound
from rlvr.config.checks import check_fsdp_options, check_learners
from rlvr.config.registries import engine_kind, rollout_correction_on
from rlvr.engines.ranks import LeadEngine, LeadReward, RankEngine
from rlvr.engines.rows import split_engine
from rlvr.engines.snapshot import SharedEngine, SnapshotEngine
from rlvr.errors import ConfigError
from rlvr.models.lora import AdapterDisabled
from rlvr.models.value import ValueModel
from rlvr.protocols import PolicyModel, Task
from rlvr.rewards.runner import RewardRunner
from rlvr.runtime.distributed import ONE_PROCESS, Shard, side_group
from rlvr.runtime.fsdp import ShardedState, shard_model
from rlvr.runtime.process import Runtime, available_cores, resolve_device, thread_budget
from rlvr.runtime.rows import CoreLease, RowPool, resolve_mode
from rlvr.sampling.base import GroupFilter, PassRateBand, ZeroVariance
from rlvr.sampling.calibration import Calibration
from rlvr.sampling.replay import ReplayBuffer
from rlvr.trainer.collect import draws_ahead
from rlvr.trainer.expert import Canvas, ExpertSource
from rlvr.trainer.inpaint import InpaintPlan
from rlvr.trainer.logit_stats import needs_reference
from rlvr.trainer.plan import AsyncPlan, Components, ExpertPlan, LoopPlan, Proximal, RolloutPlan, RolloutSide, StepPlan
from rlvr.trainer.scoring import reads_step
from rlvr.trainer.step import LossSpec

# Decoupled PPO (AReaL): a stale batch's tokens are reweighted by pi_prox / pi_behav, uncapped unless
# algo.rollout_correction names a cap (TIS) or a mask (MIS).
BEHAVIOUR_WEIGHTS = functools.partial(importance_correction, correction_cap=math.inf)


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
    with_reference = a.kl_coef > 0 or needs_reference(loss.objective)
    frozen = copy.deepcopy(plain).requires_grad_(False) if with_reference and not lora else None
    if config.model.teacher_path:  # on-policy distillation: the reference is the teacher checkpoint
        frozen = build.teacher_model(config).requires_grad_(False)
    policy = build.build_policy(config, model, sharded=shard.fsdp)
    reference = build.build_policy(config, frozen) if frozen is not None else None
    if with_reference and lora:
        reference = AdapterDisabled(policy)
    advantage = build.build_advantage(config)
    critic = critic_optimizer = critic_shards = None
    if advantage.returns is not None:  # an estimator with critic targets (gae) trains a value head
        critic = ValueModel(plain)  # a copy of the full body; sharded learners shard it as the policy
        if shard.fsdp:
            t = config.trainer
            shard_model(critic, param_dtype=DTYPES[t.fsdp_param_dtype], reduce_dtype=DTYPES[t.fsdp_reduce_dtype],
                        offload=t.fsdp_cpu_offload, in_float32=(critic.head,))
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=a.critic_lr, betas=(o.beta1, o.beta2))
        if shard.fsdp:
            critic_shards = ShardedState(critic, critic_optimizer, shard, ShardedState.CRITIC_FOLDER)
    task = task if task is not None else build.build_task(config, tokenizer)
    build.check_context(config, plain, tokenizer, task)
    layout = thread_layout(config, runtime)
    engine = learner_engine(config, plain, tokenizer, shard)
    if layout.learner_rows is not None and not engine_kind(config).batches_itself:
        engine = split_engine(engine, layout.learner_rows, tokenizer.pad_token_id, model)
    if shard.fsdp and not isinstance(engine, LeadEngine):
        engine = RankEngine(engine, plain, shard, tokenizer.pad_token_id)
    reward = reward if reward is not None else build.build_reward(config, task)
    build.check_reward_components(config, reward)
    if shard.fsdp and config.trainer.ray_learners and config.trainer.reward_workers > 1:
        reward = LeadReward(RayReward(functools.partial(build.build_verifier, config), tokenizer,
                                      workers=config.trainer.reward_workers) if shard.rank == 0 else None, shard)
    e = config.expert
    expert = ExpertSource(task, seed=config.seed, per_step=e.per_step, pool_size=e.pool_size) if e.per_step else None
    rng = random.Random(config.seed)
    c = Components(
        model=model, tokenizer=tokenizer, policy=policy, reference=reference, engine=engine,
        task=task, reward=reward, optimizer=optimizer, scheduler=scheduler, loss=loss, advantage=advantage,
        plan=step_plan(config, loss, advantage, fused=fusable(config, policy, loss, advantage) and not shard.fsdp,
                       shard=shard),
        loop=loop_plan(config, shard),
        rng=rng, critic=critic, critic_optimizer=critic_optimizer, sampler=build_sampler(config, task, rng),
        replay=ReplayBuffer(capacity=config.rollout.replay_capacity, fraction=config.rollout.replay_fraction,
                            seed=config.seed) if config.rollout.replay_fraction > 0 else None,
        speculative=build.build_speculative(config, plain, tokenizer),
        rows=layout.learner_rows, heap_kept=runtime.heap_kept, expert=expert, asynchronous=layout.plan,
        turn_reward=build.build_turn_reward(config, task, reward),
        shards=ShardedState(model, optimizer, shard) if shard.fsdp else None,
        full_model=plain if shard.fsdp else None, critic_shards=critic_shards,
    )
    if layout.plan is not None:
        check_lanes(config, c)
        c.rollout_side = functools.partial(rollout_side, config, c, layout)
    return c


def check_lanes(config: Config, c: Components) -> None:
    """`trainer.rollout_lanes` > 1 rolls batches out side by side: each lane's engine is a snapshot
    of the weights in this process (an engine with its own weights is refused at load), and every
    batch's draws come first (`collect.draws_ahead`)."""
    lanes = config.trainer.rollout_lanes
    why = (f"{c.plan.shard.size} data-parallel learners" if c.plan.shard.size > 1
           else "a reward that reads the trainer's step (TRL-form trainer_state)" if reads_step(c.reward)
           else draws_ahead(c))
    if lanes > 1 and why:
        raise ConfigError(f"trainer.rollout_lanes: {lanes} lanes cannot run with {why}; set trainer.rollout_lanes=1")


def build_sampler(config: Config, task: Task, rng: random.Random):
    """The `sampler.name` sampler over `task`, drawing prompts with the run's prompt RNG `rng`."""
    make = bound(config, "sampler.name")
    return make(task=task, rng=rng)  # one that predicts pass rates where calibrated (config.checks)


def fusable(config: Config, policy: PolicyModel, loss: LossSpec, advantage) -> bool:
    """Whether the steps can take pi_prox from the update's forward (`trainer.proximal`): one
    optimizer step per batch, a policy whose training forward gives the log-probs themselves (a
    diffusion estimator's forward is a sample), and nothing that reads pi_prox before the update
    (expert rows, a KL penalty in the reward, a critic's warm-up steps without a policy update, an
    advantage estimator that reads the old policy)."""
    t = config.trainer
    reads_old = needs_of(advantage.estimate) & BEHAVIOUR_NEEDS  # its own old-policy pass runs anyway (OTB)
    return (t.ppo_epochs == 1 and t.minibatches == 1 and policy.exact_logprobs
            and not config.expert.per_step and advantage.returns is None and loss.reward_kl is None and not reads_old)


def learner_engine(config: Config, plain: torch.nn.Module, tokenizer, shard: Shard):
    """The rollout engine over `plain`, the full weights. Of FSDP2 learners, an engine with its
    own weights (vLLM) is rank 0's alone, in a process of its own (`LeadEngine`), fed the gathered
    weights after every step, and so are Ray rollout workers under `trainer.ray_learners`; the
    torch engine samples each rank's share (`RankEngine`)."""
    t = config.trainer
    if shard.fsdp and t.ray_learners and t.rollout_workers > 1:
        workers = None
        if shard.rank == 0:
            workers = RayEngine(functools.partial(build.build_engine, config), plain, tokenizer,
                                workers=t.rollout_workers, threads=t.threads or 1, rows_mode=False, version=0,
                                own_weights=engine_kind(config).own_weights)
        return LeadEngine(workers, plain, shard)
    if not (shard.fsdp and engine_kind(config).own_weights):
        return build.build_engine(config, plain, tokenizer)
    lead = build.build_vllm_engine(config, plain, tokenizer, own_process=True) if shard.rank == 0 else None
    return LeadEngine(lead, plain, shard)


DTYPES = {"": None, "float32": torch.float32, "bfloat16": torch.bfloat16}  # trainer.fsdp_*_dtype


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


def step_plan(config: Config, loss: LossSpec, advantage, *, fused: bool, shard: Shard = ONE_PROCESS) -> StepPlan:
    """What every step of this run does (`trainer.plan.StepPlan`), resolved from the config and the
    declarations of the engine and the bound registry entries. `shard`: this process's rank of
    the data-parallel learners (its engine then samples from a copy of the weights pushed after
    every step)."""
    r, t, a = config.rollout, config.trainer, config.algo
    kind = engine_kind(config)
    correcting = rollout_correction_on(config)
    behaviour = loss.correction or BEHAVIOUR_WEIGHTS
    proximal = "fused" if fused else "pass"
    on_policy = t.ppo_epochs == 1 and t.minibatches == 1 and not correcting and kind.exact_logprobs
    shaping = None
    if a.overlong_buffer > 0:
        shaping = functools.partial(overlong_penalty, max_length=r.max_new_tokens, overlong_buffer=a.overlong_buffer,
                                    overlong_factor=a.overlong_factor)
    expert = None
    if config.expert.per_step:
        e = config.expert
        expert = ExpertPlan(mu=functools.partial(chord_mu, weight=e.weight, weight_final=e.weight_final,
                                                 decay_steps=e.decay_steps),
                            keep_onpolicy=e.keep_onpolicy, token_units=counts_tokens(loss.aggregation),
                            advantage=e.advantage,
                            canvas=Canvas(r.max_new_tokens, r.window) if config.model.kind == "diffusion" else None)
    kl_controller = None
    if a.kl_target is not None and (a.kl_coef > 0 or needs_reference(loss.objective)):
        kl_controller = functools.partial(adaptive_kl_coef, kl_target=a.kl_target, kl_horizon=a.kl_horizon)
    rollout = RolloutPlan(seed=config.seed, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                          temperature=r.temperature, greedy_in_group=r.greedy_in_group,
                          group_filter=group_filter(a),
                          micro_group_size=r.micro_group_size or r.group_size,
                          greedy_baseline="baseline_rewards" in advantage.needs,
                          inpaint=InpaintPlan(r.igpo_hint_low, r.igpo_hint_high, int(r.igpo_replace * r.group_size),
                                              r.max_new_tokens) if r.igpo else None,
                          calibration=calibration(config.sampler))
    return StepPlan(
        rollout=rollout, micro_batch_size=t.micro_batch_size, ppo_epochs=t.ppo_epochs, minibatches=t.minibatches,
        grad_clip=config.optim.grad_clip, samples_per_step=t.samples_per_step,
        fresh=Proximal("none" if on_policy else proximal, behaviour if correcting else None),
        stale=Proximal(proximal, behaviour),
        push_weights=(kind.own_weights and not shares_engine(config)) or shard.fsdp,
        overlong_filter=a.overlong_filter, shaping=shaping, token_rewards="token_rewards" in needs_of(loss.objective),
        value_clip=a.value_clip, critic_warmup_steps=a.critic_warmup_steps, kl_controller=kl_controller,
        expert=expert, shard=shard, push_merged=not shard.fsdp)


def loop_plan(config: Config, shard: Shard = ONE_PROCESS) -> LoopPlan:
    """The schedule around the steps and what the run records (`trainer.plan.LoopPlan`); of
    data-parallel learners only rank 0 writes."""
    t, r = config.trainer, config.rollout
    facts = {"rollout_engine": r.engine, "decode_engine": r.decode_engine} if config.model.kind == "causal" else {}
    return LoopPlan(steps=t.steps, eval_every=t.eval_every, save_every=t.save_every, keep_last=t.keep_last,
                    eval_samples=t.eval_samples, eval_temperature=r.temperature,
                    trackers=tracker_names(config),
                    adapter_checkpoints=config.model.lora.r > 0,
                    push_on_resume=engine_kind(config).own_weights or shard.fsdp,
                    facts={**facts, "learners": shard.size, "fsdp": True} if shard.fsdp else facts,
                    batch_numbers=derived_batch_numbers(config), config_tree=to_dict(config),
                    upper_bounds=config.algo.dynamic_sampling, writer=shard.rank == 0,
                    reads_advantages=config.algo.objective not in ADVANTAGE_FREE)


def tracker_names(config: Config) -> tuple[str, ...]:
    """The sinks `trainer.trackers` names, in order."""
    return tuple(n.strip() for n in config.trainer.trackers.split(",") if n.strip())


def asynchronous(config: Config) -> bool:
    """Rollouts run ahead of the learner: `trainer.max_staleness` set, or the Ray backend."""
    return config.trainer.max_staleness is not None or _on_ray(config)


def _on_ray(config: Config) -> bool:
    """The rollout side on Ray actors (not Ray-started learners, which sample as torchrun's do)."""
    return ray_rollouts(config.trainer.backend, config.trainer.ray_learners)


def shares_engine(config: Config) -> bool:
    """An engine with its own weights under local asynchronous rollouts: the rollout side and the
    learner's evaluation share the run's one engine (`snapshot.SharedEngine`); the rollout side pushes."""
    return asynchronous(config) and not _on_ray(config) and engine_kind(config).own_weights


@dataclass(frozen=True)
class ThreadLayout:
    """The row pools of each side and the async plan (None for the synchronous loop)."""

    learner_rows: RowPool | None
    rollout_rows: RowPool | None = None
    rows_mode: bool = False
    rollout_worker_threads: int = 1
    plan: AsyncPlan | None = None


def _pool(threads: int) -> RowPool | None:
    return RowPool(threads) if threads > 1 else None


def thread_layout(config: Config, runtime: Runtime) -> ThreadLayout:
    """Threads and row pools for each side of the run. Synchronous: the process's own (`runtime`).
    Asynchronous with rows split over threads and a local backend: the two sides share all the
    process's cores through one `rows.CoreLease`, each splitting its rows as the synchronous loop
    does. Otherwise overlapping sides each get a fixed share (`runtime.thread_budget`), and sides
    that alternate (`max_staleness=0`) each use what the synchronous loop would."""
    if not asynchronous(config):
        return ThreadLayout(runtime.rows)
    t = config.trainer
    max_staleness = t.max_staleness or 0
    exact = t.staleness == "exact"
    overlap = max_staleness > 0
    workers = t.rollout_workers if _on_ray(config) else 1
    cores = available_cores(t.threads)
    budget = thread_budget(cores, overlap=overlap, rollout_workers=workers)
    kind = engine_kind(config)
    own = kind.own_weights  # vLLM: never a second engine here (it is shared or on its workers)
    # FSDP2 learners run each batch whole: lanes on another thread would unshard a layer mid-forward
    rows_mode = not kind.batches_itself and not runtime.shard.fsdp and (
        runtime.rows is not None or resolve_mode(t.thread_mode, config.model.kind) == "rows")
    facts = {"learner": budget["learner"], "rollout_worker": budget["rollout_worker"],
             "concurrent": budget["concurrent"], "rows_mode": rows_mode}
    torch_threads = torch.get_num_threads()
    if overlap and rows_mode and not _on_ray(config) and cores > 1:  # either side on every core, never more in all
        lease = CoreLease(cores)
        plan = AsyncPlan(max_staleness, exact, learner_threads=1, rollout_threads=1, publish_merged=own,
                         facts={"learner": cores, "rollout_worker": cores, "concurrent": cores, "rows_mode": True,
                                "shared_cores": True})
        return ThreadLayout(RowPool(cores, lease), RowPool(cores, lease), True, budget["rollout_worker"], plan)
    if overlap:
        learner = _pool(budget["learner"]) if rows_mode else None
        rollout = _pool(budget["rollout_worker"]) if rows_mode else None
        plan = AsyncPlan(max_staleness, exact, learner_threads=1 if rows_mode else budget["learner"],
                         rollout_threads=1 if rows_mode else budget["rollout_worker"], publish_merged=own,
                         facts=facts)
        return ThreadLayout(learner, rollout, rows_mode, budget["rollout_worker"], plan)
    plan = AsyncPlan(max_staleness, exact, learner_threads=torch_threads, rollout_threads=torch_threads,
                     publish_merged=own, facts=facts)
    return ThreadLayout(runtime.rows, runtime.rows, rows_mode, budget["rollout_worker"], plan)


def rollout_side(config: Config, c: Components, layout: ThreadLayout, start: int) -> RolloutSide:
    """The asynchronous rollout side, starting at policy version `start`: the sampler and the
    verifier on Ray actors, the run's own engine shared with evaluation (an engine with its own
    weights), or a snapshot of the weights sampled in a thread of this process."""
    if _on_ray(config):
        t = config.trainer
        ensure_ray(t.ray_address, available_cores(t.threads))
        engine = RayEngine(functools.partial(build.build_engine, config), c.model, c.tokenizer,
                           workers=t.rollout_workers, threads=layout.rollout_worker_threads, rows_mode=layout.rows_mode,
                           version=start, own_weights=engine_kind(config).own_weights)
        reward = RayReward(functools.partial(build.build_verifier, config), c.tokenizer, workers=t.reward_workers)
        # this process only tokenizes, decodes and checks answers for the rollout side
        return RolloutSide(dataclasses.replace(c, engine=engine, reward=reward), engine, threads=1,
                           closers=(engine.close, reward.close))
    threads = layout.plan.rollout_threads
    if shares_engine(config):
        engine = SharedEngine(c.engine, start, exact=layout.plan.exact)
        return RolloutSide(dataclasses.replace(c, engine=engine), engine, threads=threads, shared=True)

    shard = c.plan.shard
    side_shard = side_group(shard, config.trainer.collective_timeout_s) if shard.fsdp else shard

    def make(model, rows: RowPool | None):
        made = build.build_engine(config, model, c.tokenizer)
        made = split_engine(made, rows, c.tokenizer.pad_token_id, model) if rows is not None else made
        # data-parallel learners: this rank samples its share, exchanged on the rollout side's own group
        return RankEngine(made, model, side_shard, c.tokenizer.pad_token_id) if shard.fsdp else made

    lease = layout.rollout_rows.lease if layout.rollout_rows is not None else None
    reward = c.reward if lease is None else _scoring_without_core(c.reward, lease)
    lanes = []
    for lane in range(config.trainer.rollout_lanes):  # a lane's own row pool: two maps at once never queue
        rows = layout.rollout_rows
        rows = RowPool(rows.workers, rows.lease) if lane and rows is not None else rows
        # sharded learners: the snapshot copies the plain full weights, never the shards
        engine = SnapshotEngine(c.full_weights, functools.partial(make, rows=rows), version=start)
        lanes.append((dataclasses.replace(c, engine=engine, reward=reward), engine))
    return RolloutSide(*lanes[0], threads=threads, lanes=tuple(lanes))


def _scoring_without_core(reward, lease: CoreLease):
    """The verifier, called with the rollout side's core given back: scoring mostly waits (sandboxed
    test processes, a judge, a remote service), and meanwhile the learner computes on that core."""
    def score(prompts, texts, examples):
        with lease.released():
            return reward(prompts, texts, examples)

    score.on_step_begin = getattr(reward, "on_step_begin", lambda step, steps: None)
    score.reads_step = reads_step(reward)
    return score
