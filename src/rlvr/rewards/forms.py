"""The call forms of a reward function, told apart by its signature (``rlvr.rewards.runner`` calls them).

- per-sample (rlvr's): ``fn(prompt, completion, **columns) -> float | dict | None``
- batched: ``fn(prompts, completions, **columns) -> list`` marked ``fn.batched = True`` (``@batched``)
- TRL's: ``fn(completions, **kwargs) -> list[float | None]``, a ``completions`` parameter and no mark
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["COMPLETION_IDS", "ROW_COLUMNS", "TASK_VERIFIER", "TrainerState", "batched", "reward_form", "reward_values",
           "with_task"]

SAMPLE_FORM = "fn(prompt, completion, **columns) -> float | None"
TRL_FORM = ("fn(completions, **kwargs) -> list[float | None] (prompts, completion_ids, columns, trainer_state "
            "as keywords)")

COMPLETION_IDS = "completion_ids"
"""The example key under which the scorer hands each completion's token ids to the reward runner; only
TRL-form functions get it (as ``completion_ids``), so it is never taken for a dataset column (TRL too
keeps a ``completion_ids`` column out of the keywords)."""

ROW_COLUMNS = "row"
"""The ``Example.meta`` key under which a file task keeps the row it read: TRL-form functions get each of
its columns as a keyword (``solution=[...]``), as TRL passes every dataset column."""
NOT_COLUMNS = ("prompt", "completion", COMPLETION_IDS)  # TRL keeps these out of the keywords too


def trl_columns(example: dict) -> dict:
    """`example` (an ``Example``'s fields) with its row's columns beside them, for a TRL-form call.

    >>> trl_columns({"answer": "2", "meta": {ROW_COLUMNS: {"prompt": "1+1", "solution": "2"}}})["solution"]
    '2'
    """
    meta = example.get("meta")
    row = meta.get(ROW_COLUMNS) if isinstance(meta, dict) else None
    if not isinstance(row, dict):
        return example
    return {**example, **{k: v for k, v in row.items() if k not in NOT_COLUMNS}}


@dataclass
class TrainerState:
    """What TRL-form reward functions get as ``trainer_state``: optimizer steps done, and the run's total."""

    global_step: int = 0
    max_steps: int = 0


def reward_values(values: Any) -> list:
    """A batched or TRL-form call's result as a list of one value per completion. A list or tuple stays as
    it is; a 1-D torch tensor or numpy array (TRL reads it as a list of floats) becomes Python numbers, as
    do 0-d tensors and numpy scalars in a list; anything else (one number, a 2-D array) is a `TypeError`
    ("returned ...") naming its type and shape. Duck-typed (`tolist`, `shape`): this package imports
    neither torch nor numpy.

    >>> class Row:  # a stand-in for a 1-D tensor
    ...     shape = (2,)
    ...     def tolist(self): return [0.5, 1.0]
    >>> reward_values(Row()), reward_values((1, None))
    ([0.5, 1.0], [1, None])
    """
    shape = getattr(values, "shape", None)
    if callable(getattr(values, "tolist", None)) and isinstance(shape, tuple):
        if len(shape) != 1:
            raise TypeError(f"returned a {len(shape)}-D {type(values).__name__} of shape {tuple(shape)}")
        return values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"returned {type(values).__name__}")
    return [v.item() if callable(getattr(v, "item", None)) and getattr(v, "shape", None) == () else v
            for v in values]


def reward_form(fn: Callable, where: str = "reward.fn") -> str:
    """``"batched"``, ``"trl"`` or ``"sample"``: how `fn` is called, from its ``batched`` mark and
    its signature; a signature that fits no form raises `ConfigError` naming both conventions.

    >>> reward_form(lambda completions, **kwargs: [1.0] * len(completions))
    'trl'
    >>> reward_form(lambda prompt, completion, **columns: 1.0)
    'sample'
    """
    if getattr(fn, "batched", False):
        return "batched"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or extension callable: cannot tell, called per sample
        return "sample"
    if "completions" in signature.parameters:
        return "trl"
    try:
        signature.bind_partial("prompt", "completion")  # the rest may be columns, passed by name
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise ConfigError(f"{where}: {name}{signature} fits neither reward convention; write rlvr's "
                          f"{SAMPLE_FORM} or TRL's {TRL_FORM}") from None
    return "sample"


def batched(fn: Callable) -> Callable:
    """Mark ``fn`` as taking lists: ``fn(prompts, completions, **columns) -> list``."""
    fn.batched = True
    return fn


class _TaskVerifier:
    """`task` in `reward.fn` ("my.py:shaping, task"): the task's own verifier, bound by `with_task`."""

    __name__ = "task"

    def __call__(self, prompt, completion, **example):
        raise RuntimeError("reward.fn's 'task' is bound to a task by with_task before it is called")

    def __repr__(self) -> str:
        return "task"


TASK_VERIFIER = _TaskVerifier()


def with_task(fns, task) -> list[Callable]:
    """`fns` with `TASK_VERIFIER` replaced by `task`'s verifier (its batched form when it has one),
    named `task` (metrics `reward/task/...`)."""
    batch = getattr(task, "reward_batch", None)
    if batch is not None:
        def verifier(prompts, completions, **columns):
            return batch(prompts, completions, **columns)
        verifier.batched = True
    else:
        def verifier(prompt, completion, **example):
            return task.reward(prompt, completion, **example)
    verifier.__name__ = verifier.__qualname__ = "task"
    verifier.in_process = getattr(task, "in_process", False)  # its grader keeps threads of its own
    return [verifier if fn is TASK_VERIFIER else fn for fn in fns]
