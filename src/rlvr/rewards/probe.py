"""Each reward function called once, on one real row, before a run loads its model.

A mistake that would otherwise surface at step 1, after the model has loaded and the warm-start
evaluation has run, is a one-line `ConfigError` here, with the fix for the convention the function
is written in (`rlvr.rewards.forms`): a column the rows lack, a TRL-form function that returns one
number or a list of the wrong length, a per-sample function that returns a list, a value of the
wrong type. An exception the function raises on the probe's completions is not refused (the empty
completion may be what it cannot score); it is said as a note. `probe_rewards` returns one line per
function (its form, the columns it reads, what it returned) for the run's first lines.

The probe completions are ``""`` and ``"0"``: what any completion may be, not a correct answer
(TRL-form functions get empty ``completion_ids``: no tokenizer is loaded yet). The calls are real:
a function that records its calls sees these two first.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from rlvr.errors import ConfigError
from rlvr.rewards.forms import COMPLETION_IDS, TrainerState, reward_form, reward_values

__all__ = ["accuracy_meaning", "probe_rewards"]

PROBE = ["", "0"]
PROBE_TIMEOUT_S = 30.0
# What a form's call passes besides the columns (a per-sample or batched function's first two
# parameters, whatever their names, take the prompt(s) and completion(s))
OWN = {"trl": {"completions", "prompts", COMPLETION_IDS, "trainer_state"}, "sample": set(), "batched": set()}
FIX = {"trl": "TRL's convention returns one value per completion: return [score(c) for c in completions] "
              "(or a 1-D tensor or array)",
       "sample": "rlvr's per-sample convention returns one number (or None) per call; to score a batch, "
                 "take `completions` and return a list (TRL's convention)",
       "batched": "a batched function returns a list with one value per completion"}


def _reads(fn: Callable, form: str) -> tuple[list[str], bool]:
    """(the columns `fn` names, whether it takes any others through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return [], True
    positional = [] if form == "trl" else [n for n, p in params.items()
                                           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
    named = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
             and name not in OWN[form] and name not in positional and p.default is p.empty]
    return named, any(p.kind is p.VAR_KEYWORD for p in params.values())


def _call(fn: Callable, form: str, prompt: Any, columns: dict, steps: int) -> Any:
    if form == "trl":
        completions = ([[{"role": "assistant", "content": c}] for c in PROBE] if isinstance(prompt, list)
                       else list(PROBE))
        kwargs = {**{k: [v] * len(PROBE) for k, v in columns.items()}, "prompts": [prompt] * len(PROBE),
                  "trainer_state": TrainerState(0, steps), COMPLETION_IDS: [[] for _ in PROBE]}  # no tokenizer yet
        if not _reads(fn, form)[1]:
            params = inspect.signature(fn).parameters
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return fn(completions=completions, **kwargs)
    if form == "batched":
        return fn([prompt] * len(PROBE), list(PROBE), **{k: [v] * len(PROBE) for k, v in columns.items()})
    return [fn(prompt, c, **columns) for c in PROBE]


def _value_ok(value: Any) -> bool:
    if isinstance(value, dict):
        value = value.get("reward", "missing")
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def _check(where: str, name: str, form: str, values: Any) -> str:
    """What the call returned, or a ConfigError with the fix for `form`."""
    if form != "sample":
        try:
            values = reward_values(values)  # a 1-D tensor or array is read as TRL reads it
        except TypeError as err:
            raise ConfigError(f"{where}: {name} {err} for {len(PROBE)} completions; {FIX[form]}") from None
    if form != "sample" and len(values) != len(PROBE):
        raise ConfigError(f"{where}: {name} returned {len(values)} values for {len(PROBE)} completions; {FIX[form]}")
    bad = next((v for v in values if not _value_ok(v)), None)
    if bad is not None:
        fix = FIX["sample"] if form == "sample" and isinstance(bad, (list, tuple)) else (
            "return a number, None (not scorable) or a dict with a 'reward' key")
        raise ConfigError(f"{where}: {name} returned {type(bad).__name__} ({str(bad)[:40]}) for a completion; {fix}")
    return ", ".join("None" if v is None else f"{(v.get('reward') if isinstance(v, dict) else v)!r}" for v in values)


def probe_rewards(fns: Sequence[Callable], names: Sequence[str], row: dict, prompt_key: str,
                  steps: int = 0) -> list[str]:
    """One line per function; `ConfigError` naming the function and the fix when its call cannot work
    on the rows (`row` is one of them, `prompt_key` its prompt column; `steps` the run's, for TRL's
    ``trainer_state``, whose ``global_step`` is 0 as at the first step)."""
    columns = {k: v for k, v in row.items() if k != prompt_key}
    prompt = row[prompt_key]
    lines = []
    for i, (fn, name) in enumerate(zip(fns, names)):
        where = "reward_funcs" if len(fns) == 1 else f"reward_funcs[{i}]"
        form = reward_form(fn, where)
        reads, others = _reads(fn, form)
        missing = [c for c in reads if c not in columns]
        if missing:
            raise ConfigError(f"{where}: {name} reads column {missing[0]!r}, which the rows lack (their columns: "
                              f"{', '.join(sorted(columns)) or 'none besides ' + repr(prompt_key)}); rename the "
                              f"parameter or add the column")
        with ThreadPoolExecutor(1) as pool:  # a function that hangs is the run's deadlines' business, not the probe's
            future = pool.submit(_call, fn, form, prompt, columns, steps)
            try:
                values, error = future.result(timeout=PROBE_TIMEOUT_S), None
            except FutureTimeout:
                values, error = None, f"took over {PROBE_TIMEOUT_S:g}s"
            except KeyError as err:  # columns read from **kwargs by name
                raise ConfigError(f"{where}: {name} reads {err.args[0]!r}, which the rows lack (their columns: "
                                  f"{', '.join(sorted(columns))}); rename the key or add the column") from None
            except TypeError as err:
                if f"{getattr(fn, '__name__', '?')}() " in str(err) and "argument" in str(err):  # the call itself
                    raise ConfigError(f"{where}: {name} cannot be called as {form} reward: {err}") from None
                values, error = None, f"TypeError: {err}"
            except Exception as err:  # noqa: BLE001 - the probe's completions may be unscorable; said, not fatal
                values, error = None, f"{type(err).__name__}: {str(err)[:80]}"
        what = f"{form} form, reads {', '.join(reads) or 'no column by name'}" + (" and **kwargs" if others else "")
        got = f"raised on the probe completions ({error}): check it scores any text" if error else \
            f"returned {_check(where, name, form, values)} for completions {PROBE!r}"
        lines.append(f"reward {name}: {what}; {got}")
    return lines


def accuracy_meaning(names: Sequence[str], weights: Sequence[float], threshold: float, correct_fn: Any,
                     task: Any) -> str:
    """What `reward/accuracy` and held-out accuracy count, in one line."""
    if task is not None or not names:
        label = getattr(task, "name", None) or "the task"
        return f"accuracy: a completion is correct when {label}'s own verifier says so"
    if correct_fn is not None:
        return f"accuracy: a completion is correct when correct_fn ({getattr(correct_fn, '__name__', 'given')}) says so"
    terms = " + ".join(f"{w:g}*{n}" for n, w in zip(names, weights))
    return (f"accuracy: a completion is correct when its weighted reward {terms} reaches {threshold:g} (every "
            f"function at 1 by default); pass correct_fn= or correct_threshold= to count otherwise")
