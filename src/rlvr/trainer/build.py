"""The one place that reads the config and builds components (STYLE §7)."""

from __future__ import annotations

import dataclasses
import inspect

import torch

from rlvr.algos.advantages import get_advantage
from rlvr.algos.aggregate import get_aggregation
from rlvr.algos.kl import get_kl_estimator
from rlvr.algos.objectives import get_objective
from rlvr.config import Config
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import load_causal_lm
from rlvr.rewards.runner import RewardRunner, load_reward_fn
from rlvr.tasks import TASKS, make_task
from rlvr.trainer.step import LossSpec


def _lookup(getter, name: str, field: str):
    try:
        return getter(name)
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{field}: {str(err).strip(chr(39))}") from None


def build_model(config: Config):
    m = config.model
    return load_causal_lm(m.path, seed=config.seed, hidden_size=m.hidden_size, num_layers=m.num_layers,
                          num_heads=m.num_heads, intermediate_size=m.intermediate_size, max_seq_len=m.max_seq_len)


def _task_keywords(cls) -> set[str]:
    """Keyword arguments a task class accepts, following **kwargs up its base classes."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= {p.name for p in inspect.signature(init).parameters.values()
                      if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"}
    return names


def build_task(config: Config, tokenizer=None):
    """The task named by `task.name`, given the knobs it declares (unset fields keep its defaults)."""
    t = config.task
    if t.name not in TASKS:
        raise ConfigError(f"task.name: unknown task '{t.name}'; valid: {', '.join(sorted(TASKS))}")
    accepted = _task_keywords(TASKS[t.name])
    options = {k: v for k, v in dataclasses.asdict(t).items() if k != "name" and k in accepted and v is not None}
    options.update({k: v for k, v in (("tokenizer", tokenizer), ("seed", config.seed)) if k in accepted})
    try:
        return make_task(t.name, **options)
    except (ValueError, FileNotFoundError, OSError) as err:
        raise ConfigError(f"task: {err}") from None


def build_reward(config: Config, task) -> RewardRunner:
    """The verifier: the user's `reward.fn` when set, otherwise the task's own (batched if it has one)."""
    if config.reward.fn:
        return RewardRunner(load_reward_fn(config.reward.fn), name="user")
    return RewardRunner(getattr(task, "reward_batch", task.reward), name="task")


def hparams(config: Config) -> dict:
    """The flat hyperparameter namespace the algos functions pick their keywords from."""
    values = dataclasses.asdict(config.algo)
    if values["norm_length"] is None:
        values["norm_length"] = float(config.rollout.max_new_tokens)
    return values


def build_loss(config: Config) -> LossSpec:
    a = config.algo
    kl_in_loss = a.kl_coef > 0 and a.kl_placement == "loss"
    return LossSpec(
        objective=_lookup(get_objective, a.objective, "algo.objective"),
        aggregation=_lookup(get_aggregation, a.aggregation, "algo.aggregation"),
        kl_estimator=_lookup(get_kl_estimator, a.kl_estimator, "algo.kl_estimator") if kl_in_loss else None,
        kl_coef=a.kl_coef,
        entropy_coef=a.entropy_coef,
        hparams=hparams(config),
    )


def build_advantage(config: Config):
    return _lookup(get_advantage, config.algo.advantage, "algo.advantage")


def build_optimizer(params, *, lr: float, warmup_steps: int, weight_decay: float = 0.0,
                    betas: tuple[float, float] = (0.9, 0.99)):
    """AdamW with linear warmup, then constant."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    warm = max(warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warm))
    return optimizer, scheduler
