"""The one place that reads the config and builds components (STYLE §7)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import torch

from rlvr.algos.advantages import get_advantage
from rlvr.algos.aggregate import get_aggregation
from rlvr.algos.kl import get_kl_estimator
from rlvr.algos.objectives import get_objective
from rlvr.config import Config
from rlvr.errors import ConfigError
from rlvr.algos import keyword_params
from rlvr.models.causal_lm import load_causal_lm
from rlvr.models.diffusion_lm import load_diffusion_lm
from rlvr.models.diffusion_policy import DiffusionPolicy
from rlvr.models.likelihood import get_estimator
from rlvr.models.policy import CausalPolicy
from rlvr.protocols import RolloutEngine
from rlvr.engines.torch_ar import generate
from rlvr.engines.torch_diffusion import generate_diffusion
from rlvr.rewards.runner import RewardRunner, RewardSum, load_reward_spec
from rlvr.tasks import TASKS, make_task
from rlvr.trainer.step import LossSpec


def _lookup(getter, name: str, field: str):
    try:
        return getter(name)
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{field}: {str(err).strip(chr(39))}") from None


def build_model(config: Config):
    """(model, tokenizer) for `model.kind`: a causal LM or a masked-diffusion LM."""
    m = config.model
    size = dict(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                intermediate_size=m.intermediate_size, max_seq_len=m.max_seq_len)
    if m.kind == "diffusion":
        return load_diffusion_lm(m.path or None, seed=config.seed, shift_logits=m.shift_logits, **size)
    return load_causal_lm(m.path, seed=config.seed, **size)


_ESTIMATOR_OPTIONS = {  # estimator keyword -> AlgoConfig field
    "n": "mc_samples", "antithetic": "antithetic", "p_mask_prompt": "p_mask_prompt", "t_min": "t_min",
    "t_max": "t_max", "include_full": "include_full", "beta": "spg_beta", "omega": "spg_omega",
    "bound": "spg_bound", "block_length": "spg_block_length", "shrink": "trace_shrink",
}


def build_policy(config: Config, model):
    """The PolicyModel: exact per-token log-probs (causal) or a named likelihood estimator (diffusion)."""
    temperature = config.rollout.temperature
    if config.model.kind != "diffusion":
        return CausalPolicy(model, temperature=temperature, kernels=config.trainer.kernels)
    estimator = _lookup(get_estimator, config.algo.estimator, "algo.estimator")
    accepted = keyword_params(estimator)
    options = {k: getattr(config.algo, f) for k, f in _ESTIMATOR_OPTIONS.items() if k in accepted}
    return DiffusionPolicy(model, config.algo.estimator, window=config.rollout.window, temperature=temperature,
                           **{k: v for k, v in options.items() if v is not None})


def build_engine(config: Config, model, tokenizer) -> RolloutEngine:
    """The rollout engine: `engine(prompt_ids, prompt_mask, seeds, *, temperature) -> Rollouts`."""
    r = config.rollout
    if config.model.kind != "diffusion":
        return functools.partial(generate, model, max_new_tokens=r.max_new_tokens, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id, top_p=r.top_p, engine=r.decode_engine)
    settings = dict(gen_length=r.max_new_tokens, steps=r.diffusion_steps or r.max_new_tokens,
                    block_length=r.block_length or None, remasking=r.remasking, threshold=r.threshold,
                    suppress_eos=r.suppress_eos, mask_id=tokenizer.mask_token_id, eos_id=tokenizer.eos_token_id,
                    window=r.window)
    return functools.partial(generate_diffusion, model, **settings)


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


def build_reward(config: Config, task) -> RewardRunner | RewardSum:
    """The verifier: the user's `reward.fn` when set (one function or a weighted sum of several),
    otherwise the task's own (batched if it has one)."""
    if config.reward.fn:
        fns, weights = zip(*load_reward_spec(config.reward.fn))
        return RewardSum(fns, weights)
    return RewardRunner(getattr(task, "reward_batch", task.reward), name="task")


def hparams(config: Config) -> dict:
    """The flat hyperparameter namespace the algos functions pick their keywords from."""
    values = dataclasses.asdict(config.algo)
    values["group_size"] = config.rollout.group_size
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


def lr_factor(step: int, *, warmup_steps: int, total_steps: int = 0, schedule: str = "constant",
              min_ratio: float = 0.0) -> float:
    """LR multiplier after `step` scheduler steps: linear warmup, then constant or a cosine decay
    from 1 to `min_ratio` at `total_steps`."""
    warm = max(warmup_steps, 1)
    if step + 1 < warm or schedule == "constant" or total_steps <= warm:
        return min(1.0, (step + 1) / warm)
    progress = min(1.0, (step + 1 - warm) / (total_steps - warm))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params, *, lr: float, warmup_steps: int, weight_decay: float = 0.0,
                    betas: tuple[float, float] = (0.9, 0.99), total_steps: int = 0, schedule: str = "constant",
                    min_lr_ratio: float = 0.0):
    """AdamW with linear warmup, then a constant or cosine-decaying learning rate.

    Floating-point CPU parameters use PyTorch's fused AdamW kernel (one pass over all parameters
    instead of about ten ops per tensor; ≈ 4× faster at rlvr's scale, same update to float rounding,
    tests/perf)."""
    params = list(params)
    fused = bool(params) and all(isinstance(p, torch.Tensor) and p.device.type == "cpu" and p.is_floating_point()
                                 for p in params)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
    factor = functools.partial(lr_factor, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule,
                               min_ratio=min_lr_ratio)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
