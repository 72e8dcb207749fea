"""The Python API: ``Trainer(model, reward_funcs, train_dataset).train()``, the run `rlvr train` makes.

    from rlvr import Trainer

    rows = [{"prompt": "3 5 2>10:", "target": 10}, ...]
    def hits(prompt, completion, target, **columns): ...
    Trainer(reward_funcs=hits, train_dataset=rows, overrides={"trainer.steps": 60}).train()

`rlvr train` is a thin layer over this class: the same config resolution, run directory, process
settings and loop. Every bad argument raises `ConfigError` with one line naming it and the fix.

- **config**: a `Config`, a recipe path, or None (the defaults), plus `overrides` (a list of
  ``key=value`` strings, as on the command line, or a dict of dotted keys to values).
- **model**: None (the config's `model.path`), a local Hugging Face directory (or ``rlvr:NAME``,
  a packaged checkpoint; ``""`` a fresh tiny model), or a model object (a `transformers`
  model: checkpoints use its ``save_pretrained``) with its `tokenizer`.
- **train_dataset**: None (the config's task), a `Task` (``rlvr.protocols.Task``), rows: a list
  of dicts or a ``datasets.Dataset``, or a name (a JSONL/JSON/Parquet file, a ``datasets`` folder or a
  Hub dataset id through the cache: ``rlvr.tasks.named``), the prompt in column `prompt_key`
  (``rlvr.tasks.dataset.DatasetTask``). Every other column reaches the reward functions as a
  keyword argument. Held out: `eval_dataset` rows, else ``task.heldout_size`` rows (at most a fifth
  of the rows) chosen by a stable hash of the prompt, as the file tasks do. A ``DatasetDict`` trains
  on its ``train`` split and holds out its ``test`` (else ``validation``) split.
- **reward_funcs**: a callable ``fn(prompt, completion, **columns) -> float | dict | None`` or, in
  TRL's convention, ``fn(completions, **kwargs) -> list[float | None]`` (``rlvr.rewards.runner``), a
  ``"file.py:name"`` / ``"module:name"`` string, or a list of them, weighted by `reward_weights`
  (default 1 each); None = the config's ``reward.fn`` (``"a.py:f, 0.2*a.py:g"`` names several),
  else the task's own verifier. Several functions log ``reward/<name>/mean`` each and reward the
  weighted sum.
- **correctness** of a completion (``reward/accuracy``, held-out accuracy) on rows:
  ``correct_fn(prompt, completion, **columns) -> bool`` when given, else the weighted reward
  reaching `correct_threshold` (default: the sum of the positive weights, i.e. every function at
  1.0). A `Task` decides correctness itself.
- **callbacks**: objects with any of ``on_step_begin(step)``, ``on_step_end(step, metrics)``,
  ``on_evaluate(step, metrics)``, ``on_checkpoint(step, path)``, plain callables (called as
  ``on_step_end``), or `transformers.TrainerCallback`s called as TRL calls them (`rlvr.callbacks`); a
  hook returning False stops the run after that step, with a final checkpoint.
- TRL's **args** (a `GRPOConfig` or its dict), **peft_config** (a `peft.LoraConfig`) and
  **processing_class** (the tokenizer) are taken as TRL's `GRPOTrainer` takes them (`rlvr.trl_objects`).
- **run_dir**: default ``<trainer.out_dir>/<name>_s<seed>`` with the recipe's name (or
  ``grpo_countdown`` for the built-in task, ``grpo_dataset`` for rows), never an existing run
  (``-2``, ``-3`` ... are appended); ``resume=True`` (or ``resume=RUN_DIR``) continues `run_dir`
  from its newest checkpoint, with its saved config unless `config` is given. A resume whose config
  differs from the saved one (other than ``trainer.steps``, ``trainer.name``, ``trainer.out_dir``) is refused unless
  ``allow_config_change=True``, which records each change in run.json (``config_changes``).
  A checkpoint loads as data only; ``trust_pickle=True`` loads its pickles as code (docs/security.md).
  One process writes a run at a time: a second `train` of a run another process is writing is
  refused with `RunLocked` naming it (the lock dies with its holder, a kill -9 included).

`train()` applies `trainer.threads` / `trainer.thread_mode` to the process
(`rlvr.runtime.process.configure_for`), runs, and returns the final metrics line. The run directory
holds what a CLI run's does (config.yaml, run.json, metrics.jsonl, samples.jsonl, checkpoints/);
run.json also records the rows' fingerprint and the reward functions' names and weights.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlvr.api_rewards import probe_rows, reward_arguments
from rlvr.callbacks import callback_list, check_call
from rlvr.errors import ConfigError
from rlvr.tracking.resumable import check_code_outside, check_resumable, config_changes

__all__ = ["Trainer", "train"]

HELDOUT_SHARE = 5  # rows without an eval_dataset hold out at most 1/HELDOUT_SHARE of themselves


class Trainer:
    """One RL run over a model, reward functions and a dataset; see the module doc for each argument."""

    def __init__(self, model: Any = None, reward_funcs: Any = None, train_dataset: Any = None, *,
                 eval_dataset: Any = None, config: Any = None, overrides: Any = None, tokenizer: Any = None,
                 reward_weights: Iterable[float] | None = None, prompt_key: str = "prompt",
                 system_prompt: str = "", correct_fn: Callable | None = None,
                 correct_threshold: float | None = None, callbacks: Any = (), run_dir: str | Path | None = None,
                 resume: bool | str | Path = False, allow_config_change: bool = False, trust_pickle: bool = False,
                 command: list[str] | None = None, echo: Callable = print, args: Any = None, peft_config: Any = None,
                 processing_class: Any = None, **unknown: Any):
        from rlvr.trl_objects import (
            bind_callbacks,
            epoch_steps,
            merged,
            peft_overrides,
            processing_tokenizer,
            refuse_unknown,
            trl_overrides,
        )

        refuse_unknown(unknown, train_dataset)
        self.echo, self.command = echo, list(sys.argv if command is None else command)
        self._allow_change = allow_config_change  # what a Ray learner rank rebuilds this trainer with
        self._passed = [name for name, value in (("model", model), ("reward_funcs", reward_funcs), ("train_dataset",
                         train_dataset), ("eval_dataset", eval_dataset)) if value is not None and not (
                         name == "model" and isinstance(value, (str, Path)))]
        self.config_changes: dict[str, tuple[Any, Any]] = {}
        self.resume, self.trust_pickle = bool(resume), bool(trust_pickle) and bool(resume)
        if resume and not isinstance(resume, bool):
            if run_dir is not None and Path(run_dir) != Path(resume):
                raise ConfigError(f"resume: {str(resume)!r} differs from run_dir={str(run_dir)!r}; pass one of them")
            run_dir = resume
        if self.resume:
            from rlvr.tracking.run_files import read_config

            if run_dir is None:
                raise ConfigError("resume=True: no run to continue; pass run_dir=RUN_DIR (or resume=RUN_DIR)")
            if not (Path(run_dir) / "config.yaml").is_file():
                raise ConfigError(f"resume: '{run_dir}' is not a run directory (no config.yaml)")
            read_config(Path(run_dir))  # an emptied or edited config.yaml is refused, not read as the defaults
            config = Path(run_dir) / "config.yaml" if config is None else config
        overrides = _override_list(overrides)
        trl, notes, epochs = trl_overrides(args)
        trl += peft_overrides(peft_config)
        tokenizer = processing_tokenizer(processing_class, tokenizer, model)
        self._model, self._tokenizer = _model_argument(model, tokenizer, overrides)
        self.config, recipe = _load(config, merged(trl, overrides))  # the caller's overrides win over TRL's args
        if self.resume and reward_funcs is None:  # before any reward file is imported
            check_code_outside(Path(run_dir), self.config.reward.fn)
        if not isinstance(prompt_key, str) or not prompt_key:
            raise ConfigError(f"prompt_key: expected a column name, got {prompt_key!r}")
        self.task, self.rows, self.heldout_rows = _dataset_arguments(train_dataset, eval_dataset, prompt_key)
        if self.rows is not None and self.heldout_rows is None and len(self.rows) < HELDOUT_SHARE:
            raise ConfigError(f"train_dataset: {len(self.rows)} rows hold out none (at most a fifth); pass "
                              f"eval_dataset=... or at least {HELDOUT_SHARE} rows")
        if epochs is not None and self.rows is not None:  # TRL's epochs over the rows: trainer.steps
            trl.append(epoch_steps(epochs, len(self.rows), self.config.rollout.prompts_per_step))
            self.config = _load(config, merged(trl, overrides))[0]
        elif epochs is not None:
            notes.append(f"num_train_epochs={epochs:g}: a task has no epochs; set max_steps")
        for note in notes:
            echo(f"note: args: {note}")
        self._prompt_options(prompt_key, system_prompt, correct_fn, correct_threshold)
        self.reward_funcs, self.reward_weights = reward_arguments(self.config, self.rows, reward_funcs, reward_weights)
        self.reward_lines = probe_rows(self.reward_funcs, self.reward_weights, self.rows, prompt_key,
                                       self.config.trainer.steps)
        self.callbacks = callback_list(callbacks)
        if self.resume:
            check_resumable(Path(run_dir), rows=self.rows is not None, task=self.task is not None)
            self.config_changes = config_changes(Path(run_dir), self.config, allowed=allow_config_change)
        self.correct_fn, self.prompt_key, self.system_prompt = correct_fn, prompt_key, system_prompt
        positive = sum(w for w in self.reward_weights if w > 0) if self.reward_weights else 1.0
        self.correct_threshold = positive if correct_threshold is None else float(correct_threshold)
        from rlvr.builder.run import default_run_dir, unused

        self._default_dir = default_run_dir(self.config, self._stem(recipe)) if run_dir is None else None
        self.run_dir = unused(self._default_dir) if run_dir is None else Path(run_dir)
        self._check_run_dir()
        bind_callbacks(self.callbacks, args, self.config, self.run_dir, rows=self.rows, model=self._model,
                       tokenizer=self._tokenizer)

    def _check_run_dir(self) -> None:
        if not self.resume and (self.run_dir / "config.yaml").exists():
            raise ConfigError(f"run_dir: '{self.run_dir}' already holds a run; pass resume=True to continue it "
                              f"or choose another directory")

    # ------------------------------------------------------------------------------ arguments

    def _prompt_options(self, prompt_key, system_prompt, correct_fn, correct_threshold) -> None:
        if correct_fn is not None and not callable(correct_fn):
            raise ConfigError(f"correct_fn: expected a callable (prompt, completion, **columns) -> bool, "
                              f"got {type(correct_fn).__name__}")
        if correct_fn is not None and self.rows:  # called as (prompt, completion, **the row's other columns)
            columns = {str(k): None for k in self.rows[0] if k not in (prompt_key, "prompt")}
            check_call(correct_fn, ("prompt", "completion"), "correct_fn", columns)
        if self.rows is None:
            given = [name for name, value, default in (("prompt_key", prompt_key, "prompt"),
                                                        ("system_prompt", system_prompt, ""),
                                                        ("correct_fn", correct_fn, None),
                                                        ("correct_threshold", correct_threshold, None))
                     if value != default]
            if given:
                raise ConfigError(f"{given[0]}: applies to rows passed as train_dataset; a task builds its own "
                                  f"prompts and decides correctness itself")

    def _stem(self, recipe: str | None) -> str:
        if recipe:
            return Path(recipe).stem
        if self.rows is not None:
            return "grpo_dataset"
        return f"grpo_{getattr(self.task, 'name', 'task')}" if self.task is not None else "grpo_countdown"

    # ------------------------------------------------------------------------------ the run

    def train(self) -> dict:
        """Apply the process settings, run (or resume) the loop, return the final metrics line;
        with `trainer.ray_learners` on Ray actors, each one rank (`train_here`)."""
        try:
            return self._train_on_ray() if self.config.trainer.ray_learners else self.train_here()
        finally:
            for cb in self.callbacks:  # TrainerCallbacks' on_train_end, as TRL calls it
                getattr(cb, "finish", lambda: None)()

    def _train_on_ray(self) -> dict:
        """Each Ray learner rank rebuilds this trainer from its config and trains as one rank
        (`train_here`); rank 0's final line (a failure: one line)."""
        from rlvr.backends.ray_learners import train_ranks

        if self._passed:  # objects a file or this process defines do not travel to Ray's processes
            raise ConfigError(f"{self._passed[0]}: trainer.ray_learners builds each rank from the config alone; "
                              "name it in the config (model.path, reward.fn, task) or start the ranks with torchrun")
        final, run_dir = train_ranks(functools.partial(
            type(self), config=self.config, run_dir=self.run_dir, resume=self.resume,
            allow_config_change=self._allow_change, trust_pickle=self.trust_pickle, command=self.command,
            callbacks=self.callbacks), self.config)
        self.run_dir = Path(run_dir)
        self.echo(done_line(final, self.run_dir))
        return final

    def train_here(self) -> dict:
        """`train` in this process (one rank of data-parallel learners under torchrun or Ray)."""
        from rlvr.builder.run import opened, train
        from rlvr.runtime.process import configure_for

        runtime = configure_for(self.config)  # first: data-parallel learners join each other here (torchrun)
        if runtime.shard.rank > 0:
            return self._follow(runtime)
        where = self._default_dir if self._default_dir is not None else self.run_dir
        # a default name is chosen and made in one step: another run may take it now
        with opened(where, resume=self.resume, claim=self._default_dir is not None, new=not self.resume) as run:
            self.run_dir = run.path
            runtime.shard.broadcast(str(run.path))  # where the other learners' checkpoints are
            done = self._finished(run)
            if done is not None:
                return done
            with _quiet_transformers():
                objects, provenance = self._objects()
                self.echo(f"run directory: {run.path}")
                for line in self._start_lines():
                    self.echo(line)
                final = train(self.config, run, command=self.command, resume=self.resume, echo=self.echo,
                              runtime=runtime, callbacks=self.callbacks, provenance=provenance,
                              config_changes=self.config_changes, trust_pickle=self.trust_pickle, **objects)
        self.echo(done_line(final, run.path))
        return final

    def _start_lines(self) -> list[str]:
        """What accuracy counts, and what each reward function returned on a row (its probe)."""
        from rlvr.api_rewards import watch_accuracy
        from rlvr.rewards.probe import accuracy_meaning
        from rlvr.rewards.runner import RewardSum

        names = RewardSum(self.reward_funcs, self.reward_weights).names if self.rows is not None else []
        self.callbacks = watch_accuracy(self.callbacks, self.rows is not None and self.correct_fn is None,
                                        self.correct_threshold, self.config.trainer.steps, self.echo)
        return [accuracy_meaning(names, self.reward_weights, self.correct_threshold, self.correct_fn,
                                 self.task if self.rows is None else None), *self.reward_lines]

    def _finished(self, run) -> dict | None:
        """A resumed run with no steps left: its final line (said in one line), else None."""
        if not self.resume:
            return None
        from rlvr.trainer.checkpoint import checkpoint_step, latest_checkpoint
        from rlvr.trainer.loop import nothing_left_message

        newest = latest_checkpoint(self.run_dir / "checkpoints")
        if newest is None or checkpoint_step(newest) < self.config.trainer.steps:
            return None
        self.echo(nothing_left_message(self.run_dir, checkpoint_step(newest), self.config.trainer.steps))
        return run.read_json("run.json").get("final") or {"step": checkpoint_step(newest)}

    def _follow(self, runtime) -> dict:
        """Rank > 0 of data-parallel learners: train beside rank 0, which alone writes the run. Its
        own run directory is a scratch one (removed at the end) whose `checkpoints` is rank 0's."""
        import shutil
        import tempfile

        from rlvr.builder.run import train
        from rlvr.tracking.run_dir import RunDir

        self.run_dir = Path(runtime.shard.broadcast(None))
        self.echo = _silent
        done = self._finished(RunDir(self.run_dir))
        if done is not None:
            return done
        scratch = Path(tempfile.mkdtemp(prefix=f"rlvr-rank{runtime.shard.rank}-"))
        (scratch / "checkpoints").symlink_to((self.run_dir / "checkpoints").resolve())
        if self.resume:  # what a resume reads of its run besides the checkpoints
            shutil.copy2(self.run_dir / "run.json", scratch / "run.json")
        try:
            with _quiet_transformers():
                objects, provenance = self._objects()
                return train(self.config, RunDir(scratch), command=self.command, resume=self.resume,
                             echo=_silent, runtime=runtime, callbacks=self.callbacks, provenance=provenance,
                             config_changes=self.config_changes, trust_pickle=self.trust_pickle, **objects)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _objects(self) -> tuple[dict, dict]:
        """What `rlvr.builder.run.train` gets instead of building it from the config, and the
        run.json entries that describe it."""
        from rlvr.rewards.forms import TASK_VERIFIER, with_task
        from rlvr.rewards.runner import RewardSum

        objects, provenance = {}, {}
        model, tokenizer = self._model, self._tokenizer
        if model is None and self.rows is not None:  # the prompts need the tokenizer (chat template)
            from rlvr.builder.build import base_model

            model, tokenizer = base_model(self.config)  # build_components puts it on the device, adds adapters
        if model is not None:
            objects.update(model=model, tokenizer=tokenizer)
        fns = self.reward_funcs
        if TASK_VERIFIER in fns and self.task is not None:
            fns = with_task(fns, self.task)
        if fns:
            r = self.config.reward
            reward = RewardSum(fns, self.reward_weights, columns=self.rows is not None, timeout_s=r.timeout_s,
                               workers=r.workers, memory_mb=r.worker_memory_mb)
            if TASK_VERIFIER not in fns:  # else the builder binds the config's task, once it is built
                objects["reward"] = reward
            provenance["reward_funcs"] = [
                {"name": name, "weight": weight,
                 "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"}
                for name, weight, fn in zip(reward.names, self.reward_weights, fns)]
        if self.rows is not None:
            from rlvr.tasks.dataset import DatasetTask

            size = min(self.config.task.heldout_size, len(self.rows) // HELDOUT_SHARE)
            task = DatasetTask(self.rows, reward=objects["reward"], prompt_key=self.prompt_key,
                               heldout_rows=self.heldout_rows, heldout_size=size, tokenizer=tokenizer,
                               system_prompt=self.system_prompt, correct_fn=self.correct_fn,
                               correct_threshold=self.correct_threshold, seed=self.config.seed)
            objects["task"] = task
            provenance["train_dataset"] = {
                "rows": len(self.rows),
                "train_rows": len(self.rows) - (0 if self.heldout_rows else len(task.heldout())),
                "heldout_rows": len(task.heldout()), "prompt_key": self.prompt_key,
                "eval_dataset": self.heldout_rows is not None, "sha256": task.fingerprint()}
        elif self.task is not None:
            objects["task"] = self.task
            provenance["task"] = {"class": f"{type(self.task).__module__}.{type(self.task).__qualname__}"}
        return objects, provenance


def _silent(*args, **kwargs) -> None:
    """The echo of learners other than rank 0: rank 0 speaks for the run."""


def train(model: Any = None, reward_funcs: Any = None, train_dataset: Any = None, **kwargs) -> dict:
    """``Trainer(model, reward_funcs, train_dataset, **kwargs).train()``: the final metrics line."""
    return Trainer(model, reward_funcs, train_dataset, **kwargs).train()


# ---------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _quiet_transformers():
    """No "Loading weights" / "Writing model shards" bars while a run prints its own lines
    (restored afterwards: the caller's process keeps its setting)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _override_list(overrides: Any) -> list[str]:
    """`key=value` strings from a list of them or a dict of dotted keys (values JSON-encoded, which
    YAML reads back as the same value: "3" stays a string, 3 an int)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        stack = list(overrides.items())
        while stack:  # a callable would be written as its repr; say what to do with it instead
            key, value = stack.pop()
            if callable(value):
                raise ConfigError(_callable_in_config(str(key)))
            if isinstance(value, Mapping):
                stack += [(f"{key}.{k}", v) for k, v in value.items()]
        return [f"{key}={json.dumps(value, default=str)}" for key, value in overrides.items()]
    if isinstance(overrides, str) or not all(isinstance(item, str) for item in overrides):
        raise ConfigError(f"overrides: expected a list of 'key=value' strings or a dict, got {overrides!r}")
    return list(overrides)


def _callable_in_config(key: str) -> str:
    fix = "pass it as reward_funcs=fn (or name it as 'file.py:name')" if key.startswith("reward") else \
        "config values are plain data (numbers, strings, lists)"
    return f"{key}: a Python callable cannot go in the config; {fix}"


def _load(config: Any, overrides: list[str]):
    """(Config, recipe path or None) from a Config, a recipe path or None, plus overrides."""
    from rlvr.config import Config, load_config, to_dict

    if config is None or isinstance(config, (str, Path)):
        return load_config(config, overrides), (str(config) if config is not None else None)
    if isinstance(config, Config):  # checked like a recipe: a Config built by hand skips no check
        return load_config(to_dict(config), overrides), None
    raise ConfigError(f"config: expected a Config, a recipe path or None, got {type(config).__name__}")


def _model_argument(model: Any, tokenizer: Any, overrides: list[str]) -> tuple[Any, Any]:
    """(model object, tokenizer) or (None, None) with a path turned into a `model.path` override."""
    if model is None or isinstance(model, (str, Path)):
        if tokenizer is not None:
            raise ConfigError("tokenizer: only used with a model object; a model directory brings its own")
        if model is not None:
            overrides.append(f"model.path={json.dumps(str(model))}")
        return None, None
    if not hasattr(model, "parameters"):
        raise ConfigError(f"model: expected a model directory or a torch model, got {type(model).__name__}")
    if not hasattr(model, "save_pretrained"):
        raise ConfigError("model: checkpoints need save_pretrained; pass a transformers model (or its directory)")
    if tokenizer is None:
        raise ConfigError("tokenizer: a model object needs its tokenizer; pass tokenizer=...")
    tokenizer.padding_side = "left"  # prompts end where completions start (as loaded models are set up)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _is_task(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("sample", "heldout", "is_correct"))


def _dataset_arguments(train_dataset: Any, eval_dataset: Any, prompt_key: str):
    """(task, rows, held-out rows): a Task object, or rows (with optional held-out rows)."""
    from rlvr.tasks.dataset import dataset_rows, dataset_splits
    from rlvr.tasks.named import named_dataset

    if isinstance(train_dataset, (str, Path)):  # a file, a datasets folder or a Hub id, as TRL's dataset_name
        train_dataset = named_dataset(train_dataset)
    if isinstance(eval_dataset, (str, Path)):
        eval_dataset = named_dataset(eval_dataset, "eval_dataset")
    train_dataset, eval_dataset, _ = dataset_splits(train_dataset, eval_dataset)
    if all(callable(getattr(train_dataset, name, None)) for name in ("reset", "step")) and not _is_task(train_dataset):
        raise ConfigError(f"train_dataset: {getattr(train_dataset, '__name__', type(train_dataset).__name__)} is an "
                          f"environment (reset/step), not a task; wrap it: class MyTask(rlvr.agents.task.AgentTask): "
                          f"env_class = YourEnv, then pass MyTask() (docs/custom-environment.md)")
    if train_dataset is None or _is_task(train_dataset):
        if eval_dataset is not None:
            raise ConfigError("eval_dataset: a task brings its own held-out set (heldout()); pass rows as "
                              "train_dataset to evaluate on eval_dataset")
        return train_dataset, None, None
    heldout = dataset_rows(eval_dataset, "eval_dataset", prompt_key) if eval_dataset is not None else None
    return None, dataset_rows(train_dataset, "train_dataset", prompt_key), heldout


def done_line(final: dict, path) -> str:
    """The line a finished run ends with."""
    accuracy = final.get("eval/heldout_accuracy", math.nan)
    return f"done: step {final.get('step')} held-out accuracy {accuracy:.3f} -> {path}"
