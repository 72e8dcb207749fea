"""Reading a config: a YAML recipe (or a mapping) plus dotted overrides -> a checked, resolved `Config`."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlvr.config.block_checks import block_checks, schedule_checks
from rlvr.config.paths import is_path_field, path_value
from rlvr.config.ranges import allowed, range_of
from rlvr.config.recipes import packaged_recipe
from rlvr.config.registries import _get, engine_kind, resolve
from rlvr.config.schema import Config, section_type
from rlvr.config.spec_checks import spec_checks
from rlvr.config.trl_names import alias_hint, translate, trl_tree
from rlvr.errors import ConfigError
from rlvr.inputs import read_bytes
from rlvr.yaml_io import MAX_BYTES, load_yaml


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Check `value` against a field annotation; ints are accepted where floats are expected."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _coerce(value, option, name)
            except ConfigError as err:
                # for a list, the list option's error (which element is wrong) says more than "expected str"
                first = isinstance(value, list) and typing.get_origin(option) is list
                errors.insert(0 if first else len(errors), err)
        raise errors[0]
    if origin is list:  # list[str]: every element checked too (a list of numbers is not a list of names)
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {_shown(value)}; fix the value in the recipe or override")
        (inner,) = typing.get_args(annotation)
        return [_coerce(item, inner, f"{name}[{i}]") for i, item in enumerate(value)]
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(float(value), name)
    if annotation is float and isinstance(value, str):  # YAML 1.1 reads `5e-5` (no dot) as a string
        try:
            return _finite(float(value), name)
        except ValueError:
            pass
    if isinstance(value, annotation) and not (annotation is int and isinstance(value, bool)):
        return value
    if callable(value):
        fix = "pass it to rlvr.Trainer as reward_funcs=fn, or name it as 'file.py:name'" if name.startswith(
            "reward") else "config values are plain data (numbers, strings, lists)"
        raise ConfigError(f"{name}: a Python callable cannot go in the config; {fix}")
    shown = "null" if value is None else _shown(value)
    raise ConfigError(f"{name}: expected {annotation.__name__}, got {shown}; fix the value in the recipe or override")


def _shown(value: Any) -> str:
    """A value for an error line, shortened: a long list or string would make the line unreadable."""
    return reprlib.repr(value)


def _finite(value: float, name: str) -> float:
    """No config number is meaningful as inf or nan (an lr of inf trains to nan; null turns off
    the fields that can be off)."""
    if not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value}; fix the value in the recipe or override")
    return value


def _build(cls: type, values: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'{_suggest(full)}")
        section = section_type(hints[key])
        if section is not None and value is None and section is not hints[key]:
            kwargs[key] = None  # an optional section left empty (a task that is not chosen)
        elif section is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a section (mapping), got {_shown(value)}")
            kwargs[key] = _build(section, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, hints[key], full)
            if isinstance(kwargs[key], str) and is_path_field(full):
                kwargs[key] = path_value(full, kwargs[key])
    return cls(**kwargs)


def schema_defaults(cls: type | None = None, prefix: str = "") -> dict[str, Any]:
    """Every dotted leaf key of the schema -> its default in the dataclass, e.g. 'algo.clip_high': None."""
    cls = cls or Config
    hints = typing.get_type_hints(cls)
    defaults = {}
    for f in dataclasses.fields(cls):
        section = section_type(hints[f.name])
        if section is not None:
            defaults.update(schema_defaults(section, f"{prefix}{f.name}."))
        else:
            defaults[f"{prefix}{f.name}"] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return defaults


def all_keys(cls: type | None = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema, e.g. 'algo.clip_high'."""
    return list(schema_defaults(cls, prefix))


def _suggest(full: str) -> str:
    hint = alias_hint(full)  # a TRL name in a section (`algo.beta`): its meaning before any spelling
    if hint:
        return hint
    keys = all_keys()
    leaf = full.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    same_leaf.sort(key=lambda k: -len(os.path.commonprefix([k.split("."), full.split(".")])))  # nearest section first
    close = same_leaf or difflib.get_close_matches(full, keys, n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else "; run `rlvr config` to list valid keys"


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """Set a dotted key; a mapping merges into the section already there (`trainer={threads: 1}`
    after `trainer.steps=7` keeps the steps), anything else replaces it."""
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
        for key, inner in value.items():
            _set_dotted(node[leaf], str(key), inner)
    else:
        node[leaf] = value


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted keys an override sets: `trainer={steps: 7}` sets `trainer.steps`."""
    if isinstance(value, dict) and value:
        return [leaf for inner, sub in value.items() for leaf in _leaves(f"{key}.{inner}", sub)]
    return [key]


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """`key.sub=value` strings -> (key, YAML-parsed value) pairs; a key given twice, directly or
    inside a section's mapping (`trainer.steps=7 trainer={steps: 8}`), is refused (the last one
    would silently win)."""
    pairs, seen = [], {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            example = f"{item.strip()}=VALUE" if not sep and item.strip() else "algo.clip_high=0.28"
            raise ConfigError(f"override '{item}': expected KEY=VALUE, e.g. {example}")
        key = key.strip()
        value = _override_value(key, raw)
        for leaf in _leaves(key, value):
            if leaf in seen:
                raise ConfigError(f"override '{leaf}': given twice ('{seen[leaf]}' and '{item}'); keep one")
            seen[leaf] = item
        pairs.append((key, value))
    return pairs


def _override_value(key: str, raw: str) -> Any:
    """An override's value as YAML (`load_yaml`'s rules); text that is not YAML stays text."""
    if not raw:
        return ""
    try:
        return load_yaml(raw, f"override '{key}'")
    except ConfigError as err:
        if "is not valid YAML" in str(err):
            return raw
        raise


def read_recipe(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"recipe '{path}' is a directory; pass a YAML file in it, "
                          f"e.g. {path / 'grpo_countdown.yaml'}")
    if not path.exists() and packaged_recipe(path) is not None:  # a name (`grpo_countdown`) the package ships
        path = packaged_recipe(path)
    if not path.exists():
        raise ConfigError(f"recipe '{path}' does not exist; pass a YAML file or a packaged recipe's name, "
                          f"e.g. grpo_countdown (`rlvr recipes` lists them)")
    tree = load_yaml(read_bytes(path, "recipe", MAX_BYTES), f"recipe '{path}'") or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe '{path}' must be a mapping of sections (model:, algo:, ...)")
    return tree


def _recipe_tree(recipe: str | Path | dict | None) -> dict:
    tree = copy.deepcopy(dict(recipe)) if isinstance(recipe, dict) else read_recipe(recipe) if recipe else {}
    for key, value in trl_tree(tree):  # TRL's names at the top, as their rlvr fields
        _set_dotted(tree, key, value)
    return tree


def load_config(recipe: str | Path | dict | None = None, overrides: list[str] = ()) -> Config:
    """`recipe`: a YAML file, or its content as a mapping (e.g. `to_dict(config)`, to override a `Config`)."""
    tree = _recipe_tree(recipe)
    for group in translate(parse_overrides(list(overrides))):
        for key, value in group:
            _set_dotted(tree, key, value)
    config = resolve(_build(Config, tree, ""))
    validate(config)
    return config


DERIVED = {"algo.norm_length": "rollout.max_new_tokens", "algo.rollout_correction": "rollout.engine"}
"""Fields that a null resolves from another field rather than from an entry's default."""


def _lookup(tree: dict, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key in a recipe tree."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def load_with_sources(recipe: str | Path | dict | None = None,
                      overrides: list[str] = ()) -> tuple[Config, dict[str, str]]:
    """`load_config(recipe, overrides)` (same errors) and, for every dotted leaf key, what set its
    value: `override <key=value>` (the last one naming it or a section above it), `recipe <file>`,
    `entry default` (null, resolved to the chosen entry's own default), `from <field> (<its
    source>)` (null, resolved from that field: `DERIVED`) or `config default` (the schema's)."""
    config = load_config(recipe, overrides)
    tree = _recipe_tree(recipe)
    label = "recipe (mapping)" if isinstance(recipe, dict) else f"recipe {recipe}"
    defaults = schema_defaults()
    sources = {key: label for key in defaults if _lookup(tree, key)[0]}
    for item, group in zip(overrides, translate(parse_overrides(list(overrides)))):
        for key, value in group:
            _set_dotted(tree, key, value)
            for leaf in _leaves(key, value):
                sources.update({k: f"override {item}" for k in defaults if k == leaf or k.startswith(leaf + ".")})
    for key, default in defaults.items():
        found, value = _lookup(tree, key)
        if (value if found else default) is None and _get(config, key) is not None:
            sources[key] = "entry default"
        sources.setdefault(key, "config default")
    for key, other in DERIVED.items():
        if sources[key] == "entry default":
            sources[key] = f"from {other} ({sources[other]})"
    return config, sources


def _range_errors(node: Any, prefix: str = "") -> list[str]:
    """Every field given a range in the schema (``ranged``) whose value, when not null, is outside it."""
    errors = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            errors += _range_errors(value, f"{prefix}{f.name}.")
        elif (rule := range_of(f)) is not None and value is not None and not allowed(f, value):
            inside = "in " if rule[0] in "[(" else ""
            errors.append(f"{prefix}{f.name}: must be {inside}{rule}, got {value!r}; "
                          "fix the value in the recipe or override")
    return errors


BACKEND_OPTIONS = {  # option -> (the field choosing its backend, the value that uses it)
    "trainer.rollout_workers": ("trainer.backend", "ray"), "trainer.reward_workers": ("trainer.backend", "ray"),
    "trainer.ray_address": ("trainer.backend", "ray"), "trainer.ray_learners": ("trainer.backend", "ray"),
    "rollout.vllm_kv_cache_mb": ("rollout.engine", "vllm"),
    "rollout.vllm_block_size": ("rollout.engine", "vllm"), "rollout.vllm_max_model_len": ("rollout.engine", "vllm"),
}
"""Options read only by one backend: set to anything but their default under another, they would be ignored."""


def _backend_checks(config: Config) -> list[tuple[bool, str, str]]:
    defaults = schema_defaults()
    checks = []
    for key, (chooser, backend) in BACKEND_OPTIONS.items():
        chosen = _get(config, chooser)
        checks.append((chosen == backend or _get(config, key) == defaults[key], key,
                       f"only read with {chooser}={backend} ({chooser} is '{chosen}'); set {chooser}={backend} "
                       f"or remove it"))
    return checks


def _cross_checks(config: Config) -> list[tuple[bool, str, str]]:
    """Ranges that depend on another field (the single-field ones are declared in the schema)."""
    a, r, e, m, t = config.algo, config.rollout, config.estimator, config.model, config.trainer
    diffusion = m.kind == "diffusion"
    blocks = r.max_new_tokens // n if (n := r.block_length or m.block_size) and r.max_new_tokens % n == 0 else 1
    steps = r.diffusion_steps or r.max_new_tokens
    return [
        (a.pass_k is None or a.pass_k <= r.group_size, "algo.pass_k",
         f"must be at most rollout.group_size ({r.group_size}): pass@k draws k of a group's completions"),
        (t.rollout_lanes == 1 or (t.max_staleness or 0) >= 1, "trainer.rollout_lanes",
         "more than 1 needs trainer.max_staleness >= 1 (lanes roll out batches ahead of the update); set "
         "trainer.max_staleness or trainer.rollout_lanes=1"),
        (t.rollout_lanes == 1 or t.backend == "local", "trainer.rollout_lanes",
         "more than 1 is for the local rollout side; on Ray set trainer.rollout_workers instead"),
        (t.rollout_lanes == 1 or not engine_kind(config).own_weights, "trainer.rollout_lanes",
         "more than 1 needs lanes with their own copies of the weights, which an engine with its own weights "
         "(one engine) does not have; set rollout.engine=torch or trainer.rollout_lanes=1"),
        (e.t_min is None or e.t_max is None or e.t_min < e.t_max, "estimator.t_min",
         f"must be below estimator.t_max ({e.t_max})"),
        (not diffusion or not r.block_length or r.max_new_tokens % r.block_length == 0, "rollout.block_length",
         f"must divide rollout.max_new_tokens ({r.max_new_tokens}), or be 0 (the whole window)"),
        (not diffusion or r.threshold is not None or steps % blocks == 0 and steps >= blocks, "rollout.diffusion_steps",
         f"must be a multiple of the number of blocks ({blocks} = max_new_tokens / block_length), or 0"),
        (not diffusion or r.repetition_penalty == 1, "rollout.repetition_penalty", "the causal samplers only; set 1"),
        (bool(m.path) or m.hidden_size % m.num_heads == 0, "model.num_heads",
         f"must divide model.hidden_size ({m.hidden_size}) for a fresh tiny model"),
        (not config.trainer.ray_learners or config.trainer.learners == "fsdp", "trainer.ray_learners",
         "starts FSDP2 learners; set trainer.learners=fsdp as well (or trainer.ray_learners=0)"),
    ]


def _or(value, default):
    """`value`, or `default` where it is null (a 0 stays 0)."""
    return default if value is None else value


def validate(config: Config) -> None:
    """The schema's declared ranges and choices (``ranged``, ``choice``), then the checks that
    span fields or read more than a value's range."""
    errors = _range_errors(config)
    if errors:
        raise ConfigError(errors[0])
    checks = [
        (config.model.kind == "causal" or not (config.rollout.top_k or config.rollout.min_p), "rollout.top_k",
         "top_k and min_p truncate the causal samplers only (the diffusion sampler unmasks by confidence); set 0"),
        (math.isfinite(config.reward.timeout_s) and config.reward.timeout_s >= 0, "reward.timeout_s",
         "must be a number of seconds >= 0, e.g. 10 (0 = no limit)"),
        (config.rollout.prompts_per_step % config.trainer.minibatches == 0, "trainer.minibatches",
         f"must divide rollout.prompts_per_step ({config.rollout.prompts_per_step}) so groups stay whole"),
        (config.model.kind == "causal" or not config.algo.advantage.startswith("optimal_token_baseline"),
         "algo.advantage", "the optimal token baseline reads sum_v pi_v^2 of the logits, which a diffusion "
         "likelihood estimator does not have; use model.kind=causal or another estimator"),
        (config.model.kind == "causal" or config.algo.objective != "shiq", "algo.objective",
         "shiq reads the logits' logsumexp, which a diffusion likelihood estimator does not have; "
         "use model.kind=causal or another objective"),
        (config.algo.objective != "bgpo" or config.model.kind == "diffusion" and config.estimator.name == "bgpo",
         "algo.objective", "bgpo reads the per-draw ELBO estimates of estimator.name=bgpo; set model.kind=diffusion "
         "and estimator.name=bgpo, or use ppo_clip"),
        (config.algo.objective != "dipo" or config.model.kind == "diffusion" and config.estimator.name == "trace"
         and (config.estimator.shrink or 1) == 1, "algo.objective", "dipo takes each sampler step's joint ratio of the "
         "trace estimator's values; set model.kind=diffusion, estimator.name=trace and estimator.shrink=1"),
        (config.algo.advantage != "lightning" or config.model.kind == "diffusion", "algo.advantage",
         "lightning reads each row's denoising steps from the diffusion sampler; set model.kind=diffusion or use grpo"),
        (not config.rollout.igpo or config.model.kind == "diffusion" and config.rollout.engine == "torch",
         "rollout.igpo", "inpaints the diffusion sampler's window; set model.kind=diffusion (torch engine) or false"),
        (config.rollout.igpo_hint_low <= config.rollout.igpo_hint_high, "rollout.igpo_hint_low",
         "must be <= rollout.igpo_hint_high"),
        (config.algo.objective != "reverse_kl_distill" or bool(config.model.teacher_path), "model.teacher_path",
         "reverse_kl_distill trains toward a teacher; set model.teacher_path to its checkpoint"),
        (not config.model.teacher_path or config.model.lora.r == 0, "model.teacher_path",
         "a teacher replaces the LoRA base as the reference; set model.lora.r=0 or drop the teacher"),
        (0 <= config.algo.overlong_buffer <= config.rollout.max_new_tokens, "algo.overlong_buffer",
         "must be between 0 (off) and rollout.max_new_tokens"),
        (_or(config.algo.pass_rate_low, 0.0) < _or(config.algo.pass_rate_high, 1.0),
         "algo.pass_rate_high", "must be above algo.pass_rate_low (the band keeps low < p < high)"),
        (config.model.kind in ("causal", "diffusion"), "model.kind", "must be 'causal' or 'diffusion'"),
        (config.rollout.micro_group_size >= 0 and (config.rollout.micro_group_size == 0
                                                   or config.rollout.group_size % config.rollout.micro_group_size == 0),
         "rollout.micro_group_size", "must be 0 (one pass) or divide rollout.group_size"),
        (not engine_kind(config).causal_only or config.model.kind == "causal", "rollout.engine",
         f"{config.rollout.engine} samples causal models only (the diffusion sampler is rlvr's own); "
         "use rollout.engine=torch"),
        (config.rollout.vllm_block_size >= 0 and config.rollout.vllm_block_size % 16 == 0, "rollout.vllm_block_size",
         "must be 0 (vLLM's default) or a multiple of 16 (32 on CPU)"),
        (re.fullmatch(r"auto|cpu|cuda(:\d+)?", config.trainer.device) is not None, "trainer.device",
         "must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
        (config.model.dtype == "float32" or config.model.kind == "causal", "model.dtype",
         f"{config.model.dtype} is implemented for model.kind=causal only; use float32"),
        (config.trainer.device in ("auto", "cpu") or config.model.kind == "causal", "trainer.device",
         "diffusion models run on the CPU only; use auto or cpu"),
        (bool(config.model.lora.target_modules), "model.lora.target_modules",
         "must name modules, e.g. [q_proj, v_proj] or all-linear"),
        (not config.model.lora.r or config.model.kind == "causal", "model.lora.r",
         "LoRA is implemented for model.kind=causal only; set it to 0"),
        (not config.model.lora.r or config.algo.advantage != "gae", "model.lora.r",
         "the GAE critic is not implemented with LoRA; use a critic-free advantage such as grpo, or set it to 0"),
        (not config.rollout.greedy_in_group or config.model.kind == "diffusion", "rollout.greedy_in_group",
         "is implemented for model.kind=diffusion only; set it to false"),
        (config.trainer.thread_mode != "rows" or config.model.kind == "causal", "trainer.thread_mode",
         "'rows' splits causal-model batches only; use 'ops' with model.kind=diffusion"),
        *_expert_checks(config), *block_checks(config), *spec_checks(config), *schedule_checks(config),
    ]
    for ok, name, fix in checks + _input_checks(config) + _cross_checks(config) + _backend_checks(config):
        if not ok:
            raise ConfigError(f"{name}: {fix}")


def _expert_checks(config: Config) -> list[tuple[bool, str, str]]:
    e = config.expert
    on = e.per_step > 0
    return [
        (e.per_step >= 0, "expert.per_step", "must be >= 0 (0 = no expert rows)"),
        (e.pool_size >= 0, "expert.pool_size", "must be >= 0 (0 = a fresh problem every row)"),
        (0 <= e.weight <= 1 and (e.weight_final is None or 0 <= e.weight_final <= 1), "expert.weight",
         "μ must be in [0, 1] (weight and weight_final)"),
        (e.decay_steps >= 0, "expert.decay_steps", "must be >= 0 (0 = constant μ)"),
        (not on or config.model.kind != "diffusion" or config.estimator.name not in ("trace", "bgpo"),
         "expert.per_step", f"expert rows have no sampler trace or old per-draw estimates for "
         f"estimator.name={config.estimator.name}; use another estimator (e.g. mean_field) or set it to 0"),
        (not on or config.algo.advantage != "gae", "expert.per_step",
         "expert rows have no critic values; use a critic-free advantage such as grpo, or set it to 0"),
    ]


TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")


def _input_checks(config: Config) -> list[tuple[bool, str, str]]:
    """Values that types accept but that would silently train something else (or nothing)."""
    a, o, t = config.algo, config.optim, config.task
    section = getattr(t, t.name, None)
    heldout_file = bool(getattr(section, "heldout_path", None) or getattr(section, "heldout_split", None))
    trackers = [n.strip() for n in config.trainer.trackers.split(",") if n.strip()]
    unknown = [n for n in trackers if n not in TRACKERS]
    greedy_varies = config.model.kind == "diffusion" and config.rollout.remasking == "random"
    return [
        (a.clip_low is None or a.clip_low >= 0, "algo.clip_low", "must be >= 0 (the ratio floor is 1 - clip_low)"),
        (a.clip_high is None or a.clip_high >= 0, "algo.clip_high",
         "must be >= 0 (the ratio ceiling is 1 + clip_high)"),
        (t.heldout_size >= 1 or heldout_file, "task.heldout_size",
         "must be >= 1: held-out accuracy is measured on these problems (evaluate less often with trainer.eval_every)"),
        (o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 (0 = no warmup)"),
        (config.sft.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0 (0 = no warmup)"),
        (a.critic_warmup_steps >= 0, "algo.critic_warmup_steps", "must be >= 0"),
        (o.weight_decay >= 0, "optim.weight_decay", "must be >= 0 (0 = none), e.g. 0.01"),
        (0 <= o.beta1 < 1, "optim.beta1", "must be in [0, 1), e.g. 0.9"),
        (0 <= o.beta2 < 1, "optim.beta2", "must be in [0, 1), e.g. 0.99"),
        (o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 = off)"),
        (0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]"),
        (config.sft.steps >= 1, "sft.steps", "must be >= 1"),
        (config.sft.batch_size >= 1, "sft.batch_size", "must be >= 1"),
        (config.trainer.eval_every >= 0, "trainer.eval_every", "must be >= 0 (0 = only at start and end)"),
        (config.trainer.save_every >= 0, "trainer.save_every", "must be >= 0 (0 = only at the end)"),
        (config.trainer.samples_per_step >= 0, "trainer.samples_per_step", "must be >= 0"),
        (config.rollout.temperature > 0 or greedy_varies, "rollout.temperature",
         "0 (greedy) gives every completion of a group the same text, so every group's rewards tie, its "
         "advantages are 0 and nothing trains; use a temperature > 0, e.g. 1.0"),
        (not unknown, "trainer.trackers",
         f"unknown tracker {unknown[0] if unknown else ''!r}; valid: {', '.join(TRACKERS)} (comma-separated)"),
    ]


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def data_files(config: Config) -> list[str]:
    """The data files the chosen task reads (file tasks: `path`, `heldout_path`), for the manifest."""
    section = getattr(config.task, config.task.name, None)
    return [p for p in (getattr(section, "path", None), getattr(section, "heldout_path", None)) if p]


def derived_batch_numbers(config: Config) -> dict[str, int]:
    """The batch vocabulary (README, "Batch vocabulary"), resolved for this config."""
    r, t = config.rollout, config.trainer
    completions = r.prompts_per_step * r.group_size
    per_opt = completions // t.minibatches
    return {
        "completions_per_step": completions,
        "optimizer_steps_per_rollout_batch": t.minibatches * t.ppo_epochs,
        "completions_per_optimizer_step": per_opt,
        "max_completion_tokens_per_optimizer_step": per_opt * r.max_new_tokens,
        "micro_batches_per_optimizer_step": -(-per_opt // t.micro_batch_size),
    }
