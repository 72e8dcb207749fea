"""Registry-backed fields: which config field names an entry of which registry, which section
holds that entry's hyperparameters, and the resolution of null fields to the chosen entries' own
defaults."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlvr.config.schema import Config, TaskConfig, section_type
from rlvr.errors import ConfigError


@dataclass(frozen=True)
class Registry:
    """A config field whose value names an entry of a registry.

    `source` is `module:NAME` of the registry (a mapping name -> entry, or a tuple of names),
    imported on first use, so importing this module stays free of torch."""

    key: str
    """Dotted field holding the entry's name, e.g. `algo.objective`."""
    kind: str
    """The noun of the error message: `unknown <kind> 'x'; valid: ...`."""
    source: str
    """`module:NAME` of the registry."""
    section: str = ""
    """Section holding the entries' hyperparameters, one field per keyword ("" = none)."""
    data: tuple[str, ...] = ()
    """Keyword-only parameters that carry data at call time, not hyperparameters."""
    elsewhere: tuple[str, ...] = ()
    """Keyword-only parameters the builder binds from other sections (`group_size`)."""

    def entries(self) -> Any:
        return _import(self.source)

    def get(self, name: str) -> Any:
        """The entry registered as `name`; a one-line ConfigError naming the valid ones otherwise."""
        entries = self.entries()
        if name not in entries:
            raise ConfigError(f"{self.key}: unknown {self.kind} {name!r}; valid: {', '.join(sorted(entries))}")
        return entries[name] if isinstance(entries, Mapping) else name


REGISTRIES = (
    Registry("algo.advantage", "advantage", "rlvr.algos.advantages:ADVANTAGES", "algo"),
    Registry("algo.objective", "objective", "rlvr.algos.objectives:OBJECTIVES", "algo", elsewhere=("group_size",),
             data=("logsumexp", "logit", "ref_logp", "ref_logsumexp", "token_rewards", "draws",  # OBJECTIVE_NEEDS
                   "old_draws", "trace")),
    Registry("algo.aggregation", "aggregation", "rlvr.algos.aggregate:AGGREGATIONS", "algo",
             data=("num_tokens", "num_seqs", "trace")),
    Registry("algo.kl_estimator", "KL estimator", "rlvr.algos.kl:KL_ESTIMATORS", "algo", data=("old_logp",)),
    Registry("estimator.name", "likelihood estimator", "rlvr.models.likelihood:ESTIMATORS", "estimator",
             data=("advantages", "trace", "with_entropy")),
    Registry("task.name", "task", "rlvr.tasks:TASKS", "task", elsewhere=("tokenizer", "seed")),
    Registry("algo.correction_level", "correction level", "rlvr.algos.correction:LEVELS"),
    Registry("algo.correction_mode", "correction mode", "rlvr.algos.correction:MODES"),
    Registry("estimator.bound", "SPG bound", "rlvr.models.likelihood:SPG_BOUNDS"),
    Registry("rollout.remasking", "remasking", "rlvr.engines.torch_diffusion:REMASKING"),
    Registry("rollout.window", "window", "rlvr.models.likelihood:WINDOWS"),
    Registry("rollout.engine", "rollout engine", "rlvr.engines.kinds:ENGINES"),
    Registry("sampler.name", "sampler", "rlvr.sampling:SAMPLERS", "sampler", data=("task", "rng"),
             elsewhere=("group_size", "seed")),
    Registry("task.countdown.sampling", "sampling", "rlvr.tasks.countdown:SAMPLINGS"),
    Registry("task.countdown.partial_credit", "partial credit", "rlvr.tasks.countdown:PARTIAL_CREDITS"),
    Registry("task.code_file.isolation", "isolation", "rlvr.rewards.sandbox:ISOLATIONS"),
    Registry("expert.objective", "expert objective", "rlvr.algos.hybrid:EXPERT_OBJECTIVES", "expert"),
    Registry("algo.nft_weight", "NFT weight", "rlvr.algos.hybrid:NFT_WEIGHTS"),
)
REGISTRY = {r.key: r for r in REGISTRIES}

COMPANIONS = {"algo.advantage": {"gae": "rlvr.algos.advantages:gae_returns"}}
"""Functions that come with a chosen entry and share its hyperparameters: `gae`'s critic targets."""

CORRECTION = "rlvr.algos.correction:importance_correction"
"""The rollout correction (used when `algo.rollout_correction`); its keywords are `algo` fields."""

LOOP_KNOBS = {
    "algo": ("kl_coef", "kl_placement", "entropy_coef", "value_clip", "critic_lr", "critic_warmup_steps",
             "kl_target", "kl_horizon", "overlong_buffer", "overlong_factor", "overlong_filter",
             "dynamic_sampling", "max_sampling_rounds", "pass_rate_low", "pass_rate_high", "rollout_correction"),
    "task": ("heldout_size", "train_size"),
    "sampler": ("calibration_every", "calibration_prompts", "calibration_rollouts"),
    "expert": ("per_step", "pool_size", "weight", "weight_final", "decay_steps", "keep_onpolicy", "advantage"),
}
"""Fields of a section that no entry's keyword binds: the loop reads them itself (`algo.kl_coef`,
the DAPO, critic and adaptive-KL knobs), or the builder passes them to every entry
(`task.heldout_size`)."""

ELSEWHERE = {"group_size": "rollout.group_size", "tokenizer": "the model's tokenizer", "seed": "seed",
             "norm_length": "rollout.max_new_tokens (when algo.norm_length is null)"}
"""Where the builder takes a keyword from when it is not a field of the entry's section."""


def _import(source: str) -> Any:
    module, name = source.split(":")
    return getattr(importlib.import_module(module), name)


def keywords(fn: Callable) -> dict[str, Any]:
    """Keyword-only parameters of `fn` (for a class, of its `__init__` and, through **kwargs, its
    bases'; the most derived default wins) -> default (`inspect.Parameter.empty` if required)."""
    found: dict[str, Any] = {}
    inits = [k.__dict__["__init__"] for k in fn.__mro__ if "__init__" in k.__dict__] if isinstance(fn, type) else [fn]
    for init in inits:
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name not in found:
                found[p.name] = p.default
    return found


def hyperparameters(entry: Callable, registry: Registry | None = None) -> dict[str, Any]:
    """The keywords of `entry` that config fields set, with their defaults: all keyword-only
    parameters but the registry's data and elsewhere keywords and its section's loop knobs."""
    skip = (set(registry.data) | set(registry.elsewhere) | set(LOOP_KNOBS.get(registry.section, ()))
            if registry else set())
    return {k: v for k, v in keywords(entry).items() if k not in skip}


Entry = tuple[str, Callable, Registry | None]
"""(label, function or class, the registry that says which of its keywords are data; None = none are)."""


@dataclass(frozen=True)
class Choice:
    """One entry a config uses: what `rlvr config --explain` shows, what `resolve` fills null
    fields from, what the builder binds and what the checks hold to the entry's requirements."""

    key: str
    """The config field that chose it (`algo.objective`; `algo.rollout_correction` for the correction)."""
    name: str
    """The entry's name (`ppo_clip`; `gae_returns`, `importance_correction` for those functions)."""
    entry: Any
    """The registered function or class."""
    registry: Registry | None
    """The registry that says which of its keywords are data; None: all are hyperparameters."""
    section: str
    """Dotted path of the section holding its hyperparameters (`algo`, `task.countdown`)."""
    elsewhere: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keywords bound from other sections (`group_size` from `rollout.group_size`)."""


def chosen_entries(config: Config) -> tuple[Choice, ...]:
    """Every entry this config uses, with the conditions under which each is used, in the
    registries' order: the advantage (and `gae`'s critic targets), the objective with
    `group_size`, the aggregation with `norm_length`, the KL estimator when `algo.kl_coef > 0`,
    the likelihood estimator for a diffusion model, the sampler with `group_size` and `seed`, the
    expert objective when expert rows go through one of their own, the rollout correction when on
    and the task with `task.heldout_size` and `seed`. The names are checked here: an unknown one is
    a one-line ConfigError."""
    a, r = config.algo, config.rollout
    norm_length = a.norm_length if a.norm_length is not None else float(r.max_new_tokens)
    used = {"algo.kl_estimator": a.kl_coef > 0, "estimator.name": config.model.kind == "diffusion",
            # `main`: the expert rows go through the objective itself
            "expert.objective": bool(config.expert.per_step) and config.expert.objective != "main"}
    elsewhere = {"algo.objective": {"group_size": r.group_size}, "algo.aggregation": {"norm_length": norm_length},
                 "sampler.name": {"group_size": r.group_size, "seed": config.seed}}
    out = []
    for reg in REGISTRIES:
        if reg.section not in ("algo", "estimator", "expert", "sampler") or not used.get(reg.key, True):
            continue
        name = _get(config, reg.key)
        out.append(Choice(reg.key, name, reg.get(name), reg, reg.section, elsewhere.get(reg.key, {})))
        extra = COMPANIONS.get(reg.key, {}).get(name)
        if extra:
            out.append(Choice(reg.key, extra.split(":")[1], _import(extra), None, reg.section))
    if rollout_correction_on(config):
        out.append(Choice("algo.rollout_correction", "importance_correction", _import(CORRECTION), None, "algo"))
    t, tasks = config.task, REGISTRY["task.name"]
    out.append(Choice("task.name", t.name, tasks.get(t.name), tasks, f"task.{t.name}",
                      {"heldout_size": t.heldout_size, "seed": config.seed}))
    return tuple(out)


def section_values(config: Config, choice: Choice) -> Any:
    """The section object `choice` binds from (an unresolved config's empty task section: its defaults)."""
    values = _get(config, choice.section)
    if values is None and choice.section.startswith("task."):
        values = task_sections()[choice.section.split(".", 1)[1]]()
    return values


def _get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = getattr(node, part) if node is not None else None
    return node


def _fill(section: Any, prefix: str, entries: list[Entry]) -> Any:
    """`section` with each null hyperparameter field set to the default of the entries that
    declare it; a ConfigError where they disagree or where one has no default."""
    defaults: dict[str, dict[str, Any]] = {}
    for label, fn, reg in entries:
        for key, default in hyperparameters(fn, reg).items():
            defaults.setdefault(key, {})[label] = default
    updates = {}
    for key, by_entry in defaults.items():
        if getattr(section, key, None) is not None:
            continue
        distinct = {repr(v): v for v in by_entry.values()}
        if len(distinct) > 1:
            shown = ", ".join(f"{label} {value!r}" for label, value in by_entry.items())
            raise ConfigError(f"{prefix}{key}: the chosen entries default it differently ({shown}); set {prefix}{key}")
        (value,) = distinct.values()
        if value is inspect.Parameter.empty:
            raise ConfigError(f"{prefix}{key}: {' and '.join(by_entry)} needs it; set {prefix}{key}")
        updates[key] = value
    return dataclasses.replace(section, **updates)


def task_sections() -> dict[str, type]:
    """Task name -> the dataclass of its knobs (the `TaskConfig` sections)."""
    hints = typing.get_type_hints(TaskConfig)
    return {f.name: section_type(hints[f.name]) for f in dataclasses.fields(TaskConfig)
            if section_type(hints[f.name]) is not None}


def _resolve_task(config: Config) -> TaskConfig:
    t = config.task
    cls = REGISTRY["task.name"].get(t.name)
    sections = task_sections()
    for name in sections:
        if name != t.name and getattr(t, name) is not None:
            raise ConfigError(f"task.{name}: knobs of task '{name}', but task.name is '{t.name}'; "
                              f"use task.{t.name}.* or set task.name={name}")
    if t.name not in sections:
        raise ConfigError(f"task.name: task '{t.name}' has no knob section in TaskConfig; add one")
    section = getattr(t, t.name) or sections[t.name]()
    filled = _fill(section, f"task.{t.name}.", [(t.name, cls, REGISTRY["task.name"])])
    return dataclasses.replace(t, **{t.name: filled})


def rollout_correction_on(config: Config) -> bool:
    """`algo.rollout_correction`, with null meaning on for an engine that holds its own copy of the
    weights (vLLM samples slightly off the trainer's policy) and off for rlvr's own samplers."""
    if config.algo.rollout_correction is not None:
        return bool(config.algo.rollout_correction)
    return not engine_kind(config).exact_logprobs


def engine_kind(config: Config):
    """The `rlvr.engines.kinds.EngineKind` that `rollout.engine` names."""
    return REGISTRY["rollout.engine"].get(config.rollout.engine)


def adapter_sync(config: Config) -> bool:
    """Whether a LoRA run pushes its adapter alone: an engine that serves adapters unmerged, with
    `rollout.lora_sync=adapter` (FSDP learners push their gathered plain copy whole all the same)."""
    return config.model.lora.r > 0 and engine_kind(config).adapters and config.rollout.lora_sync == "adapter"


def resolve(config: Config) -> Config:
    """`config` with every registry name checked and every null hyperparameter of a chosen entry
    set to that entry's own default (what the builder will bind); other fields unchanged."""
    if config.algo.rollout_correction is None:
        config = dataclasses.replace(config, algo=dataclasses.replace(
            config.algo, rollout_correction=rollout_correction_on(config)))
    used: dict[str, list[Entry]] = {"algo": [], "estimator": [], "expert": [], "sampler": []}
    for choice in chosen_entries(config):
        if choice.section in used:
            used[choice.section].append((choice.name, choice.entry, choice.registry))
    for section in used:
        _check_read(config, section, used[section])
    algo = _fill(config.algo, "algo.", used["algo"])
    if algo.norm_length is None:
        algo = dataclasses.replace(algo, norm_length=float(config.rollout.max_new_tokens))
    estimator = _fill(config.estimator, "estimator.", used["estimator"])
    expert = _fill(config.expert, "expert.", used["expert"])
    sampler = _fill(config.sampler, "sampler.", used["sampler"])
    config = dataclasses.replace(config, algo=algo, estimator=estimator, expert=expert, sampler=sampler,
                                 task=_resolve_task(config))
    for reg in REGISTRIES:  # the choices inside sections (an option's allowed values), now filled
        value = _get(config, reg.key)
        if value is not None:
            reg.get(value)
    return config


FILLED_ANYWAY = {"algo.norm_length"}
"""Hyperparameter fields that `resolve` fills whatever is chosen (saved configs hold them)."""

SECTION_RUNS = {"estimator": ("likelihood estimators run with model.kind=diffusion only",
                              lambda config: config.model.kind == "diffusion"),
                "expert": ("the expert objective runs with expert.per_step > 0",
                           lambda config: config.expert.per_step > 0)}
"""Sections whose entries run only under a condition: why, and the condition."""


def _readers(section: str) -> dict[str, list[str]]:
    """Field of `section` -> the choices whose entries read it (`algo.objective=sapo`)."""
    readers: dict[str, list[str]] = {}
    for reg in REGISTRIES:
        if reg.section != section:
            continue
        for name, fn in reg.entries().items():
            extra = COMPANIONS.get(reg.key, {}).get(name)
            keys = {*hyperparameters(fn, reg), *(hyperparameters(_import(extra)) if extra else ())}
            for key in keys:
                readers.setdefault(key, []).append(f"{reg.key}={name}")
    if section == "algo":
        for key in hyperparameters(_import(CORRECTION)):
            readers.setdefault(key, []).append("algo.rollout_correction=true")
    return readers


def _check_read(config: Config, section: str, used: list[Entry]) -> None:
    """A hyperparameter set in `section` that none of the chosen entries reads is a ConfigError
    naming the choices that read it (a value that would otherwise be kept and never used)."""
    read = {key for _, fn, reg in used for key in hyperparameters(fn, reg)}
    values = getattr(config, section)
    defaults = {f.name: f.default for f in dataclasses.fields(values)}
    # in the schema's field order: which unread field is named first must not vary with the hash seed
    order = {f.name: i for i, f in enumerate(dataclasses.fields(values))}
    for key, readers in sorted(_readers(section).items(), key=lambda kv: order.get(kv[0], len(order))):
        value = getattr(values, key, None)
        if key in read or value is None or defaults.get(key) is not None or f"{section}.{key}" in FILLED_ANYWAY:
            continue
        if f"{section}.{key}" in REGISTRY:  # a misspelt name says so first
            REGISTRY[f"{section}.{key}"].get(value)
        now = sorted({r.split("=")[0] for r in readers})
        current = ", ".join(f"{k} is {_get(config, k)!r}" for k in now)
        idle = section in SECTION_RUNS and not SECTION_RUNS[section][1](config)
        why = f"; {SECTION_RUNS[section][0]}" if idle else ""
        raise ConfigError(f"{section}.{key}={value!r}: read only by {', '.join(readers)} ({current}{why}); "
                          f"choose one of those or remove {section}.{key}")


def all_entries() -> dict[str, list[Entry]]:
    """Section path -> every entry whose keywords its fields set (chosen or not): the registries'
    entries, their companions and the rollout correction (`algo`), the estimators
    (`estimator`), and each task for its own section (`task.<name>`)."""
    out: dict[str, list[Entry]] = {"algo": [], "estimator": [], "expert": [], "sampler": []}
    for reg in REGISTRIES:
        if reg.section in out:
            out[reg.section] += [(name, fn, reg) for name, fn in reg.entries().items()]
            out[reg.section] += [(src.split(":")[1], _import(src), None)
                                 for src in COMPANIONS.get(reg.key, {}).values()]
    out["algo"].append(("importance_correction", _import(CORRECTION), None))
    tasks = REGISTRY["task.name"]
    for name, cls in tasks.entries().items():
        out[f"task.{name}"] = [(name, cls, tasks)]
    return out
