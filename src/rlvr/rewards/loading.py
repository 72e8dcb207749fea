"""Load reward functions named in ``reward.fn``: ``FILE.py:NAME``, ``MODULE:NAME``, a saved reward
model folder, ``judge:DIR``, or the task's own verifier (``task``), each optionally weighted."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError
from rlvr.rewards.forms import TASK_VERIFIER, reward_form

__all__ = ["load_reward_fn", "load_reward_spec", "spec_entries"]


def load_reward_fn(spec: str, *, base_dir: str | Path | None = None, model_options: dict[str, Any] | None = None,
                   judge_options: dict[str, Any] | None = None) -> Callable:
    """``"path/to/file.py:name"`` or ``"package.module:name"`` -> the callable; a saved model folder (holding
    config.json) -> a ``RewardModel`` built with ``model_options`` (a ``ProcessRewardModel`` when they name a
    step ``aggregate``); ``"judge:DIR"`` -> a ``GenerativeJudge`` built with ``judge_options``.

    Relative paths resolve against ``base_dir`` (default: the current directory).
    """
    if spec.startswith("judge:"):  # a generative judge: torch is loaded only now
        from rlvr.rewards.judge import JUDGE_PREFIX, load_judge

        target = Path(spec.removeprefix(JUDGE_PREFIX))
        return load_judge(target if target.is_absolute() else Path(base_dir or ".") / target, **(judge_options or {}))
    folder = Path(spec) if Path(spec).is_absolute() else Path(base_dir or ".") / spec
    if folder.is_dir():  # a reward model (its folder's files are checked as it loads): torch is loaded only now
        from rlvr.rewards.reward_model import load_reward_model

        return load_reward_model(folder, **(model_options or {}))
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
            raise ConfigError(f"reward.fn={spec!r}: importing {str(path)!r} failed: "
                              f"{type(err).__name__}: {err}") from None
    else:
        try:
            module = importlib.import_module(path_part)
        except ImportError as err:
            raise ConfigError(f"reward.fn={spec!r}: cannot import module {path_part!r}: {err}") from None
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"reward.fn={spec!r}: no {name!r} in {path_part!r}; "
                          f"callables there: {', '.join(public) or 'none'}")
    if not callable(fn):
        raise ConfigError(f"reward.fn={spec!r}: {name!r} is not callable")
    return fn


def load_reward_spec(spec: str, *, base_dir: str | Path | None = None, model_options: dict[str, Any] | None = None,
                     judge_options: dict[str, Any] | None = None) -> list[tuple[Callable, float]]:
    """``"a.py:right, 0.2*a.py:short"`` -> [(right, 1.0), (short, 0.2)]: the ``reward.fn`` form,
    one or several ``FILE.py:NAME`` / ``MODULE:NAME`` / reward-model folders separated by commas,
    each optionally prefixed by its weight and ``*``; ``task`` is the task's own verifier
    (``TASK_VERIFIER``, bound by ``rlvr.rewards.forms.with_task``), so ``"0.1*my.py:shaping, task"``
    adds a shaping term to it, ``"task, 0.5*RM_DIR"`` weighs a learned reward against it and
    ``"task, 0.5*judge:LM_DIR"`` a generative judge."""
    out = []
    for value, target in spec_entries(spec):
        fn = TASK_VERIFIER if target == "task" else load_reward_fn(
            target, base_dir=base_dir, model_options=model_options, judge_options=judge_options)
        reward_form(fn, f"reward.fn={spec!r}")
        out.append((fn, value))
    return out


def spec_entries(spec: str) -> list[tuple[float, str]]:
    """The ``reward.fn`` form's (weight, target) pairs, nothing loaded (one-line errors for bad entries)."""
    out = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            raise ConfigError(f"reward.fn={spec!r}: empty entry; separate functions by single commas")
        weight, star, target = item.partition("*")
        if not star:
            weight, target = "1", item
        try:
            value = float(weight)
        except ValueError:
            raise ConfigError(f"reward.fn={spec!r}: weight {weight.strip()!r} of {target.strip()!r} is not a number; "
                              f"write WEIGHT*FILE.py:NAME, e.g. 0.2*my_rewards.py:short") from None
        out.append((value, target.strip()))
    return out
