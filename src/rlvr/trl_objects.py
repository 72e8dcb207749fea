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

__all__ = ["epoch_steps", "peft_overrides", "processing_tokenizer", "training_arguments", "trl_overrides"]

# Names of a `TrainingArguments` dump that are bookkeeping (tokens, loggers, resolved defaults), not the job.
BOOKKEEPING = {"disable_tqdm", "hub_token", "accelerator_config", "debug", "pad_to_multiple_of", "logging_dir",
               "logging_steps", "logging_first_step", "logging_strategy", "run_name", "push_to_hub", "hub_model_id"}
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


def _dotted(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def epoch_steps(epochs: float, rows: int, prompts_per_step: int) -> int:
    """Steps (rollout batches) of `epochs` passes over `rows` prompts.

    >>> epoch_steps(3.0, 40, 8)
    15
    """
    return max(1, math.ceil(epochs * rows / prompts_per_step))


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


def training_arguments(given: Any, *, out_dir: Path, steps: int, lr: float, seed: int, cpu: bool) -> Any:
    """What a `TrainerCallback` gets as ``args``: TRL's object as given, else `TrainingArguments`
    holding the run's numbers."""
    from transformers import TrainingArguments

    if isinstance(given, TrainingArguments):
        return given
    logging = dict(given).get("logging_steps", 10) if isinstance(given, Mapping) else 10
    return TrainingArguments(output_dir=str(out_dir), max_steps=steps, learning_rate=lr, seed=seed,
                             logging_steps=logging, report_to=[], use_cpu=cpu, bf16=False)
