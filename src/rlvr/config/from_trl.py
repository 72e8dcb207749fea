"""`rlvr config --from-trl FILE`: a TRL `GRPOConfig` (its JSON or YAML, as `GRPOConfig.to_json_string()`
or a TRL `--config` file writes it, or the `--flag value` arguments of a TRL launch command) as
an rlvr recipe.

Every name in `trl_names.TRL_NAMES` becomes the rlvr field(s) it means (`trl_names.translate`,
the same rewriting the command line does); what cannot be converted is kept as a comment at the
top of the recipe, never dropped silently: a TRL name rlvr has no field for (with the reason and
what to set instead), a value without an rlvr equivalent, and names the map does not know. A
TRL default that rlvr cannot take (`gradient_accumulation_steps: 1`) is no loss and stays quiet,
so a full `GRPOConfig` dump converts to the recipe of what it changes. The recipe is loaded
before it is printed, so what comes out is a recipe `rlvr train` accepts.
"""

from __future__ import annotations

import json
import math
import shlex
import textwrap
from pathlib import Path
from typing import Any

import yaml

from rlvr.config.trl_names import TRL_NAMES, translate
from rlvr.errors import ConfigError
from rlvr.hub import is_hub_dataset
from rlvr.inputs import read_text
from rlvr.yaml_io import MAX_BYTES, load_yaml

# TRL scripts' own arguments (`ModelConfig`, not `GRPOConfig`) that a launch command carries.
SCRIPT_NAMES = {"model_name_or_path": "model.path"}
# Fields one objective alone reads: a GRPOConfig dump carries their defaults whatever the loss, and
# rlvr refuses a field the chosen methods do not read, so they convert only when changed.
READ_BY_ONE_METHOD = {"sapo_temperature_pos", "sapo_temperature_neg"}
UNSET = {"max_steps": -1}  # TRL's "not set" values other than None (max_steps: train num_train_epochs)
# TRL's batch names: together with num_generations they make rlvr's prompts per step (`batch_sizes`).
BATCH_NAMES = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
               "generation_batch_size")
TRL_BATCH_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8}
LAUNCHERS = ("--", "accelerate ", "python", "torchrun ", "trl ")  # how a pasted TRL command line starts
# Names read with others rather than one by one (`convert`).
JOB_NAMES = {*BATCH_NAMES, "warmup_ratio", "max_prompt_length", "num_processes", "dataset_name", "reward_funcs"}
MATH_REWARD = "accuracy_reward"  # TRL's math-verify reward: rlvr's math_file verifier means the same
# What TRL's GRPOTrainer does that rlvr's defaults do not: it trains every group, a zero-variance one
# included (it only logs `frac_reward_zero_std`), so TRL's arguments turn DAPO's group filter off.
TRL_BEHAVIOUR = {"algo.dynamic_sampling": False}


def _scalar(text: str) -> Any:
    """A command-line value as TRL's argument parser reads it: numbers, booleans, None."""
    if text == "None":
        return None
    value = yaml.safe_load(text)
    return value if isinstance(value, (int, float, bool)) else text


def _launcher(words: list[str]) -> tuple[list[str], dict[str, Any]]:
    """A pasted launch line (``accelerate launch --num_processes 8 trl/scripts/grpo.py --flag ...``,
    ``python grpo.py ...``, ``torchrun ...``, ``trl grpo ...``): the script's words, and the processes it starts."""
    script = next((i for i, w in enumerate(words) if w.endswith(".py") or (w == "grpo" and i and words[i - 1]
                                                                           == "trl")), None)
    if script is None or not words or words[0].startswith("--"):
        return words, {}
    launcher, processes = words[:script], {}
    for i, word in enumerate(launcher):
        name, eq, value = word.lstrip("-").partition("=")
        if name.replace("-", "_") in ("num_processes", "nproc_per_node"):
            value = value if eq else (launcher[i + 1] if i + 1 < len(launcher) else "")
            if value.isdigit():
                processes["num_processes"] = int(value)
    return words[script + 1:], processes


def shell_words(text: str, where: str) -> list[str]:
    """The words of a launch command as a shell splits them (a line continued with a backslash, `#`
    comments); a quote never closed is one line naming `where`, not shlex's ValueError."""
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:  # "No closing quotation", "No escaped character"
        raise ConfigError(f"{where}: cannot split it as a shell does ({err}): a quote (\" or ') is opened and "
                          f"never closed, or a line ends in a lone backslash; close the quote") from None


def read_tree(text: str, path: Path, where: str) -> Any:
    """The JSON (a .json file) or YAML in `text`, a parse error one line naming `where`."""
    if path.suffix != ".json":
        return load_yaml(text, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON: {str(err).splitlines()[0]}") from None


def parse_flags(text: str, where: str = "--from-trl") -> dict[str, Any]:
    """``--num_generations 8 --use_vllm --beta=0.04`` -> {"num_generations": 8, "use_vllm": True, "beta": 0.04};
    a whole launch line reads as its script's flags and its process count.

    >>> parse_flags("--num-generations 8 --use_vllm --beta=0.04 --report_to none")
    {'num_generations': 8, 'use_vllm': True, 'beta': 0.04, 'report_to': 'none'}
    >>> parse_flags("accelerate launch --num_processes 2 trl/scripts/grpo.py --num_generations 4")
    {'num_processes': 2, 'num_generations': 4}
    """
    words, values = _launcher(shell_words(text, where))
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ConfigError(f"--from-trl: expected a --flag, got {word!r}; write TRL's arguments as "
                              f"'--name value' (or give a JSON/YAML file)")
        name, eq, value = word[2:].partition("=")
        name = name.replace("-", "_")
        if eq:
            values[name] = _scalar(value)
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            values[name] = _scalar(words[i + 1])
            i += 1
        else:  # a bare flag is a boolean switched on
            values[name] = True
        i += 1
    return values


def read_trl_args(path: str | Path) -> dict[str, Any]:
    """The TRL arguments in `path`: a JSON or YAML mapping, or a text of `--flag value` arguments."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--from-trl: '{path}' is not a file; give a GRPOConfig as JSON/YAML or a file of "
                          f"'--flag value' arguments")
    text = read_text(path, "--from-trl", MAX_BYTES)
    if text.lstrip().startswith(LAUNCHERS) or path.suffix in (".sh", ".txt", ".args"):
        return parse_flags(text, f"--from-trl '{path}'")
    tree = read_tree(text, path, f"--from-trl '{path}'")
    if not isinstance(tree, dict):
        raise ConfigError(f"--from-trl: '{path}' holds a {type(tree).__name__}, not a mapping of GRPOConfig fields")
    return tree


def convert(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(rlvr recipe tree, notes on what was not converted) for TRL's `values`.

    >>> tree, notes = convert({"num_generations": 4, "beta": 0.04, "gradient_accumulation_steps": 1,
    ...                        "logging_steps": 5})
    >>> tree["rollout"], tree["algo"], notes[0].endswith(": logging_steps")
    ({'prompts_per_step': 2, 'group_size': 4}, {'dynamic_sampling': False, 'kl_coef': 0.04}, True)
    """
    tree: dict[str, Any] = {}
    for key, value in TRL_BEHAVIOUR.items():
        _set(tree, key, value)
    values, notes = _job(values, tree)
    unknown, convertible = [], []
    for name, value in values.items():
        if value is None or UNSET.get(name, object()) == value or (
                name in READ_BY_ONE_METHOD and value == TRL_NAMES[name].trl_default):
            continue  # TRL's None is "unset": its own default
        if name == "report_to" and isinstance(value, list):  # a dump holds TRL's resolved list
            value = value[0] if len(value) == 1 else "none" if not value else value
        if name in SCRIPT_NAMES:
            _set(tree, SCRIPT_NAMES[name], value)
        elif name not in TRL_NAMES:
            unknown.append(name)
        else:
            try:
                translate([(name, value)])  # this name and value alone: refused or not
                convertible.append((name, value))
            except ConfigError as err:
                if value != TRL_NAMES[name].trl_default:
                    reason = str(err).split(" (TRL's GRPOConfig) ", 1)[-1]
                    notes.append(f"{name}={value!r}: {reason}")
    for group in translate(convertible):  # together: a name that reads another (epsilon, epsilon_high)
        for key, item in group:
            _set(tree, key, item)
    if unknown:
        notes.append("not in rlvr's map of TRL names (see docs/migrating-from-trl.md): " + ", ".join(unknown))
    return tree, notes


def batch_sizes(values: dict[str, Any], processes: int = 1) -> dict[str, int]:
    """rlvr's prompts per step, group size and optimizer steps per rollout batch for TRL's batch names
    (TRL's defaults for those not given), as `GRPOConfig` derives its generation batch: completions =
    per_device_train_batch_size x processes x steps_per_generation (default gradient_accumulation_steps),
    each optimizer step taking gradient_accumulation_steps of those per-device batches.

    >>> batch_sizes({"per_device_train_batch_size": 8, "num_generations": 4, "gradient_accumulation_steps": 2})
    {'rollout.prompts_per_step': 4, 'rollout.group_size': 4, 'trainer.minibatches': 1}
    """
    get = {**TRL_BATCH_DEFAULTS, **{k: v for k, v in values.items() if v is not None}}.get
    per_device, accumulation, group = get("per_device_train_batch_size"), get("gradient_accumulation_steps"), \
        get("num_generations")
    if not all(isinstance(n, int) and n > 0 for n in (per_device, accumulation, group, processes)):
        return {"rollout.group_size": group}  # rlvr's own check names what is wrong
    if get("generation_batch_size") is not None:
        completions = get("generation_batch_size")
        per_generation = completions // (per_device * processes)
    else:
        per_generation = get("steps_per_generation") or accumulation
        completions = per_device * processes * per_generation
    if completions % group or per_generation % accumulation or completions < group:
        raise ConfigError(f"--from-trl: a generation batch of {completions} completions (per_device_train_batch_size="
                          f"{per_device} x {processes} processes x steps_per_generation={per_generation}) must be a "
                          f"multiple of num_generations={group}, and steps_per_generation of "
                          f"gradient_accumulation_steps={accumulation}, as TRL requires")
    return {"rollout.prompts_per_step": completions // group, "rollout.group_size": group,
            "trainer.minibatches": per_generation // accumulation}


def _job(values: dict[str, Any], tree: dict) -> tuple[dict[str, Any], list[str]]:
    """The names read together (`JOB_NAMES`) into `tree`; the rest, for one-by-one conversion, and notes."""
    values, notes = dict(values), []
    processes = values.pop("num_processes", 1) or 1
    if any(values.get(name) is not None for name in (*BATCH_NAMES, "num_generations")) or processes > 1:
        for key, value in batch_sizes(values, processes).items():
            _set(tree, key, value)
        for name in BATCH_NAMES:
            values.pop(name, None)
        if processes > 1:
            notes.append(f"num_processes={processes}: the batch is the {processes} processes' together; rlvr runs "
                         f"them as one (or launch it with torchrun, trainer.learners={processes})")
    ratio = values.pop("warmup_ratio", None)
    if isinstance(values.get("warmup_steps"), float) and 0 < values["warmup_steps"] < 1:
        ratio = values.pop("warmup_steps")  # transformers reads a warmup_steps below 1 as a ratio
    steps = values.get("max_steps")
    if ratio and isinstance(steps, int) and steps > 0:
        _set(tree, "optim.warmup_steps", math.ceil(ratio * steps))
    elif ratio:
        notes.append(f"warmup_ratio={ratio}: TRL takes it of max_steps, which is not set; set optim.warmup_steps")
    notes += _dataset(values.pop("dataset_name", None), values.pop("reward_funcs", None), tree)
    length = values.pop("max_prompt_length", None)
    if length:
        notes.append(f"max_prompt_length={length}: TRL truncates prompts, rlvr's file tasks drop longer ones "
                     f"(task.<file task>.max_prompt_length={length}); rows passed in Python keep every prompt")
    return values, notes


def _dataset(name: Any, funcs: Any, tree: dict) -> list[str]:
    """TRL's script arguments `dataset_name` (a local file or folder, or a Hub dataset id read through
    the cache: a math task over its `prompt` and `solution` columns) and `reward_funcs` (TRL's
    `accuracy_reward` is that task's verifier; other names are `reward.fn` entries: `trl.rewards:NAME`,
    or `module:name` for `module.name`)."""
    notes = []
    found = bool(name) and (Path(str(name)).expanduser().exists() or is_hub_dataset(name))
    if found:
        for key, value in (("task.name", "math_file"), ("task.math_file.path", str(name)),
                           ("task.math_file.prompt_key", "prompt"), ("task.math_file.answer_key", "solution")):
            _set(tree, key, value)
    elif name:
        notes.append(f"dataset_name={name!r}: no local file or folder and no Hub dataset id (org/name); set "
                     f"task.math_file.path to the data")
    names = [funcs] if isinstance(funcs, str) else list(funcs or [])
    entries = ["task" if n == MATH_REWARD else f"{n.rpartition('.')[0]}:{n.rpartition('.')[2]}" if "." in n
               else f"trl.rewards:{n}" for n in names if found or n != MATH_REWARD]
    if entries and entries != ["task"]:
        _set(tree, "reward.fn", ", ".join(entries))
    if MATH_REWARD in names and not found:
        notes.append(f"reward_funcs: {MATH_REWARD} reads the dataset's solution column, which a recipe's task "
                     f"gives only with a dataset_name")
    return notes


def _set(tree: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def recipe_from_trl(path: str | Path) -> str:
    """The recipe YAML for the TRL arguments in `path`, its notes as comments; checked by loading it."""
    from rlvr.config.load import load_config

    tree, notes = convert(read_trl_args(path))
    load_config(json.loads(json.dumps(tree)))  # a copy: loading may take keys out of the tree
    header = [f"# converted from TRL's GRPOConfig arguments in {Path(path).name} (rlvr config --from-trl)"]
    for note in notes:
        header += textwrap.wrap(note, 96, initial_indent="# not converted: ", subsequent_indent="#   ")
    body = yaml.safe_dump(tree, sort_keys=False) if tree else "{}\n"
    return "\n".join(header) + "\n" + body
