"""`rlvr config --from-verl FILE`: a verl PPO/GRPO configuration (its Hydra YAML, or the `key=value`
overrides of a `python3 -m verl.trainer.main_ppo ...` command) as an rlvr recipe.

`VERL_NAMES` maps verl's dotted keys to the rlvr fields with the same meaning (a value may pick a
choice, as `algorithm.adv_estimator=reinforce_plus_plus` picks `algo.advantage=reinforce_pp`);
`VERL_INFRA` lists the keys that place work on GPUs (FSDP, tensor parallelism, offload, memory
utilisation) and have no meaning for the result, which rlvr decides itself. Everything else is
kept as a comment at the top of the recipe, never dropped silently. Batch sizes convert as verl
counts them: `data.train_batch_size` prompts per step, each rolled out `actor_rollout_ref.rollout.n`
times, and `actor_rollout_ref.actor.ppo_mini_batch_size` prompts per optimizer step. The table of
`docs/migrating-from-verl.md` is generated from `VERL_NAMES` (`verl_markdown`; a test keeps it
current and loads every row).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.config.from_trl import _scalar, _set, read_tree, shell_words
from rlvr.errors import ConfigError
from rlvr.inputs import read_text
from rlvr.yaml_io import MAX_BYTES

__all__ = ["VERL_NAMES", "convert_verl", "read_verl_args", "recipe_from_verl", "verl_markdown", "verl_page"]

ACTOR, ROLLOUT = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
KL = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


@dataclass(frozen=True)
class VerlName:
    """One verl key and the rlvr field(s) it sets: `key` takes the value as is, `choices` map values."""

    verl: str
    key: str = ""
    choices: dict[Any, dict[str, Any]] = field(default_factory=dict)
    note: str = ""


VERL_NAMES: dict[str, VerlName] = {v.verl: v for v in (
    VerlName("algorithm.adv_estimator", choices={
        "grpo": {"algo.advantage": "grpo"}, "rloo": {"algo.advantage": "rloo"}, "remax": {"algo.advantage": "remax"},
        "reinforce_plus_plus": {"algo.advantage": "reinforce_pp"}, "gae": {"algo.advantage": "gae"},
        "reinforce_plus_plus_baseline": {"algo.advantage": "reinforce_pp_baseline"},
        "opo": {"algo.advantage": "opo"}, "grpo_passk": {"algo.advantage": "grpo_passk"},
        "gpg": {"algo.advantage": "gpg"}, "optimal_token_baseline": {"algo.advantage": "optimal_token_baseline"}}),
    VerlName("algorithm.norm_adv_by_std_in_grpo", "algo.std_normalize"),
    VerlName("algorithm.use_kl_in_reward", choices={True: {"algo.kl_placement": "reward"}, False: {}}),
    VerlName("algorithm.kl_ctrl.kl_coef", "algo.kl_coef", note="with use_kl_in_reward"),
    VerlName("algorithm.kl_penalty", choices={k: {"algo.kl_estimator": v} for k, v in KL.items()},
             note="with use_kl_in_reward"),
    VerlName("algorithm.filter_groups.enable", "algo.dynamic_sampling", note="DAPO's dynamic sampling"),
    VerlName("data.train_files", "task.math_file.path", note="a math task (`math_file`); its rows' columns as "
             "task.math_file.prompt_key / answer_key say"),
    VerlName("data.val_files", "task.math_file.heldout_path"),
    VerlName("data.prompt_key", "task.math_file.prompt_key"),
    VerlName("data.train_batch_size", "rollout.prompts_per_step"),
    VerlName("data.max_prompt_length", "task.math_file.max_prompt_length", note="longer prompts are dropped"),
    VerlName("data.max_response_length", "rollout.max_new_tokens"),
    VerlName("actor_rollout_ref.model.path", "model.path"),
    VerlName("actor_rollout_ref.model.enable_gradient_checkpointing", "trainer.gradient_checkpointing"),
    VerlName("actor_rollout_ref.model.lora_rank", "model.lora.r"),
    VerlName("actor_rollout_ref.model.lora_alpha", "model.lora.alpha"),
    VerlName("actor_rollout_ref.model.target_modules", "model.lora.target_modules"),
    VerlName(ACTOR + "optim.lr", "optim.lr"),
    VerlName(ACTOR + "optim.lr_warmup_steps", "optim.warmup_steps", note="verl's -1 (a ratio instead) is not taken"),
    VerlName(ACTOR + "optim.weight_decay", "optim.weight_decay"),
    VerlName(ACTOR + "grad_clip", "optim.grad_clip"),
    VerlName(ACTOR + "ppo_epochs", "trainer.ppo_epochs"),
    VerlName(ACTOR + "ppo_mini_batch_size", note="prompts per optimizer step: trainer.minibatches = "
             "data.train_batch_size / ppo_mini_batch_size"),
    VerlName(ACTOR + "use_kl_loss", choices={True: {"algo.kl_placement": "loss"}, False: {}}),
    VerlName(ACTOR + "kl_loss_coef", "algo.kl_coef", note="with use_kl_loss"),
    VerlName(ACTOR + "kl_loss_type", choices={k: {"algo.kl_estimator": v} for k, v in KL.items()},
             note="with use_kl_loss"),
    VerlName(ACTOR + "entropy_coeff", "algo.entropy_coef"),
    VerlName(ACTOR + "clip_ratio", note="sets both ends: algo.clip_low and algo.clip_high"),
    VerlName(ACTOR + "clip_ratio_low", "algo.clip_low"),
    VerlName(ACTOR + "clip_ratio_high", "algo.clip_high"),
    VerlName(ACTOR + "clip_ratio_c", "algo.dual_clip"),
    VerlName(ACTOR + "loss_agg_mode", choices={
        "token-mean": {"algo.aggregation": "token_mean"}, "seq-mean-token-mean": {"algo.aggregation":
                                                                                 "seq_mean_token_mean"},
        "seq-mean-token-sum": {"algo.aggregation": "seq_mean_token_sum"},
        "seq-mean-token-sum-norm": {"algo.aggregation": "seq_mean_token_sum_norm"}}),
    VerlName(ACTOR + "policy_loss.loss_mode", choices={
        "vanilla": {"algo.objective": "ppo_clip"}, "gspo": {"algo.objective": "gspo"},
        "cispo": {"algo.objective": "cispo"}, "clip_cov": {"algo.objective": "clip_cov"},
        "kl_cov": {"algo.objective": "kl_cov"}, "gpg": {"algo.objective": "reinforce"}}),
    VerlName(ACTOR + "ppo_micro_batch_size_per_gpu", "trainer.micro_batch_size", note="memory only, in completions"),
    VerlName(ROLLOUT + "n", "rollout.group_size"),
    VerlName(ROLLOUT + "name", choices={"vllm": {"rollout.engine": "vllm"}, "hf": {"rollout.engine": "torch"}}),
    VerlName(ROLLOUT + "temperature", "rollout.temperature"),
    VerlName(ROLLOUT + "top_p", "rollout.top_p"),
    VerlName(ROLLOUT + "top_k", "rollout.top_k", note="verl's -1 (off) is rlvr's 0"),
    VerlName("trainer.total_training_steps", "trainer.steps"),
    VerlName("trainer.total_epochs", note="rlvr runs trainer.steps rollout batches: set trainer.steps (epochs x "
             "rows / data.train_batch_size)"),
    VerlName("trainer.save_freq", "trainer.save_every", note="verl's -1 (never) is rlvr's 0"),
    VerlName("trainer.test_freq", "trainer.eval_every", note="verl's -1 (never) is rlvr's 0"),
    VerlName("trainer.critic_warmup", "algo.critic_warmup_steps"),
    VerlName("trainer.default_local_dir", "trainer.out_dir"),
    VerlName("trainer.seed", "seed"),
)}
# Placement on GPUs and logging: no bearing on what is trained; rlvr decides these itself.
VERL_INFRA = ("fsdp_config", "tensor_model_parallel_size", "gpu_memory_utilization", "log_prob_micro_batch_size",
              "n_gpus_per_node", "nnodes", "project_name", "experiment_name", "use_remove_padding", "logger",
              "filter_overlong_prompts", "truncation", "use_dynamic_bsz", "ppo_max_token_len_per_gpu",
              "val_before_train", "enable_chunked_prefill", "max_num_batched_tokens", "enforce_eager",
              "free_cache_engine", "load_format", "strategy", "resume_mode", "nccl_timeout")
NEVER = {"trainer.save_freq": -1, "trainer.test_freq": -1, ROLLOUT + "top_k": -1}  # verl's "off" values: rlvr's 0


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + str(key)] = value
    return out


def parse_overrides(text: str, where: str = "--from-verl") -> dict[str, Any]:
    """A verl command's Hydra overrides (`key=value`, `+key=value`), the launcher before them skipped.

    >>> parse_overrides("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=8 $@")
    {'algorithm.adv_estimator': 'grpo', 'data.train_batch_size': 8}
    """
    values = {}
    for word in shell_words(text, where):
        key, eq, value = word.lstrip("+").partition("=")
        if eq and "." in key:
            values[key] = _scalar(value) if value not in ("True", "False") else value == "True"
    return values


def read_verl_args(path: str | Path) -> dict[str, Any]:
    """The verl keys in `path`: a YAML tree (flattened to dotted keys) or a text of overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--from-verl: '{path}' is not a file; give a verl YAML config or a file of key=value "
                          f"overrides (a run script)")
    text = read_text(path, "--from-verl", MAX_BYTES)
    if path.suffix in (".yaml", ".yml", ".json"):
        tree = read_tree(text, path, f"--from-verl '{path}'")
        if not isinstance(tree, dict):
            raise ConfigError(f"--from-verl: '{path}' holds a {type(tree).__name__}, not a mapping of verl's sections")
        return _flat(tree)
    values = parse_overrides(text, f"--from-verl '{path}'")
    if not values:
        raise ConfigError(f"--from-verl: '{path}' holds no key=value overrides (algorithm.adv_estimator=grpo ...)")
    return values


def convert_verl(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(rlvr recipe tree, notes on what was not converted) for verl's dotted `values`."""
    tree: dict[str, Any] = {"algo": {"dynamic_sampling": False}}  # verl filters groups only when asked
    notes, unknown, infra = [], [], []
    if any(VERL_NAMES[k].key.startswith("task.math_file.") for k in values if k in VERL_NAMES):
        _set(tree, "task.name", "math_file")  # verl's data keys describe a file of rows
    for key, value in values.items():
        if NEVER.get(key, object()) == value:
            value = 0
        if key == ACTOR + "clip_ratio":
            _set(tree, "algo.clip_low", value)
            _set(tree, "algo.clip_high", value)
        elif key == ACTOR + "ppo_mini_batch_size":
            prompts = values.get("data.train_batch_size")
            if isinstance(prompts, int) and isinstance(value, int) and value > 0 and prompts % value == 0:
                _set(tree, "trainer.minibatches", prompts // value)
            else:
                notes.append(f"{key}={value!r}: data.train_batch_size={prompts!r} is not a multiple of it; set "
                             f"trainer.minibatches")
        elif key in VERL_NAMES:
            v = VERL_NAMES[key]
            if v.key:
                _set(tree, v.key, value[0] if isinstance(value, list) and len(value) == 1 else value)
            elif not v.choices:
                notes.append(f"{key}={value!r}: {v.note}")
            elif value in v.choices and type(value) is type(next(k for k in v.choices if k == value)):
                for k, item in v.choices[value].items():
                    _set(tree, k, item)
            else:
                notes.append(f"{key}={value!r}: no rlvr equivalent; valid: {', '.join(map(repr, v.choices))}")
        elif any(part in VERL_INFRA for part in key.split(".")) or key.endswith("_per_gpu"):
            infra.append(key)
        else:
            unknown.append(key)
    if infra:
        notes.append("placement and logging, which rlvr decides itself: " + ", ".join(infra))
    if unknown:
        notes.append("not in rlvr's map of verl keys (see docs/migrating-from-verl.md): " + ", ".join(unknown))
    return tree, notes


def recipe_from_verl(path: str | Path) -> str:
    """The recipe YAML for the verl configuration in `path`, its notes as comments; checked by loading it."""
    from rlvr.config.load import load_config

    tree, notes = convert_verl(read_verl_args(path))
    load_config(json.loads(json.dumps(tree)))
    header = [f"# converted from verl's configuration in {Path(path).name} (rlvr config --from-verl)"]
    for note in notes:
        header += textwrap.wrap(note, 96, initial_indent="# not converted: ", subsequent_indent="#   ")
    return "\n".join(header) + "\n" + yaml.safe_dump(tree, sort_keys=False)


VERL_BEGIN, VERL_END = "<!-- verl-names: begin -->", "<!-- verl-names: end -->"


def verl_page(page: str) -> str:
    """`page` (docs/migrating-from-verl.md) with the table between its markers regenerated."""
    head, _, rest = page.partition(VERL_BEGIN)
    _, _, tail = rest.partition(VERL_END)
    return f"{head}{VERL_BEGIN}\n{verl_markdown()}{VERL_END}{tail}"


def verl_markdown() -> str:
    """The table of `docs/migrating-from-verl.md`."""
    rows = ["| verl key | rlvr | note |", "|---|---|---|"]
    for v in VERL_NAMES.values():
        target = f"`{v.key}`" if v.key else "<br>".join(
            f"`{k!r}` → " + (", ".join(f"`{f}={x!r}`" for f, x in fields.items()) or "as is")
            for k, fields in v.choices.items()) or "—"
        rows.append(f"| `{v.verl}` | {target} | {v.note} |")
    return "\n".join(rows) + "\n"
