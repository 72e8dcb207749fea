"""The one source of truth for a run's settings: frozen dataclasses, a docstring under each field.

`load_config(recipe, overrides)` reads a YAML recipe, applies dotted command-line overrides
(`algo.clip_high=0.28 seed=3`), checks names, types and ranges, resolves defaults, and returns a
`Config`. Every mistake becomes one `ConfigError` line that names the field and the fix.
Components never see this object: `rlvr.trainer.build` reads it once.

Registry entries (advantages, objectives, aggregations, KL estimators, likelihood estimators,
tasks) declare their hyperparameters as keyword-only parameters with their papers' defaults, and
each such keyword is a config field of the same name in the entry's section (`algo`,
`estimator`, `task.<name>`). A field left null takes the chosen entry's own default, so
`rlvr config algo.objective=gspo` shows GSPO's clip widths (3e-4 / 4e-4) and a run's
`config.yaml` records every value used. When two chosen entries declare one field with different
defaults, the config is rejected until that field is set (no precedence rule to remember).
Fields of entries that are not chosen stay null. Every name that picks a registry entry, and
every option with a fixed set of values, is checked against its registry on loading, so a typo
fails at `rlvr config` already.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import importlib
import inspect
import itertools
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "causal"
    """`causal` (autoregressive LM) or `diffusion` (masked-diffusion LM)."""
    path: str = "rlvr:countdown-warmstart"
    """Local HF directory, `rlvr:NAME` (packaged checkpoint), empty = fresh tiny model."""
    shift_logits: bool = False
    """Diffusion: Dream-style shifted logits (position i predicts token i+1)."""
    hidden_size: int = 128
    """Tiny model: width."""
    num_layers: int = 4
    """Tiny model: transformer blocks."""
    num_heads: int = 4
    """Tiny model: attention heads."""
    intermediate_size: int = 512
    """Tiny model: MLP width."""
    max_seq_len: int = 64
    """Tiny model: longest prompt + completion."""


@dataclass(frozen=True)
class CountdownTaskConfig:
    """Knobs of `rlvr.tasks.countdown.Countdown` (null = the class's own default)."""

    num_count: int | None = None
    """How many numbers per problem (3 or 4 are the useful settings)."""
    max_number: int | None = None
    """Numbers are drawn from 1..max_number."""
    allow_division: bool | None = None
    """Allow exact integer division."""
    ordered: bool = True
    """Prompts list the numbers in the order the generating expression uses them. True here (the
    class's own default is False): the packaged warm start was trained on ordered prompts."""
    show_work: bool | None = None
    """Completions list steps `5*2=10,10+3=13` instead of a bare expression."""
    sampling: str | None = None
    """Training problems as the generator draws them (`draws`) or uniform over problem keys (`keys`,
    like the held-out set)."""
    partial_credit: str | None = None
    """0.1 for any parseable wrong answer (`parse`, d1/TinyZero) or only one over the given numbers
    (`numbers`)."""


@dataclass(frozen=True)
class Sudoku4TaskConfig:
    """Knobs of `rlvr.tasks.sudoku.Sudoku4` (null = the class's own default)."""

    min_blanks: int | None = None
    """Fewest blank cells of a puzzle (1..12)."""
    max_blanks: int | None = None
    """Most blank cells of a puzzle (min_blanks..12)."""


@dataclass(frozen=True)
class FileTaskConfig:
    """Knobs shared by the file tasks (`rlvr.tasks.files.FileTask`; null = the class's own default)."""

    path: str | None = None
    """JSONL / Parquet file or HF `save_to_disk` directory (required)."""
    prompt_key: str | None = None
    """Field holding the prompt."""
    answer_key: str | None = None
    """Field holding the reference answer (math_file)."""
    tests_key: str | None = None
    """Field holding the tests (code_file)."""
    system_prompt: str | None = None
    """System message (chat templates) or prefix."""
    prompt_template: str | None = None
    """Format string with {prompt}."""
    max_prompt_length: int | None = None
    """Drop longer prompts (tokens), 0 = keep all."""
    heldout_path: str | None = None
    """Separate evaluation file, empty = hash split of `path`."""
    split: str | None = None
    """HF datasets directory: split name."""


@dataclass(frozen=True)
class MathFileTaskConfig(FileTaskConfig):
    """Knobs of `rlvr.tasks.files.MathFileTask` (null = the class's own default)."""

    math_timeout_s: float | None = None
    """Time limit of one equivalence check."""
    solution_key: str | None = None
    """Field holding a worked solution (for SFT), empty = none."""


@dataclass(frozen=True)
class CodeFileTaskConfig(FileTaskConfig):
    """Knobs of `rlvr.tasks.files.CodeFileTask` (null = the class's own default)."""

    all_or_nothing: bool | None = None
    """Reward 1 only if every test passes (otherwise the fraction passed)."""
    sandbox_workers: int | None = None
    """Programs run at once."""
    wall_s: float | None = None
    """Wall-clock limit per program."""
    memory_mb: int | None = None
    """Address-space limit per program."""
    isolation: str | None = None
    """Sandbox isolation: auto | bwrap | unshare | none."""


@dataclass(frozen=True)
class TaskConfig:
    """The task: its name, the knobs every task has, and one section per task for its own knobs.

    Only the chosen task's section may be set; `rlvr config` fills it with the effective values
    and leaves the others null."""

    name: str = "countdown"
    """Task registry key (`rlvr.tasks.TASKS`)."""
    heldout_size: int = 200
    """Size of the fixed held-out evaluation set (every task; file tasks hold out this many rows
    by a hash of the prompt unless `heldout_path` is set)."""
    countdown: CountdownTaskConfig | None = None
    """Knobs of task `countdown`."""
    sudoku4: Sudoku4TaskConfig | None = None
    """Knobs of task `sudoku4`."""
    math_file: MathFileTaskConfig | None = None
    """Knobs of task `math_file`."""
    code_file: CodeFileTaskConfig | None = None
    """Knobs of task `code_file`."""


@dataclass(frozen=True)
class RewardConfig:
    fn: str = ""
    """User reward `file.py:name` or `module:name` replacing the task's verifier; empty = task's."""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8
    """P: fresh prompts per step."""
    group_size: int = 16
    """G: completions per prompt (B = P·G)."""
    max_new_tokens: int = 16
    """Completion length cap (longer samples are truncated)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    diffusion_steps: int = 0
    """Diffusion sampler: denoising steps N, 0 = one token per step (N = L)."""
    block_length: int = 0
    """Diffusion sampler: semi-autoregressive block length B, 0 = the whole window."""
    remasking: str = "low_confidence"
    """Diffusion sampler: low_confidence | random | entropy | margin."""
    threshold: float | None = None
    """Diffusion sampler: commit every token above this confidence (dynamic)."""
    suppress_eos: bool = False
    """Diffusion sampler: lower EOS confidence so content is committed first."""
    greedy_in_group: bool = False
    """Diffusion models: the last completion of every group is decoded greedily (T = 0) and trains with its siblings, so the advantage sees whether the greedy answer (what evaluation scores) beats the samples."""
    window: str = "eos"
    """Diffusion: which window tokens are the completion: `eos` (up to EOS) or `full`."""
    prompt_selection: str = "uniform"
    """Which prompts a step rolls out: `uniform` draws or `mopps` posterior selection."""
    selection_candidates: float = 2.0
    """Mopps: candidates drawn per prompt rolled out (1/κ)."""
    selection_target: float = 0.5
    """Mopps: success rate the selection aims at."""
    selection_decay: float = 0.5
    """Mopps: λ, weight kept by old evidence at each new observation of a prompt."""
    decode_engine: str = "cpp"
    """Llama/Qwen2 sampler's decode step: `cpp` fused C++ kernel (built once per machine, ~30 s; falls back to `eager` with one line if it cannot be built), `eager` ATen ops."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: which advantage, objective, aggregation and KL estimator, their
    hyperparameters, and the loop-level knobs (KL, DAPO, critic, rollout correction).

    A hyperparameter field left null takes the default of the chosen entry that declares it
    (GSPO's clip widths are 3e-4 / 4e-4, CISPO's 1.0 / 4.0, PPO-clip's 0.2 / 0.2); `rlvr config`
    prints the value that will be used. Where two chosen entries declare one with different
    defaults, the config is rejected until the field is set. Fields of entries not chosen stay
    null."""

    advantage: str = "grpo"
    """Advantage estimator (`rlvr.algos.advantages.ADVANTAGES`)."""
    objective: str = "ppo_clip"
    """Policy objective (`rlvr.algos.objectives.OBJECTIVES`)."""
    aggregation: str = "seq_mean_token_mean"
    """Loss aggregation (`rlvr.algos.aggregate.AGGREGATIONS`)."""
    kl_estimator: str = "k3"
    """KL estimator (`rlvr.algos.kl.KL_ESTIMATORS`)."""
    kl_coef: float = 0.0
    """KL weight β against the frozen initial policy; 0 = no reference model."""
    kl_placement: str = "loss"
    """Where the KL goes: `loss` or `reward`."""
    std_normalize: bool | None = None
    """Divide the centred score by a standard deviation (grpo: the group std; passk: the
    subset-reward std)."""
    adv_eps: float | None = None
    """Added to a standard deviation before dividing by it."""
    pass_k: int | None = None
    """k of the pass@k objective."""
    gamma: float | None = None
    """Discount of token-level returns."""
    lam: float | None = None
    """GAE lambda."""
    clip_low: float | None = None
    """ε_low: ratio floor 1-ε_low (gspo: of the sequence ratio; cispo: of the detached weight)."""
    clip_high: float | None = None
    """ε_high: ratio ceiling 1+ε_high."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for A<0, null = off."""
    log_ratio_clamp: float | None = None
    """Clamp |log ratio| to this before exp (overflow guard)."""
    tau_pos: float | None = None
    """Gate temperature for A > 0."""
    tau_neg: float | None = None
    """Gate temperature for A <= 0."""
    wd1_psi: float | None = None
    """Inverse temperature ψ of the group softmax over advantages."""
    norm_length: float | None = None
    """Constant length normaliser of Dr.GRPO's aggregation; null = `rollout.max_new_tokens`."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = entropy only logged)."""
    value_clip: float | None = 0.5
    """GAE critic: clip of the value update around the old value, null = off."""
    critic_lr: float = 1e-4
    """GAE critic: AdamW learning rate of the value model."""
    critic_warmup_steps: int = 0
    """GAE critic: steps that train only the critic."""
    kl_target: float | None = None
    """Adaptive KL: target per-sequence KL, null = fixed kl_coef."""
    kl_horizon: float = 10000.0
    """Adaptive KL: horizon (in samples) of the controller."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: buffer in tokens below max_new_tokens, 0 = off."""
    overlong_factor: float = 1.0
    """DAPO soft overlong punishment at max_new_tokens."""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated completions get no loss."""
    dynamic_sampling: bool = True
    """DAPO: drop zero-variance groups (backfilled while rounds remain)."""
    max_sampling_rounds: int = 1
    """Dynamic sampling: rollout rounds per step; 1 = filter, no backfill."""
    rollout_correction: bool = False
    """Weight the loss by pi_old / pi_rollout (TIS / MIS)."""
    correction_level: str | None = None
    """Rollout correction: `token` or `sequence` weights."""
    correction_mode: str | None = None
    """Rollout correction: `truncate` (TIS) or `mask` (MIS)."""
    correction_cap: float | None = None
    """Rollout correction: cap C on the weight."""


@dataclass(frozen=True)
class EstimatorConfig:
    """Diffusion models: the likelihood estimator behind the policy's log-probs
    (`rlvr.models.likelihood.ESTIMATORS`) and its options, named as the estimators' keywords.
    A null option takes the chosen estimator's own default; options of other estimators stay
    null. Unused by causal models."""

    name: str = "mean_field"
    """Likelihood estimator (`rlvr.models.likelihood.ESTIMATORS`)."""
    n: int | None = None
    """Monte-Carlo mask draws."""
    antithetic: bool | None = None
    """Complementary (antithetic) mask pairs."""
    p_mask_prompt: float | None = None
    """Prompt-token masking probability."""
    t_min: float | None = None
    """Lowest mask ratio."""
    t_max: float | None = None
    """Highest mask ratio."""
    include_full: bool | None = None
    """Add the all-masked pass as the released code does."""
    beta: float | None = None
    """EUBO exponent β."""
    omega: float | None = None
    """Weight of the EUBO in the ω-mixture for A < 0."""
    bound: str | None = None
    """Bound for negative advantages: `elbo`, `eubo` or `mixture`."""
    block_length: int | None = None
    """Block-wise masking block, null = the whole window."""
    shrink: int | None = None
    """Merge this many sampler steps into one (σ)."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW β1."""
    beta2: float = 0.99
    """AdamW β2."""
    grad_clip: float = 1.0
    """Max global grad norm, 0 = off."""
    warmup_steps: int = 10
    """Linear LR warmup, in optimizer steps."""
    schedule: str = "cosine"
    """After warmup: `constant` or `cosine` (decays to min_lr_ratio·lr at the last step)."""
    min_lr_ratio: float = 0.0
    """Cosine schedule: final LR as a fraction of optim.lr."""


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 3000
    """Rollout steps."""
    minibatches: int = 1
    """Optimizer steps per rollout batch."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    micro_batch_size: int = 64
    """Completions per forward; memory only, never changes results."""
    eval_every: int = 250
    """Steps between greedy held-out evaluations (0 = only at start and end)."""
    eval_samples: int = 0
    """Also score k samples per held-out problem at the rollout temperature (eval/heldout_sampled_accuracy = avg@k, eval/heldout_pass_at_k); 0 = greedy only."""
    samples_per_step: int = 4
    """Rollouts written to samples.jsonl each step."""
    save_every: int = 500
    """Steps between checkpoints (0 = only at the end)."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    out_dir: str = "runs"
    """Parent of run directories."""
    name: str = ""
    """Run directory name, empty = recipe name + seed."""
    threads: int = 0
    """Torch threads, 0 = torch's default."""
    kernels: str = "cpp"
    """Training forward+backward of Llama-family models: `cpp` = each layer one C++ call each way (built once per machine; eager if it cannot be built), `eager` = ATen ops; same math to float rounding."""
    thread_mode: str = "auto"
    """How threads are used: `ops` = torch's intra-op threads; `rows` = each thread takes a share of every batch's rows with single-threaded ops (faster, and no collapse when another process holds a core; causal models); `auto` = rows for causal models, ops for diffusion ones."""
    trackers: str = ""
    """Extra metric sinks beside metrics.jsonl, comma-separated: tensorboard,wandb,mlflow."""


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 80
    """Optimizer steps of supervised warm start."""
    batch_size: int = 64
    """Examples per step."""
    lr: float = 1e-3
    """AdamW learning rate."""
    warmup_steps: int = 20
    """Linear LR warmup."""
    schedule: str = "constant"
    """LR after warmup: `constant` or `cosine` (decays to 0 at the last step)."""


@dataclass(frozen=True)
class Config:
    seed: int = 0
    """Seeds model init, prompts and sampling."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


# ---------------------------------------------------------------------------- registries

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
    Registry("algo.objective", "objective", "rlvr.algos.objectives:OBJECTIVES", "algo", elsewhere=("group_size",)),
    Registry("algo.aggregation", "aggregation", "rlvr.algos.aggregate:AGGREGATIONS", "algo",
             data=("num_tokens", "num_seqs")),
    Registry("algo.kl_estimator", "KL estimator", "rlvr.algos.kl:KL_ESTIMATORS", "algo", data=("old_logp",)),
    Registry("estimator.name", "likelihood estimator", "rlvr.models.likelihood:ESTIMATORS", "estimator",
             data=("advantages", "trace", "with_entropy")),
    Registry("task.name", "task", "rlvr.tasks:TASKS", "task", elsewhere=("tokenizer", "seed")),
    Registry("algo.correction_level", "correction level", "rlvr.algos.correction:LEVELS"),
    Registry("algo.correction_mode", "correction mode", "rlvr.algos.correction:MODES"),
    Registry("estimator.bound", "SPG bound", "rlvr.models.likelihood:SPG_BOUNDS"),
    Registry("rollout.remasking", "remasking", "rlvr.engines.torch_diffusion:REMASKING"),
    Registry("rollout.window", "window", "rlvr.models.likelihood:WINDOWS"),
    Registry("rollout.prompt_selection", "prompt selection", "rlvr.trainer.selection:SELECTIONS"),
    Registry("task.countdown.sampling", "sampling", "rlvr.tasks.countdown:SAMPLINGS"),
    Registry("task.countdown.partial_credit", "partial credit", "rlvr.tasks.countdown:PARTIAL_CREDITS"),
    Registry("task.code_file.isolation", "isolation", "rlvr.rewards.sandbox:ISOLATIONS"),
)
REGISTRY = {r.key: r for r in REGISTRIES}

COMPANIONS = {"algo.advantage": {"gae": "rlvr.algos.advantages:gae_returns"}}
"""Functions that come with a chosen entry and share its hyperparameters: `gae`'s critic targets."""

CORRECTION = "rlvr.algos.correction:importance_correction"
"""The rollout correction (used when `algo.rollout_correction`); its keywords are `algo` fields."""

LOOP_KNOBS = {
    "algo": ("kl_coef", "kl_placement", "entropy_coef", "value_clip", "critic_lr", "critic_warmup_steps",
             "kl_target", "kl_horizon", "overlong_buffer", "overlong_factor", "overlong_filter",
             "dynamic_sampling", "max_sampling_rounds", "rollout_correction"),
    "task": ("heldout_size",),
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
    skip = set(registry.data) | set(registry.elsewhere) | set(LOOP_KNOBS.get(registry.section, ())) if registry else set()
    return {k: v for k, v in keywords(entry).items() if k not in skip}


Entry = tuple[str, Callable, Registry | None]
"""(label, function or class, the registry that says which of its keywords are data; None = none are)."""


def chosen(config: Config) -> dict[str, list[Entry]]:
    """Section -> the entries this config uses whose hyperparameters live there. The names are
    checked here: an unknown one is a one-line ConfigError."""
    used: dict[str, list[Entry]] = {"algo": [], "estimator": []}
    for reg in REGISTRIES:
        if reg.section not in used:
            continue
        name = _get(config, reg.key)
        used[reg.section].append((name, reg.get(name), reg))
        companion = COMPANIONS.get(reg.key, {}).get(name)
        if companion:
            used[reg.section].append((companion.split(":")[1], _import(companion), None))
    if config.model.kind != "diffusion":
        used["estimator"] = []  # causal models have exact log-probs: no estimator runs
    if config.algo.rollout_correction:
        used["algo"].append(("importance_correction", _import(CORRECTION), None))
    return used


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
    return {f.name: _section_type(hints[f.name]) for f in dataclasses.fields(TaskConfig)
            if _section_type(hints[f.name]) is not None}


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


def resolve(config: Config) -> Config:
    """`config` with every registry name checked and every null hyperparameter of a chosen entry
    set to that entry's own default (what the builder will bind); other fields unchanged."""
    used = chosen(config)
    algo = _fill(config.algo, "algo.", used["algo"])
    if algo.norm_length is None:
        algo = dataclasses.replace(algo, norm_length=float(config.rollout.max_new_tokens))
    estimator = _fill(config.estimator, "estimator.", used["estimator"])
    config = dataclasses.replace(config, algo=algo, estimator=estimator, task=_resolve_task(config))
    for reg in REGISTRIES:  # the choices inside sections (an option's allowed values), now filled
        value = _get(config, reg.key)
        if value is not None:
            reg.get(value)
    return config


# ---------------------------------------------------------------------------- reading

def _section_type(annotation: Any) -> type | None:
    """The dataclass a field holds (also through `X | None`), or None for a leaf field."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
        return inner[0] if inner else None
    return None


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
                errors.append(err)
        raise errors[0]
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):  # YAML 1.1 reads `5e-5` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, annotation) and not (annotation is int and isinstance(value, bool)):
        return value
    shown = "null" if value is None else repr(value)
    raise ConfigError(f"{name}: expected {annotation.__name__}, got {shown}; fix the value in the recipe or override")


def _build(cls: type, values: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'{_suggest(full)}")
        section = _section_type(hints[key])
        if section is not None and value is None and section is not hints[key]:
            kwargs[key] = None  # an optional section left empty (a task that is not chosen)
        elif section is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a section (mapping), got {value!r}")
            kwargs[key] = _build(section, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def all_keys(cls: type | None = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema, e.g. 'algo.clip_high'."""
    cls = cls or Config
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        section = _section_type(hints[f.name])
        if section is not None:
            keys += all_keys(section, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _suggest(full: str) -> str:
    keys = all_keys()
    leaf = full.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    same_leaf.sort(key=lambda k: -len(os.path.commonprefix([k.split("."), full.split(".")])))  # nearest section first
    close = same_leaf or difflib.get_close_matches(full, keys, n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else "; run `rlvr config` to list valid keys"


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    node[leaf] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """`key.sub=value` strings -> (key, YAML-parsed value) pairs."""
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{item}': expected KEY=VALUE, e.g. algo.clip_high=0.28")
        try:
            pairs.append((key.strip(), yaml.safe_load(raw) if raw else ""))
        except yaml.YAMLError:
            pairs.append((key.strip(), raw))
    return pairs


def read_recipe(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe '{path}' does not exist; pass a YAML file such as recipes/grpo_countdown.yaml")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"recipe '{path}' is not valid YAML{where}; fix its syntax") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe '{path}' must be a mapping of sections (model:, algo:, ...)")
    return tree


def load_config(recipe: str | Path | dict | None = None, overrides: list[str] = ()) -> Config:
    """`recipe`: a YAML file, or its content as a mapping (e.g. `to_dict(config)`, to override a `Config`)."""
    tree = copy.deepcopy(dict(recipe)) if isinstance(recipe, dict) else read_recipe(recipe) if recipe else {}
    for key, value in parse_overrides(list(overrides)):
        _set_dotted(tree, key, value)
    config = resolve(_build(Config, tree, ""))
    validate(config)
    return config


def validate(config: Config) -> None:
    """Range checks that types alone cannot express."""
    checks = [
        (config.optim.lr > 0, "optim.lr", "must be > 0, e.g. 5e-5"),
        (config.sft.lr > 0, "sft.lr", "must be > 0, e.g. 1e-3"),
        (config.rollout.group_size >= 2, "rollout.group_size", "must be >= 2 (group baselines need siblings)"),
        (config.rollout.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1"),
        (config.rollout.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1"),
        (config.rollout.temperature >= 0, "rollout.temperature", "must be >= 0 (0 = greedy)"),
        (0 < config.rollout.top_p <= 1, "rollout.top_p", "must be in (0, 1]"),
        (config.trainer.steps >= 1, "trainer.steps", "must be >= 1"),
        (config.trainer.minibatches >= 1, "trainer.minibatches", "must be >= 1"),
        (config.trainer.ppo_epochs >= 1, "trainer.ppo_epochs", "must be >= 1"),
        (config.trainer.micro_batch_size >= 1, "trainer.micro_batch_size", "must be >= 1"),
        (config.rollout.prompts_per_step % config.trainer.minibatches == 0, "trainer.minibatches",
         f"must divide rollout.prompts_per_step ({config.rollout.prompts_per_step}) so groups stay whole"),
        (config.algo.kl_coef >= 0, "algo.kl_coef", "must be >= 0"),
        (config.algo.kl_placement in ("loss", "reward"), "algo.kl_placement", "must be 'loss' or 'reward'"),
        (config.algo.dual_clip is None or config.algo.dual_clip > 1, "algo.dual_clip", "must be > 1 or null"),
        (config.trainer.keep_last >= 1, "trainer.keep_last", "must be >= 1"),
        (0 <= config.algo.overlong_buffer <= config.rollout.max_new_tokens, "algo.overlong_buffer",
         "must be between 0 (off) and rollout.max_new_tokens"),
        (config.algo.max_sampling_rounds >= 1, "algo.max_sampling_rounds", "must be >= 1"),
        (config.algo.kl_target is None or config.algo.kl_target > 0, "algo.kl_target", "must be > 0 or null"),
        (config.algo.critic_lr > 0, "algo.critic_lr", "must be > 0"),
        (config.optim.schedule in ("constant", "cosine"), "optim.schedule", "must be 'constant' or 'cosine'"),
        (config.sft.schedule in ("constant", "cosine"), "sft.schedule", "must be 'constant' or 'cosine'"),
        (config.model.kind in ("causal", "diffusion"), "model.kind", "must be 'causal' or 'diffusion'"),
        (config.estimator.n is None or config.estimator.n >= 1, "estimator.n", "must be >= 1"),
        (config.rollout.selection_candidates >= 1, "rollout.selection_candidates", "must be >= 1 (1 = no choice)"),
        (0 <= config.rollout.selection_target <= 1, "rollout.selection_target", "must be in [0, 1]"),
        (0 <= config.rollout.selection_decay <= 1, "rollout.selection_decay", "must be in [0, 1] (1 = never forget)"),
        (config.rollout.decode_engine in ("eager", "cpp"), "rollout.decode_engine",
         "must be 'eager' or 'cpp'"),
        (config.trainer.eval_samples >= 0, "trainer.eval_samples", "must be >= 0 (0 = greedy evaluation only)"),
        (config.trainer.threads >= 0, "trainer.threads", "must be >= 0 (0 = torch's default)"),
        (config.trainer.thread_mode in ("auto", "ops", "rows"), "trainer.thread_mode", "must be 'auto', 'ops' or 'rows'"),
        (config.trainer.kernels in ("eager", "cpp"), "trainer.kernels", "must be 'eager' or 'cpp'"),
        (not config.rollout.greedy_in_group or config.model.kind == "diffusion", "rollout.greedy_in_group",
         "is implemented for model.kind=diffusion only; set it to false"),
        (config.trainer.thread_mode != "rows" or config.model.kind == "causal", "trainer.thread_mode",
         "'rows' splits causal-model batches only; use 'ops' with model.kind=diffusion"),
    ]
    for ok, name, fix in checks:
        if not ok:
            raise ConfigError(f"{name}: {fix}")


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


# ---------------------------------------------------------------------------- reference

def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its attribute docstring (the string literal under the field), read with ast."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            docs = {**field_docs(base), **docs}
    return docs


def all_entries() -> dict[str, list[Entry]]:
    """Section path -> every entry whose keywords its fields set (chosen or not): the registries'
    entries, their companions and the rollout correction (`algo`), the estimators
    (`estimator`), and each task for its own section (`task.<name>`)."""
    out: dict[str, list[Entry]] = {"algo": [], "estimator": []}
    for reg in REGISTRIES:
        if reg.section in out:
            out[reg.section] += [(name, fn, reg) for name, fn in reg.entries().items()]
            out[reg.section] += [(src.split(":")[1], _import(src), None) for src in COMPANIONS.get(reg.key, {}).values()]
    out["algo"].append(("importance_correction", _import(CORRECTION), None))
    tasks = REGISTRY["task.name"]
    for name, cls in tasks.entries().items():
        out[f"task.{name}"] = [(name, cls, tasks)]
    return out


def _yaml(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "required"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _section_rows(cls: type, path: str, entries: list[Entry]) -> list[str]:
    docs = field_docs(cls)
    declared: dict[str, dict[str, list[str]]] = {}  # field -> default -> entries declaring it
    for label, fn, reg in entries:
        for key, default in hyperparameters(fn, reg).items():
            declared.setdefault(key, {}).setdefault(_yaml(default), []).append(label)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        if _section_type(typing.get_type_hints(cls)[f.name]) is not None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if default is None and f.name in declared and set(declared[f.name]) != {"null"}:
            shown = "; ".join(f"`{value}` ({', '.join(labels)})" for value, labels in declared[f.name].items())
            default_text = f"null → {shown}"
        else:
            default_text = f"`{_yaml(default)}`"
        meaning = docs.get(f.name, "")
        if key in REGISTRY:
            meaning += f" One of: {', '.join(f'`{n}`' for n in sorted(REGISTRY[key].entries()))}."
        cells = [f"`{key}`", f"`{f.type}`", default_text, meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def markdown() -> str:
    """docs/config.md: every section and field, its type, default and docstring, with the
    registries' allowed names and each entry's own default for its hyperparameters."""
    entries = all_entries()
    generated = ("Generated from the field docstrings of `src/rlvr/config.py` by "
                 "`python -m rlvr.config --markdown > docs/config.md` (a test checks that this file is current).")
    lines = ["# Configuration reference", "", generated, ""]
    lines += [" ".join(part.split()) + "\n" for part in __doc__.split("\n\n")[1:]]
    lines += ["A default `null → v (entries)` is what a null field resolves to when one of those entries is chosen.", ""]

    def section(cls: type, path: str) -> None:
        doc = inspect.getdoc(cls) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
        lines.extend([f"## `{path}`" if path else "## Top level", ""] + ([" ".join(doc.split()), ""] if doc else []))
        lines.extend(_section_rows(cls, path, entries.get(path, [])) + [""])
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = _section_type(hints[f.name])
            if sub is not None:
                section(sub, f"{path}.{f.name}" if path else f.name)

    section(Config, "")
    elsewhere = ", ".join(f"`{k}` from {v}" for k, v in ELSEWHERE.items())
    lines.extend(["## Bound from elsewhere", "", f"Keywords the builder binds from other fields: {elsewhere}.", ""])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m rlvr.config --markdown > docs/config.md", file=sys.stderr)
        return 2
    print(markdown(), end="")
    return 0


if __name__ == "__main__":  # run the copy every other module imports, not this __main__ one
    sys.exit(importlib.import_module("rlvr.config").main(sys.argv[1:]))
