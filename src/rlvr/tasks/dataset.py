"""In-memory datasets as a task: rows (dicts) scored by user reward functions.

``DatasetTask(rows, reward=...)`` is what ``rlvr.Trainer(train_dataset=[...])`` builds: a list of
dicts, a ``datasets.Dataset`` or any iterable of mappings. It shares the file tasks' row
handling (``rlvr.tasks.files.FileTask``):

- **Prompt.** The ``prompt_key`` column (default ``prompt``). A string goes through the same
  steps as a file task's prompt: the optional ``system_prompt``, and the tokenizer's chat template
  when it has one. A list of ``{"role", "content"}`` messages (the conversational format) goes
  through the chat template, which the tokenizer then must have.
- **Columns.** Every other column rides in ``Example.meta`` and reaches each reward function as a
  keyword argument: the row ``{"prompt": ..., "target": 7}`` is scored as
  ``fn(prompt, completion, target=7)`` (``rlvr.rewards.runner.RewardSum(columns=True)``). A TRL-form
  function (``fn(completions, **kwargs)``) gets the columns as lists, and a row's chat messages as
  its ``prompts``.
- **Split.** ``heldout_rows`` (an ``eval_dataset``) are the held-out set; without them the
  ``heldout_size`` rows whose prompts hash lowest are held out, as in the file tasks. A
  ``datasets.DatasetDict`` (or a dict of row lists) passed as the training data trains on its
  ``train`` split and holds out its ``test`` split (else ``validation``) unless an
  ``eval_dataset`` is given (``dataset_splits``).
- **Correctness** (``reward/accuracy``, held-out accuracy): ``correct_fn(prompt, completion,
  **columns)`` when given, else the weighted reward reaching ``correct_threshold`` (by default the
  sum of the weights: every function at 1.0, the usual "right answer" value). ``correct_fn``
  answers True or False (1 and 0 pass too); anything else, a score of 0.5 say, is an error rather
  than "truthy, so correct".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlvr.errors import ConfigError
from rlvr.tasks.files import FileTask
from rlvr.tasks.messages import message_problem
from rlvr.types import Example

__all__ = ["DatasetTask", "dataset_rows", "dataset_splits"]

HELDOUT_SPLITS = ("test", "validation")  # a DatasetDict's split held out, in this order of preference


def _is_split_dict(data: Any) -> bool:
    return isinstance(data, Mapping) and bool(data) and all(
        isinstance(v, Iterable) and not isinstance(v, (str, bytes, Mapping)) for v in data.values())


def dataset_splits(data: Any, eval_data: Any = None, argument: str = "train_dataset") -> tuple[Any, Any, str]:
    """(training data, held-out data or None, where each came from) for what a user passes: a
    DatasetDict trains on its `train` split and holds out `eval_data` if given, else its `test`
    (or `validation`) split; anything else passes through unchanged."""
    if not _is_split_dict(data):
        return data, eval_data, argument
    if "train" not in data:
        raise ConfigError(f"{argument}: a DatasetDict without a 'train' split (splits: {', '.join(map(str, data))}); "
                          f"pass the split to train on, e.g. {argument}=dataset['{next(iter(data))}']")
    if eval_data is not None:
        return data["train"], eval_data, f"{argument}['train']"
    held = next((name for name in HELDOUT_SPLITS if name in data), None)
    return data["train"], (data[held] if held else None), f"{argument}['train']" + (
        f", held out: {argument}[{held!r}]" if held else "")


def _verdict(value: Any) -> bool:
    """`correct_fn`'s answer as a bool: True/False (or 1/0); a score or None is an error."""
    try:
        ok = not isinstance(value, (str, bytes)) and value is not None and bool(value in (0, 1))
    except (TypeError, ValueError):  # an array of several values
        ok = False
    if not ok:
        raise ConfigError(f"correct_fn: returned {str(value)[:40]!r}, not True or False; return whether the "
                          f"completion is correct (a graded score belongs in reward_funcs, and correct_threshold "
                          f"sets which reward counts as correct when correct_fn is not given)")
    return bool(value)


def dataset_rows(data: Any, argument: str, prompt_key: str = "prompt") -> list[dict]:
    """The rows of a list of dicts, a `datasets.Dataset` or any iterable of mappings, as dicts,
    each checked for its prompt column (before any model is loaded).

    `argument` names the caller's parameter in error messages."""
    if isinstance(data, Mapping):  # a DatasetDict, or one row passed alone
        keys = ", ".join(map(str, list(data)[:5]))
        raise ConfigError(f"{argument}: got a mapping (keys {keys}); pass a list of rows, or one split "
                          f"of a DatasetDict, e.g. dataset['train']")
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ConfigError(f"{argument}: expected a list of dicts or a datasets.Dataset, got {type(data).__name__}")
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{argument}[{i}]: expected a dict of columns, got {type(row).__name__}")
        if prompt_key not in row:
            raise ConfigError(f"{argument}[{i}]: field {prompt_key!r} missing "
                              f"(row has {', '.join(sorted(map(str, row)))}); "
                              f"set prompt_key to the right field name")
        if not isinstance(row[prompt_key], (str, list)):
            raise ConfigError(f"{argument}[{i}]: field {prompt_key!r} must be a string or a list of chat messages, "
                              f"got {type(row[prompt_key]).__name__}")
        problem = message_problem(row[prompt_key]) if isinstance(row[prompt_key], list) else None
        if problem:  # checked as sft.data's conversations are: the chat template would render anything
            raise ConfigError(f"{argument}[{i}]: field {prompt_key!r}: {problem}; pass a list of {{\"role\": ..., "
                              f"\"content\": \"...\"}} messages, e.g. [{{\"role\": \"user\", \"content\": \"2+2?\"}}]")
        rows.append(dict(row))
    if not rows:
        raise ConfigError(f"{argument}: no rows")
    return rows


class DatasetTask(FileTask):
    """Rows held in memory, scored by `reward` (a `RewardSum` over the rows' columns)."""

    name = "dataset"

    def __init__(self, rows: list[dict], *, reward: Callable, prompt_key: str = "prompt",
                 heldout_rows: list[dict] | None = None, heldout_size: int = 0, tokenizer: Any = None,
                 system_prompt: str = "", correct_fn: Callable | None = None,
                 correct_threshold: float = 1.0, seed: int = 0):
        self.reward_sum, self.correct_fn, self.correct_threshold = reward, correct_fn, correct_threshold
        self._setup(prompt_key=prompt_key, system_prompt=system_prompt, prompt_template="{prompt}",
                    max_prompt_length=0, tokenizer=tokenizer, seed=seed)
        examples = self._examples([(row, f"train_dataset[{i}]") for i, row in enumerate(rows)])
        heldout = None
        if heldout_rows is not None:
            heldout = self._examples([(row, f"eval_dataset[{i}]") for i, row in enumerate(heldout_rows)])
        self._split(examples, heldout, heldout_size, "train_dataset")

    def _row_to_example(self, row: dict, where: str) -> Example:
        text = self._field(row, self.prompt_key, where, (str, list), "prompt_key")
        columns = {k: v for k, v in row.items() if k != self.prompt_key}
        if isinstance(text, list):  # chat messages: TRL-form reward functions get them as `prompts`
            columns["prompt"] = list(text)
        answer = columns.get("answer")
        return Example(self._prompt(text, where), "" if answer is None else str(answer), columns)

    def _prompt(self, text: str | list, where: str) -> str:
        if isinstance(text, str):
            return self.format_prompt(text)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"{where}: field {self.prompt_key!r} holds chat messages, but the tokenizer has no "
                              f"chat template; pass prompts as strings or use a chat model")
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + list(text)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def reward(self, prompt: str, completion: str, /, **example) -> float | None:
        """The weighted reward of one completion (None when some weighted function could not score it)."""
        value = self.reward_sum.score_one(prompt, completion, example.get("meta") or {})
        return None if math.isnan(value) else value

    def is_correct(self, completion: str, example: Example) -> bool:
        if self.correct_fn is not None:
            columns = {k: v for k, v in example.meta.items() if k != "prompt"}
            return _verdict(self.correct_fn(example.prompt, completion, **columns))
        value = self.reward_sum.score_one(example.prompt, completion, example.meta)
        return not math.isnan(value) and value >= self.correct_threshold

    def fingerprint(self) -> str:
        """sha256 of the training and held-out rows (prompt and columns), for the run manifest."""
        import hashlib

        def row(ex: Example) -> list:  # the rendered prompt stands for its messages
            return [ex.prompt, {k: v for k, v in ex.meta.items() if k != "prompt"}]

        rows = [row(ex) for ex in self._train] + [None] + [row(ex) for ex in self._heldout]
        return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
