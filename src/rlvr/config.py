"""The one source of truth for a run's settings: frozen dataclasses, a one-line doc per field.

`load_config(recipe, overrides)` reads a YAML recipe, applies dotted command-line overrides
(`algo.clip_high=0.28 seed=3`), checks names, types and ranges, and returns a `Config`.
Every mistake becomes one `ConfigError` line that names the field and the fix.
Components never see this object: `rlvr.trainer.build` reads it once.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "causal"  # `causal` (autoregressive LM) or `diffusion` (masked-diffusion LM)
    path: str = "rlvr:countdown-warmstart"  # local HF directory, `rlvr:NAME` (packaged checkpoint), empty = fresh tiny model
    shift_logits: bool = False  # diffusion: Dream-style shifted logits (position i predicts token i+1)
    hidden_size: int = 128  # tiny model: width
    num_layers: int = 4  # tiny model: transformer blocks
    num_heads: int = 4  # tiny model: attention heads
    intermediate_size: int = 512  # tiny model: MLP width
    max_seq_len: int = 64  # tiny model: longest prompt + completion


@dataclass(frozen=True)
class TaskConfig:
    name: str = "countdown"  # task registry key
    num_count: int = 3  # countdown: how many numbers (3 or 4)
    max_number: int = 9  # countdown: numbers are drawn from 1..max_number
    allow_division: bool = False  # countdown: allow exact integer division
    ordered: bool = True  # countdown: prompts list the numbers in the order the generating expression uses them
    show_work: bool = False  # countdown: completions list steps `5*2=10,10+3=13` instead of a bare expression
    heldout_size: int = 200  # size of the fixed held-out evaluation set
    sampling: str = "draws"  # countdown: training problems as the generator draws them (`draws`) or uniform over problem keys (`keys`, like the held-out set)
    partial_credit: str = "parse"  # countdown: 0.1 for any parseable wrong answer (`parse`, d1/TinyZero) or only one over the given numbers (`numbers`)
    path: str = ""  # file tasks: JSONL / Parquet file or HF `save_to_disk` directory
    prompt_key: str | None = None  # file tasks: field holding the prompt, null = the task's default
    answer_key: str | None = None  # math_file: field holding the reference answer
    tests_key: str | None = None  # code_file: field holding the tests
    solution_key: str | None = None  # math_file: field holding a worked solution (for SFT)
    system_prompt: str = ""  # file tasks: system message (chat templates) or prefix
    prompt_template: str | None = None  # file tasks: format string with {prompt}
    max_prompt_length: int = 0  # file tasks: drop longer prompts (tokens), 0 = keep all
    heldout_path: str = ""  # file tasks: separate evaluation file, empty = hash split
    split: str | None = None  # HF datasets directory: split name
    math_timeout_s: float = 5.0  # math_file: time limit of one equivalence check
    all_or_nothing: bool = False  # code_file: reward 1 only if every test passes
    sandbox_workers: int = 2  # code_file: programs run at once
    wall_s: float = 5.0  # code_file: wall-clock limit per program
    memory_mb: int = 512  # code_file: address-space limit per program
    isolation: str = "auto"  # code_file: sandbox isolation: auto | bwrap | unshare | none


@dataclass(frozen=True)
class RewardConfig:
    fn: str = ""  # user reward `file.py:name` or `module:name` replacing the task's verifier; empty = task's


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = 8  # P: fresh prompts per step
    group_size: int = 16  # G: completions per prompt (B = P·G)
    max_new_tokens: int = 16  # completion length cap (longer samples are truncated)
    temperature: float = 1.0  # sampling temperature (the trainer's log-probs use the same)
    top_p: float = 1.0  # nucleus sampling mass
    diffusion_steps: int = 0  # diffusion sampler: denoising steps N, 0 = one token per step (N = L)
    block_length: int = 0  # diffusion sampler: semi-autoregressive block length B, 0 = the whole window
    remasking: str = "low_confidence"  # diffusion sampler: low_confidence | random | entropy | margin
    threshold: float | None = None  # diffusion sampler: commit every token above this confidence (dynamic)
    suppress_eos: bool = False  # diffusion sampler: lower EOS confidence so content is committed first
    greedy_in_group: bool = False  # diffusion models: the last completion of every group is decoded greedily (T = 0) and trains with its siblings, so the advantage sees whether the greedy answer (what evaluation scores) beats the samples
    window: str = "eos"  # diffusion: which window tokens are the completion: `eos` (up to EOS) or `full`
    prompt_selection: str = "uniform"  # which prompts a step rolls out: `uniform` draws or `mopps` posterior selection
    selection_candidates: float = 2.0  # mopps: candidates drawn per prompt rolled out (1/κ)
    selection_target: float = 0.5  # mopps: success rate the selection aims at
    selection_decay: float = 0.5  # mopps: λ, weight kept by old evidence at each new observation of a prompt
    decode_engine: str = "cpp"  # Llama/Qwen2 sampler's decode step: `cpp` fused C++ kernel (built once per machine, ~30 s; falls back to `eager` with one line if it cannot be built), `eager` ATen ops


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = "grpo"  # advantage estimator (rlvr.algos.advantages.ADVANTAGES)
    objective: str = "ppo_clip"  # policy objective (rlvr.algos.objectives.OBJECTIVES)
    aggregation: str = "seq_mean_token_mean"  # loss aggregation (rlvr.algos.aggregate.AGGREGATIONS)
    kl_estimator: str = "k3"  # KL estimator (rlvr.algos.kl.KL_ESTIMATORS)
    kl_coef: float = 0.0  # KL weight β against the frozen initial policy; 0 = no reference model
    kl_placement: str = "loss"  # where the KL goes: `loss` or `reward`
    std_normalize: bool = True  # grpo: divide by the group std
    adv_eps: float = 1e-6  # grpo: added to the group std
    clip_low: float = 0.2  # ppo_clip: ε_low, ratio floor 1-ε_low
    clip_high: float = 0.2  # ppo_clip: ε_high, ratio ceiling 1+ε_high
    dual_clip: float | None = None  # ppo_clip: dual-clip constant c > 1 for A<0, null = off
    log_ratio_clamp: float = 20.0  # clamp |log ratio| before exp
    norm_length: float | None = None  # seq_mean_token_sum_norm: constant normaliser, null = max_new_tokens
    entropy_coef: float = 0.0  # entropy bonus weight (0 = entropy only logged)
    tau_pos: float = 1.0  # sapo: gate temperature for A > 0
    tau_neg: float = 1.05  # sapo: gate temperature for A < 0
    pass_k: int = 1  # passk: k of the pass@k objective
    gamma: float = 1.0  # reinforce_pp / gae: discount of token-level returns
    lam: float = 1.0  # gae: lambda
    value_clip: float | None = 0.5  # gae critic: clip of the value update around the old value
    critic_lr: float = 1e-4  # gae critic: AdamW learning rate of the value model
    critic_warmup_steps: int = 0  # gae critic: steps that train only the critic
    kl_target: float | None = None  # adaptive KL: target per-sequence KL, null = fixed kl_coef
    kl_horizon: float = 10000.0  # adaptive KL: horizon (in samples) of the controller
    overlong_buffer: int = 0  # DAPO soft overlong punishment: buffer in tokens below max_new_tokens, 0 = off
    overlong_factor: float = 1.0  # DAPO soft overlong punishment at max_new_tokens
    overlong_filter: bool = False  # DAPO overlong filtering: truncated completions get no loss
    dynamic_sampling: bool = True  # DAPO: drop zero-variance groups (backfilled while rounds remain)
    max_sampling_rounds: int = 1  # dynamic sampling: rollout rounds per step; 1 = filter, no backfill
    rollout_correction: bool = False  # weight the loss by pi_old / pi_rollout (TIS / MIS)
    correction_level: str = "token"  # rollout correction: `token` or `sequence` weights
    correction_mode: str = "truncate"  # rollout correction: `truncate` (TIS) or `mask` (MIS)
    correction_cap: float = 2.0  # rollout correction: cap C on the weight
    wd1_psi: float = 1.0  # wd1: inverse temperature of the group softmax over advantages
    estimator: str = "mean_field"  # diffusion likelihood estimator (rlvr.models.likelihood.ESTIMATORS)
    mc_samples: int = 2  # elbo_mc / bgpo / spg: Monte-Carlo mask draws n
    antithetic: bool = False  # elbo_mc / bgpo: complementary (antithetic) mask pairs
    p_mask_prompt: float = 0.15  # mean_field: prompt-token masking probability
    t_min: float = 0.2  # coupled: lowest mask ratio
    t_max: float = 0.8  # coupled: highest mask ratio
    include_full: bool = True  # coupled: add the all-masked pass as the released code does
    spg_beta: float = 1.5  # spg: EUBO exponent β
    spg_omega: float = 0.5  # spg: weight of the EUBO in the ω-mixture for A < 0
    spg_bound: str = "mixture"  # spg: `elbo`, `eubo` or `mixture` for negative advantages
    spg_block_length: int | None = None  # spg: block-wise masking block, null = whole window
    trace_shrink: int = 1  # trace: merge this many sampler steps into one (σ)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    beta1: float = 0.9  # AdamW β1
    beta2: float = 0.99  # AdamW β2
    grad_clip: float = 1.0  # max global grad norm, 0 = off
    warmup_steps: int = 10  # linear LR warmup, in optimizer steps
    schedule: str = "cosine"  # after warmup: `constant` or `cosine` (decays to min_lr_ratio·lr at the last step)
    min_lr_ratio: float = 0.0  # cosine schedule: final LR as a fraction of optim.lr


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = 3000  # rollout steps
    minibatches: int = 1  # optimizer steps per rollout batch
    ppo_epochs: int = 1  # passes over each rollout batch
    micro_batch_size: int = 64  # completions per forward; memory only, never changes results
    eval_every: int = 250  # steps between greedy held-out evaluations (0 = only at start and end)
    eval_samples: int = 0  # also score k samples per held-out problem at the rollout temperature (eval/heldout_sampled_accuracy = avg@k, eval/heldout_pass_at_k); 0 = greedy only
    samples_per_step: int = 4  # rollouts written to samples.jsonl each step
    save_every: int = 500  # steps between checkpoints (0 = only at the end)
    keep_last: int = 2  # checkpoints kept on disk
    out_dir: str = "runs"  # parent of run directories
    name: str = ""  # run directory name, empty = recipe name + seed
    threads: int = 0  # torch threads, 0 = torch's default
    kernels: str = "cpp"  # training forward+backward of Llama-family models: `cpp` = each layer one C++ call each way (built once per machine; eager if it cannot be built), `eager` = ATen ops; same math to float rounding
    thread_mode: str = "auto"  # how threads are used: `ops` = torch's intra-op threads; `rows` = each thread takes a share of every batch's rows with single-threaded ops (faster, and no collapse when another process holds a core; causal models); `auto` = rows for causal models, ops for diffusion ones
    trackers: str = ""  # extra metric sinks beside metrics.jsonl, comma-separated: tensorboard,wandb,mlflow


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 80  # optimizer steps of supervised warm start
    batch_size: int = 64  # examples per step
    lr: float = 1e-3  # AdamW learning rate
    warmup_steps: int = 20  # linear LR warmup
    schedule: str = "constant"  # LR after warmup: `constant` or `cosine` (decays to 0 at the last step)


@dataclass(frozen=True)
class Config:
    seed: int = 0  # seeds model init, prompts and sampling
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


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
        if dataclasses.is_dataclass(hints[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a section (mapping), got {value!r}")
            kwargs[key] = _build(hints[key], value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def all_keys(cls: type = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema, e.g. 'algo.clip_high'."""
    cls = cls or Config
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += all_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _suggest(full: str) -> str:
    keys = all_keys()
    leaf = full.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
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


def load_config(recipe: str | Path | None = None, overrides: list[str] = ()) -> Config:
    tree = read_recipe(recipe) if recipe else {}
    for key, value in parse_overrides(list(overrides)):
        _set_dotted(tree, key, value)
    config = _build(Config, tree, "")
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
        (config.algo.correction_level in ("token", "sequence"), "algo.correction_level", "must be 'token' or 'sequence'"),
        (config.algo.correction_mode in ("truncate", "mask"), "algo.correction_mode", "must be 'truncate' or 'mask'"),
        (config.algo.critic_lr > 0, "algo.critic_lr", "must be > 0"),
        (config.optim.schedule in ("constant", "cosine"), "optim.schedule", "must be 'constant' or 'cosine'"),
        (config.sft.schedule in ("constant", "cosine"), "sft.schedule", "must be 'constant' or 'cosine'"),
        (config.model.kind in ("causal", "diffusion"), "model.kind", "must be 'causal' or 'diffusion'"),
        (config.algo.mc_samples >= 1, "algo.mc_samples", "must be >= 1"),
        (config.task.sampling in ("draws", "keys"), "task.sampling", "must be 'draws' or 'keys'"),
        (config.task.partial_credit in ("parse", "numbers"), "task.partial_credit", "must be 'parse' or 'numbers'"),
        (config.rollout.prompt_selection in ("uniform", "mopps"), "rollout.prompt_selection",
         "must be 'uniform' or 'mopps'"),
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


def derived_batch_numbers(config: Config) -> dict[str, int]:
    """The batch vocabulary of DESIGN §3, resolved for this config."""
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
