"""Reading a config: a YAML recipe (or a mapping) plus dotted overrides -> a resolved `Config`,
checked by `rlvr.config.checks`."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import reprlib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlvr.config.checks import validate
from rlvr.config.paths import is_path_field, path_value, recipe_relative
from rlvr.config.recipes import packaged_recipe
from rlvr.config.registries import _get, resolve
from rlvr.config.schema import Config, section_type
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
    if close:
        return f"; did you mean '{close[0]}'?"
    anchors = " (a block that holds anchors for `<<: *name` merges goes under a key starting with x-)"
    return "; run `rlvr config` to list valid keys" + ("" if "." in full else anchors)


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
    # top-level `x-` keys hold anchors for `<<: *name` merges (Compose's extension fields), no settings
    tree = {k: v for k, v in tree.items() if not (isinstance(k, str) and k.startswith("x-"))}
    return recipe_relative(tree, path.parent)


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
