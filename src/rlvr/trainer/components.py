"""Everything a run needs, built once from the config: the model and its policy, the rollout
engine, the task and its verifier, the loss, the optimizer and the run's RNG.

`build_components(config)` reads the config; the keyword arguments let the Python API pass
objects instead (a model and tokenizer in memory, a task built from a dataset, reward callables).
Process-wide settings are not applied here: `rlvr.trainer.runtime.configure_process` does that, and its
`Runtime` is passed in.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from rlvr.config import Config
from rlvr.models.value import ValueModel
from rlvr.protocols import PolicyModel, RolloutEngine, Task, WeightSyncEngine
from rlvr.rewards.runner import RewardRunner
from rlvr.trainer import build
from rlvr.trainer.expert import ExpertSource
from rlvr.trainer.logit_stats import needs_reference
from rlvr.trainer.rows import RowPool, split_engine
from rlvr.trainer.runtime import Runtime
from rlvr.trainer.selection import PosteriorSelector, build_selector
from rlvr.trainer.step import LossSpec


@dataclass
class Components:
    config: Config
    model: torch.nn.Module
    tokenizer: object  # a `transformers` tokenizer (pad, eos and, for diffusion models, mask ids set)
    policy: PolicyModel
    reference: PolicyModel | None  # frozen initial policy, when a KL term is on or the objective reads it
    task: Task
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss: LossSpec
    advantage: object  # a bound advantage estimator: (AdvantageInputs) -> (advantages (B, T), metrics)
    rng: random.Random
    reward: RewardRunner
    engine: RolloutEngine
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    selector: PosteriorSelector | None = None  # prompt selection; None = uniform draws
    rows: RowPool | None = None  # trainer.thread_mode=rows: batches split over worker threads
    heap_kept: bool = False  # glibc keeps freed memory mapped (trainer/allocator.py)
    expert: ExpertSource | None = None  # off-policy expert rows (config section `expert`); None = off


def build_components(config: Config, *, runtime: Runtime | None = None, model: torch.nn.Module | None = None,
                     tokenizer=None, task: Task | None = None, reward: RewardRunner | None = None) -> Components:
    """Build a run's components from `config`; any of `model` (with `tokenizer`), `task` and
    `reward` given here is used instead of the one the config names."""
    runtime = runtime or Runtime()
    model, tokenizer = build.build_model(config) if model is None else (build.prepare_model(config, model), tokenizer)
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
    frozen = copy.deepcopy(model).requires_grad_(False) if with_reference and not lora else None
    policy = build.build_policy(config, model)
    reference = build.build_policy(config, frozen) if frozen is not None else None
    if with_reference and lora:
        from rlvr.models.lora import AdapterDisabled

        reference = AdapterDisabled(policy)
    critic = critic_optimizer = None
    if a.advantage == "gae":
        critic = ValueModel(model)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=a.critic_lr, betas=(o.beta1, o.beta2))
    task = task if task is not None else build.build_task(config, tokenizer)
    build.check_context(config, model, tokenizer, task)
    engine = build.build_engine(config, model, tokenizer)
    if runtime.rows is not None and not isinstance(engine, WeightSyncEngine):  # vLLM batches for itself
        engine = split_engine(engine, runtime.rows, tokenizer.pad_token_id, model)
    reward = reward if reward is not None else build.build_reward(config, task)
    build.check_reward_components(config, reward)
    e = config.expert
    expert = ExpertSource(task, seed=config.seed, per_step=e.per_step, pool_size=e.pool_size) if e.per_step else None
    return Components(
        config=config, model=model, tokenizer=tokenizer, policy=policy, reference=reference, engine=engine,
        task=task, reward=reward, optimizer=optimizer,
        scheduler=scheduler, loss=loss, advantage=build.build_advantage(config),
        rng=random.Random(config.seed), critic=critic, critic_optimizer=critic_optimizer,
        selector=build_selector(config.rollout, config.seed), rows=runtime.rows, heap_kept=runtime.heap_kept,
        expert=expert,
    )
