"""The builder's part for vision-language models: loading, LoRA placement, policy, engine, and
the checks that run before training (what the image path does not cover yet, and rows whose
images do not fit the model). Decided once here; the loop sees a `VisionPolicy`, an engine that
takes `vision=` rows, and a `VisionPrompts` tokenizer (`models.vlm`)."""

from __future__ import annotations

import functools
import random

from rlvr.config import Config
from rlvr.engines.torch_vlm import generate_vlm
from rlvr.errors import ConfigError
from rlvr.models.causal_lm import REQUIRED, resolve_model_path
from rlvr.models.vlm import VisionPrompts, freeze_vision, image_token_id, is_vlm_dir, load_vlm
from rlvr.models.vlm_policy import VisionPolicy

TEXT_LINEAR = r".*(text_model|language_model)\..*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""peft `target_modules` of `all-linear` on a VLM: the language model's linear layers only."""


def load_if_vision(config: Config):
    """(model, VisionPrompts) when `model.path` is an image-text-to-text checkpoint, else None."""
    m = config.model
    if m.kind != "causal" or not m.path or m.path == REQUIRED:
        return None
    directory = resolve_model_path(m.path)
    return load_vlm(m.path, directory, dtype=m.dtype) if is_vlm_dir(directory) else None


def is_vision_model(model) -> bool:
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    return hasattr(getattr(base, "config", None), "vision_config")


def lora_targets(config: Config, model):
    """LoRA's `target_modules`: on a VLM, `all-linear` means the language model's unless
    `model.train_vision` (then every linear layer but the head, vision tower included)."""
    targets = config.model.lora.target_modules
    if is_vision_model(model) and targets == "all-linear" and not config.model.train_vision:
        return TEXT_LINEAR
    return targets


def prepare_vision(config: Config, model) -> None:
    """The vision tower (and connector) frozen unless `model.train_vision`."""
    if is_vision_model(model):
        freeze_vision(model, train_vision=config.model.train_vision)


def vision_policy(config: Config, model) -> VisionPolicy:
    return VisionPolicy(model, image_id=image_token_id(model), temperature=config.rollout.temperature)


def vision_engine(config: Config, model, tokenizer):
    r = config.rollout
    return functools.partial(generate_vlm, model, image_id=image_token_id(model), max_new_tokens=r.max_new_tokens,
                             eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, top_p=r.top_p,
                             top_k=r.top_k, min_p=r.min_p)


UNSUPPORTED = (
    ("rollout.engine", lambda c: c.rollout.engine != "torch", "torch"),
    ("rollout.repetition_penalty", lambda c: c.rollout.repetition_penalty != 1.0, "1.0"),
    ("rollout.greedy_in_group", lambda c: c.rollout.greedy_in_group, "false"),
    ("rollout.speculative", lambda c: c.rollout.speculative, "false"),
    ("expert.per_step", lambda c: c.expert.per_step > 0, "0"),
    ("trainer.ray_learners", lambda c: c.trainer.ray_learners, "false"),
)
"""Options the image path does not cover yet: (field, set?, the value to use instead)."""


def check_vision_run(config: Config, model, tokenizer, task, *, rows_split: bool, sharded: bool) -> None:
    """Before training: a VLM run uses what the image path covers and rows that carry images; a
    text model gets no rows with images. One-line ConfigErrors naming the field or the row."""
    vision = is_vision_model(model)
    if not vision:
        for index, ex in enumerate(task.heldout()[:256]):
            if ex.meta.get("images"):
                raise ConfigError(f"task: held-out row {index} has field 'images' but model.path is a text-only "
                                  f"model; use an image-text-to-text model (e.g. model.path=rlvr:shapes-vlm-warmstart)")
        return
    for field, on, use in UNSUPPORTED:
        if on(config):
            raise ConfigError(f"{field}: not supported with a vision-language model yet; set {field}={use}")
    if rows_split or sharded:
        raise ConfigError("trainer.thread_mode: a vision-language model runs each batch whole; "
                          "set trainer.thread_mode=ops (or trainer.threads=1) and no FSDP learners")
    examples = [*task.heldout(), *task.sample(64, random.Random(config.seed))]
    if not isinstance(tokenizer, VisionPrompts):
        raise ConfigError("model.path: a vision-language model needs its processor (processor_config.json) beside it")
    try:
        for index, ex in enumerate(examples):
            tokenizer.check_row(ex, index)
    except ValueError as err:
        raise ConfigError(f"task: {err}") from None
