"""Load user reward functions by path and call them over a batch, capturing per-sample failures.

A reward function has one of four forms:

- per-sample: ``fn(prompt, completion, **example) -> float | dict | None``
- batched: ``fn(prompts, completions, **columns) -> list[...]`` with ``fn.batched = True``
  (or decorated with ``@batched``); ``columns`` maps each example field to a list
- async per-sample: ``async def fn(prompt, completion, **example)`` (all samples run concurrently)
- async batched: ``async def`` with ``fn.batched = True``

Return values: a number is the reward; ``None`` means not scorable (excluded from the advantage,
counted); a dict must hold ``"reward"`` (a number or None) and its other numeric keys become
metrics (mean over the samples that returned them). A sample whose call raises, or returns
something else, is excluded like ``None`` and counted as an error; a batched call that raises or
returns the wrong length fails every sample. When every sample of a step errors, ``RewardError``
stops the run with one line naming the function and the first error.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlvr.errors import ConfigError, RewardError

__all__ = ["load_reward_fn", "batched", "RewardRunner", "RewardBatch"]


def batched(fn: Callable) -> Callable:
    """Mark ``fn`` as taking lists: ``fn(prompts, completions, **columns) -> list``."""
    fn.batched = True
    return fn


def load_reward_fn(spec: str, *, base_dir: str | Path | None = None) -> Callable:
    """``"path/to/file.py:name"`` or ``"package.module:name"`` -> the callable.

    Relative file paths resolve against ``base_dir`` (default: the current directory).
    """
    path_part, sep, name = spec.rpartition(":")
    if not sep or not path_part or not name:
        raise ConfigError(f"reward.fn={spec!r}: expected FILE.py:NAME or MODULE:NAME, e.g. my_rewards.py:score")
    if path_part.endswith(".py") or "/" in path_part:
        path = Path(path_part)
        if not path.is_absolute():
            path = Path(base_dir or ".") / path
        if not path.is_file():
            raise ConfigError(f"reward.fn={spec!r}: file {str(path)!r} not found")
        mod_name = f"rlvr_user_reward_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[mod_name]
            raise ConfigError(f"reward.fn={spec!r}: importing {str(path)!r} failed: {type(err).__name__}: {err}") from None
    else:
        try:
            module = importlib.import_module(path_part)
        except ImportError as err:
            raise ConfigError(f"reward.fn={spec!r}: cannot import module {path_part!r}: {err}") from None
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"reward.fn={spec!r}: no {name!r} in {path_part!r}; callables there: {', '.join(public) or 'none'}")
    if not callable(fn):
        raise ConfigError(f"reward.fn={spec!r}: {name!r} is not callable")
    return fn


@dataclass
class RewardBatch:
    """Rewards for B samples: ``rewards[i]`` is a float or ``nan`` (not scorable or failed)."""

    rewards: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str | None] = field(default_factory=list)  # per sample: None or "Type: message"


class RewardRunner:
    """Call one reward function over a batch; see the module doc for forms and return values.

    >>> run = RewardRunner(lambda p, c, **ex: {"reward": float(c == ex["answer"]), "len": len(c)}, name="exact")
    >>> out = run(["q", "q"], ["4", "five"], [{"answer": "4"}, {"answer": "4"}])
    >>> out.rewards, out.metrics["exact/len"], out.metrics["exact/errors"]
    ([1.0, 0.0], 2.5, 0.0)
    """

    def __init__(self, fn: Callable, *, name: str | None = None, batched: bool | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")
        self.batched = bool(getattr(fn, "batched", False)) if batched is None else batched
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    def __call__(self, prompts: list[str], completions: list[str], examples: list[dict[str, Any]]) -> RewardBatch:
        n = len(completions)
        if not (len(prompts) == len(examples) == n):
            raise ValueError(f"reward {self.name}: {len(prompts)} prompts, {n} completions, {len(examples)} examples")
        # ``dataclasses.asdict(example)`` carries "prompt" too; it is passed positionally already.
        examples = [{k: v for k, v in ex.items() if k not in ("prompt", "completion")} for ex in examples]
        raw = self._call_batched(prompts, completions, examples) if self.batched else self._call_each(prompts, completions, examples)
        return self._collect(raw)

    # Each call path returns a list of (value, error-string-or-None).

    def _call_each(self, prompts, completions, examples) -> list[tuple[Any, str | None]]:
        if self.is_async:
            async def one(p, c, ex):
                return await self.fn(p, c, **ex)

            async def gather():
                return await asyncio.gather(*(one(p, c, ex) for p, c, ex in zip(prompts, completions, examples)),
                                            return_exceptions=True)
            results = _run_coroutine(gather())
            return [(None, _describe(r)) if isinstance(r, BaseException) else (r, None) for r in results]
        out = []
        for p, c, ex in zip(prompts, completions, examples):
            try:
                out.append((self.fn(p, c, **ex), None))
            except Exception as err:  # noqa: BLE001 - one bad sample must not stop the run
                out.append((None, _describe(err)))
        return out

    def _call_batched(self, prompts, completions, examples) -> list[tuple[Any, str | None]]:
        keys = sorted({k for ex in examples for k in ex})
        columns = {k: [ex.get(k) for ex in examples] for k in keys}
        try:
            values = self.fn(list(prompts), list(completions), **columns)
            if inspect.isawaitable(values):
                values = _run_coroutine(values)
            values = list(values)
            if len(values) != len(completions):
                raise ValueError(f"returned {len(values)} values for {len(completions)} samples")
        except Exception as err:  # noqa: BLE001
            return [(None, _describe(err))] * len(completions)
        return [(v, None) for v in values]

    def _collect(self, raw: list[tuple[Any, str | None]]) -> RewardBatch:
        rewards, errors, extra = [], [], {}
        unscorable = 0
        for value, error in raw:
            reward = None
            if error is None:
                if isinstance(value, dict):
                    if "reward" not in value:
                        error = f"ValueError: dict reward without a 'reward' key (keys: {sorted(value)})"
                    else:
                        reward = value["reward"]
                        for k, v in value.items():
                            if k != "reward" and isinstance(v, numbers.Real) and not isinstance(v, bool):
                                extra.setdefault(k, []).append(float(v))
                            elif k != "reward" and isinstance(v, bool):
                                extra.setdefault(k, []).append(float(v))
                else:
                    reward = value
                if error is None and reward is not None and (isinstance(reward, bool) or not isinstance(reward, numbers.Real)):
                    error = f"TypeError: reward must be a number, dict or None, got {type(reward).__name__}"
                    reward = None
            if error is None and reward is None:
                unscorable += 1
            rewards.append(math.nan if reward is None else float(reward))
            errors.append(error)
        n_err = sum(e is not None for e in errors)
        if raw and n_err == len(raw):
            first = next(e for e in errors if e)
            raise RewardError(f"reward {self.name} failed on all {len(raw)} samples of this step; first error: {first}")
        metrics = {f"{self.name}/errors": float(n_err), f"{self.name}/unscorable": float(unscorable)}
        ok = [r for r in rewards if not math.isnan(r)]
        if ok:
            metrics[f"{self.name}/mean"] = sum(ok) / len(ok)
        for k, vs in extra.items():
            metrics[f"{self.name}/{k}"] = sum(vs) / len(vs)
        return RewardBatch(rewards, metrics, errors)


def _describe(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"


def _run_coroutine(coro):
    """Run a coroutine to completion, also from inside a running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
