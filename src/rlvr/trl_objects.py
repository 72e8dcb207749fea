"""TRL's objects where TRL's `GRPOTrainer` takes them: ``args=GRPOConfig(...)`` (or its dict),
``peft_config=LoraConfig(...)`` and ``processing_class=tokenizer``, as config overrides and arguments.

- ``args``: every `GRPOConfig` name of `rlvr.config.trl_names` becomes its rlvr field, the batch sizes
  become prompts per step (`rlvr.config.from_trl.batch_sizes`), and TRL's own defaults apply to what
  the object leaves unset, so ``GRPOConfig(output_dir=...)`` means what it means in TRL
  (``learning_rate`` 1e-6, 8 generations ...). With no ``max_steps``, ``num_train_epochs`` passes over
  the rows set ``trainer.steps``. What has no rlvr field is said once, as a note; ``overrides=`` win
  over ``args``. The logging names go to the callbacks (`rlvr.callbacks`).
- ``peft_config``: a `peft.LoraConfig` becomes ``model.lora.*``; a setting rlvr's adapters do not
  have (DoRA, rsLoRA, a bias, modules to save ...) is refused with one line.
- ``processing_class``: the tokenizer of a model object; with a model directory, its own tokenizer
  (another one is refused: the directory's is the one checkpoints save).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["bind_callbacks", "epoch_steps", "merged", "peft_overrides", "processing_tokenizer", "refuse_unknown",
           "trl_overrides"]

# TRL's `GRPOTrainer` arguments rlvr.Trainer has no counterpart for: what to do instead.
TRL_ONLY = {
    "optimizers": "rlvr builds the optimizer and schedule from optim.* (overrides={'optim.lr': ...})",
    "reward_processing_classes": "a reward model's tokenizer is the one saved in its folder (reward.fn=DIR)",
    "rollout_func": "multi-turn rollouts are an agent task (docs/custom-environment.md)",
    "tools": "tools belong to an agent task (docs/custom-environment.md)",
    "environment_factory": "environments are agent tasks (docs/custom-environment.md)",
}

# Names of a `TrainingArguments` dump that are bookkeeping (tokens, loggers, resolved defaults), not the job.
BOOKKEEPING = {"disable_tqdm", "hub_token", "accelerator_config", "debug", "pad_to_multiple_of", "logging_dir",
               "logging_steps", "logging_first_step", "logging_strategy", "run_name", "push_to_hub", "hub_model_id",
               "use_cpu", "dataloader_pin_memory"}
LORA_FIELDS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "target_modules"}
LORA_BOOKKEEPING = {"task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
                    "inference_mode"}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _grpo_defaults() -> dict[str, Any]:
    """Each `trl.GRPOConfig` field's default ({} without TRL)."""
    try:
        from trl import GRPOConfig
    except ImportError:
        return {}
    out = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _values(args: Any) -> dict[str, Any]:
    if isinstance(args, Mapping):
        return dict(args)
    if callable(getattr(args, "to_dict", None)) and dataclasses.is_dataclass(args):
        return args.to_dict()
    raise ConfigError(f"args: expected TRL's GRPOConfig or a dict of its fields, got {type(args).__name__}; "
                      f"rlvr's own settings go in overrides=")


def trl_overrides(args: Any) -> tuple[list[str], list[str], float | None]:
    """(``key=value`` overrides, notes on what was not converted, epochs to turn into steps or None)
    for TRL's `args`."""
    from rlvr.config.from_trl import JOB_NAMES, convert
    from rlvr.config.trl_names import TRL_NAMES

    if args is None:
        return [], [], None
    values = _values(args)
    defaults = _grpo_defaults()
    kept = {k: v for k, v in values.items() if k not in BOOKKEEPING and (
        k in TRL_NAMES or k in JOB_NAMES or k not in defaults or _plain(v) != defaults[k])}
    epochs = None
    if kept.get("max_steps") in (None, -1) and kept.get("num_train_epochs") is not None:
        epochs = float(kept.pop("num_train_epochs"))
    tree, notes = convert(kept)
    return [f"{key}={json.dumps(value)}" for key, value in _dotted(tree)], notes, epochs


def merged(trl: list[str], overrides: list[str]) -> list[str]:
    """TRL's overrides, less the fields the caller's `overrides` set (theirs win), then the caller's.

    >>> merged(["rollout.group_size=4", "optim.lr=1e-06"], ["num_generations=2"])
    ['optim.lr=1e-06', 'num_generations=2']
    """
    from rlvr.config.trl_names import TRL_NAMES

    keys = [item.split("=", 1)[0].strip() for item in overrides]
    own = set(keys) | {field for key in keys if key in TRL_NAMES for field in TRL_NAMES[key].fields()}
    return [item for item in trl if item.split("=", 1)[0] not in own] + overrides


def _dotted(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def epoch_steps(epochs: float, rows: int, prompts_per_step: int) -> str:
    """The `trainer.steps` override of `epochs` passes over `rows` prompts (steps are rollout batches).

    >>> epoch_steps(3.0, 40, 8)
    'trainer.steps=15'
    """
    return f"trainer.steps={max(1, math.ceil(epochs * rows / prompts_per_step))}"


def peft_overrides(peft_config: Any) -> list[str]:
    """``model.lora.*`` overrides for a `peft.LoraConfig`."""
    if peft_config is None:
        return []
    if type(peft_config).__name__ != "LoraConfig" or not dataclasses.is_dataclass(peft_config):
        raise ConfigError(f"peft_config: rlvr's adapters are LoRA; pass peft.LoraConfig(...) (or set model.lora.*), "
                          f"got {type(peft_config).__name__}")
    fresh = type(peft_config)()
    for f in dataclasses.fields(peft_config):
        if f.name in LORA_FIELDS or f.name in LORA_BOOKKEEPING:
            continue
        value = getattr(peft_config, f.name)
        if _plain(value) != _plain(getattr(fresh, f.name)):
            raise ConfigError(f"peft_config.{f.name}={value!r}: rlvr's adapters take r, lora_alpha, lora_dropout and "
                              f"target_modules (model.lora.*); leave {f.name} at peft's default")
    task = _plain(peft_config.task_type)
    if task not in (None, "CAUSAL_LM"):
        raise ConfigError(f"peft_config.task_type={task!r}: rlvr trains causal LMs; use task_type='CAUSAL_LM'")
    out = {"r": peft_config.r, "alpha": float(peft_config.lora_alpha), "dropout": float(peft_config.lora_dropout)}
    targets = peft_config.target_modules
    if targets is not None:  # None: rlvr's all-linear (peft's None picks per architecture)
        out["target_modules"] = targets if isinstance(targets, str) else sorted(targets)
    return [f"model.lora.{key}={json.dumps(value)}" for key, value in out.items()]


def processing_tokenizer(processing_class: Any, tokenizer: Any, model: Any) -> Any:
    """The tokenizer `rlvr.Trainer` takes for TRL's `processing_class` (None: the model directory's own)."""
    if processing_class is None:
        return tokenizer
    if tokenizer is not None:
        raise ConfigError("processing_class: names the tokenizer, as tokenizer= does; pass one of them")
    if model is None or isinstance(model, (str, Path)):
        source = str(getattr(processing_class, "name_or_path", "") or "")
        if model is not None and _same_source(source, str(model)):
            return None  # the directory's own tokenizer, which rlvr loads with it
        raise ConfigError("processing_class: with a model directory rlvr uses the tokenizer saved beside it; pass "
                          "model=AutoModelForCausalLM.from_pretrained(...) to train with another tokenizer")
    return processing_class


def _same_source(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Path(a).resolve() == Path(b).resolve() and Path(a).exists()
    except OSError:
        return False


def refuse_unknown(unknown: dict[str, Any], train_dataset: Any) -> None:
    """One line for a keyword `rlvr.Trainer` does not take (a TRL one: what to do instead), and for
    TRL's `args` given in `train_dataset`'s place (TRL's third positional argument)."""
    if unknown:
        name = next(iter(unknown))
        fix = TRL_ONLY.get(name, "see help(rlvr.Trainer) for the arguments; config fields go in overrides=")
        raise ConfigError(f"{name}: not an rlvr.Trainer argument; {fix}")
    if type(train_dataset).__name__.endswith(("Config", "Arguments")) and hasattr(train_dataset, "to_dict"):
        raise ConfigError(f"train_dataset: got a {type(train_dataset).__name__}; pass it as args=... (rlvr.Trainer's "
                          f"third positional argument is train_dataset)")


def training_arguments(given: Any, *, out_dir: Path, steps: int, lr: float, seed: int) -> Any:
    """What a `TrainerCallback` gets as ``args``: TRL's object as given, else `TrainingArguments`
    holding the run's numbers."""
    import torch
    from transformers import TrainingArguments

    if isinstance(given, TrainingArguments):
        return given
    logging = dict(given).get("logging_steps", 10) if isinstance(given, Mapping) else 10
    return TrainingArguments(output_dir=str(out_dir), max_steps=steps, learning_rate=lr, seed=seed,
                             logging_steps=logging, report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False)


def bind_callbacks(callbacks: list, given: Any, config: Any, run_dir: Path, *, rows: list | None, model: Any,
                   tokenizer: Any) -> None:
    """`transformers.TrainerCallback`s get the run's numbers (``args``, ``state``) as TRL's do, and
    ``on_init_end``."""
    from rlvr.callbacks import TrainerCallbackHooks

    hooks = [cb for cb in callbacks if isinstance(cb, TrainerCallbackHooks)]
    if not hooks:
        return
    t = config.trainer
    args = training_arguments(given, out_dir=run_dir, steps=t.steps, lr=config.optim.lr, seed=config.seed)
    share = config.rollout.prompts_per_step / len(rows) if rows else 0.0  # of an epoch, per step
    for cb in hooks:
        cb.bind(args, max_steps=t.steps, epoch_per_step=share, logging_steps=args.logging_steps,
                save_steps=t.save_every, eval_steps=t.eval_every,
                kwargs={"model": model, "processing_class": tokenizer})
