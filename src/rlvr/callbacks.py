"""Callbacks of `rlvr.Trainer`: rlvr's own hooks, plain callables, and `transformers.TrainerCallback`s.

rlvr's hooks are methods ``on_step_begin(step)``, ``on_step_end(step, metrics)``, ``on_evaluate(step,
metrics)`` and ``on_checkpoint(step, path)``; a hook returning False stops the run after that step. A
plain callable is called as ``on_step_end``.

A `transformers.TrainerCallback` (an instance or its class, as TRL takes them) is driven by those hooks
through `TrainerCallbackHooks`, with TRL's ``(args, state, control, **kwargs)``: ``args`` is the
`GRPOConfig` given as ``args=`` (else `TrainingArguments` holding the run's numbers), ``state`` a
`TrainerState` kept current (``global_step``, ``max_steps``, ``epoch``, ``log_history``), and
``control.should_training_stop`` stops the run as TRL's does. Called: ``on_init_end`` (at
construction), ``on_train_begin``, ``on_step_begin``, ``on_step_end``, ``on_log`` (every
``args.logging_steps`` steps, with TRL's key names beside rlvr's), ``on_evaluate``, ``on_save`` and
``on_train_end``. A callback overriding a hook rlvr never calls (``on_substep_end``,
``on_optimizer_step``, ``on_epoch_end`` ...) is refused at construction, naming those it can have.
An rlvr step is one rollout batch (`trainer.minibatches` optimizer steps): ``global_step`` counts steps.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["HOOKS", "TrainerCallbackHooks", "callback_list", "check_call"]

HOOKS = ("on_step_begin", "on_step_end", "on_evaluate", "on_checkpoint")
HOOK_ARGS = {"on_step_begin": ("step",), "on_step_end": ("step", "metrics"), "on_evaluate": ("step", "metrics"),
             "on_checkpoint": ("step", "path")}
"""What the trainer passes each hook, positionally: a hook that cannot take them is refused at construction."""
TRL_CALLED = ("on_init_end", "on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_evaluate", "on_save",
              "on_train_end")
# rlvr's metric -> TRL's name for it in `on_log`'s logs (the rlvr names are there too)
TRL_LOG_NAMES = {"reward/generated_mean": "reward", "reward/std": "reward_std", "loss/policy": "loss",
                 "actor/grad_norm": "grad_norm", "optim/lr": "learning_rate", "actor/entropy": "entropy",
                 "actor/kl": "kl", "response/length_mean": "completions/mean_length",
                 "response/length_max": "completions/max_length",
                 "response/truncation_rate": "completions/clipped_ratio"}


class _StepHook:
    """A plain callable used as a callback: called as ``fn(step, metrics)`` after each step."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def on_step_end(self, step: int, metrics: dict):
        return self.fn(step, metrics)


def _trainer_callback_class():
    """`transformers.TrainerCallback`, or None when transformers is not importable."""
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return None
    return TrainerCallback


def callback_list(callbacks: Any) -> list:
    """The callbacks as objects with rlvr's hooks (a `TrainerCallback` wrapped in `TrainerCallbackHooks`,
    which the trainer binds to the run's numbers once its config is known)."""
    if callbacks is None:
        return []
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    base = _trainer_callback_class()
    out = []
    for i, cb in enumerate(items):
        if base is not None and isinstance(cb, type) and issubclass(cb, base):
            cb = cb()  # TRL takes the class too and makes one
        if base is not None and isinstance(cb, base):
            out.append(TrainerCallbackHooks(cb, f"callbacks[{i}]"))
            continue
        flat = [hook for hook in HOOKS if hasattr(cb, hook) and not callable(getattr(cb, hook))]
        if flat:  # would fail at its first call, in the middle of the run
            raise ConfigError(f"callbacks[{i}]: {type(cb).__name__}.{flat[0]} is not callable "
                              f"({type(getattr(cb, flat[0])).__name__}); make it a method")
        if any(hasattr(cb, hook) for hook in HOOKS):
            for hook in (h for h in HOOKS if hasattr(cb, h)):
                check_call(getattr(cb, hook), HOOK_ARGS[hook], f"callbacks[{i}]: {type(cb).__name__}.{hook}")
            out.append(cb)
        elif callable(cb):
            check_call(cb, HOOK_ARGS["on_step_end"], f"callbacks[{i}]: {getattr(cb, '__name__', type(cb).__name__)}")
            out.append(_StepHook(cb))
        else:
            raise ConfigError(f"callbacks[{i}]: {type(cb).__name__} has none of {', '.join(HOOKS)} and is not "
                              f"callable; define one of those methods (or subclass transformers.TrainerCallback)")
    return out


def check_call(fn: Callable, names: tuple[str, ...], where: str, columns: dict | None = None) -> None:
    """Refuse (one line) `fn` when it cannot be called with len(`names`) positional arguments (and the
    keyword `columns`): found at construction, not as a TypeError at the first step. A signature Python
    cannot read passes."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one
        return
    try:
        signature.bind(*names, **(columns or {}))
    except TypeError as err:
        called = ", ".join(names) + (", **columns" if columns else "")
        raise ConfigError(f"{where}: is called as ({called}), but its parameters {signature} cannot take that "
                          f"({err}); give it the parameters ({called})") from None


def trl_logs(metrics: dict) -> dict[str, float]:
    """`on_log`'s logs: rlvr's metrics, and TRL's names for those TRL logs too (``reward``,
    ``loss``, ``rewards/<fn>/mean`` ...).

    >>> trl_logs({"reward/generated_mean": 0.5, "reward/user/mean": 0.5, "loss/policy": 0.1})["rewards/user/mean"]
    0.5
    """
    logs = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    logs.update({TRL_LOG_NAMES[k]: v for k, v in metrics.items() if k in TRL_LOG_NAMES})
    logs.update({"rewards/" + k[len("reward/"):]: v for k, v in metrics.items()
                 if k.startswith("reward/") and k.count("/") == 2 and k.endswith(("/mean", "/std"))})
    return logs


class TrainerCallbackHooks:
    """A `transformers.TrainerCallback` called from rlvr's hooks with TRL's (args, state, control)."""

    def __init__(self, callback: Any, where: str):
        base = _trainer_callback_class()
        unsupported = [name for name in dir(base) if name.startswith("on_") and name not in TRL_CALLED
                       and getattr(type(callback), name, None) is not getattr(base, name)]
        if unsupported:
            raise ConfigError(f"{where}: {type(callback).__name__}.{unsupported[0]} is a hook rlvr never calls; "
                              f"a TrainerCallback here can have {', '.join(TRL_CALLED)}")
        self.callback = callback
        self.args = self.state = self.control = None
        self.kwargs: dict = {}
        self._begun = self._ended = False
        self._epoch_per_step = 0.0

    def bind(self, args: Any, *, max_steps: int, epoch_per_step: float, logging_steps: int, save_steps: int,
             eval_steps: int, kwargs: dict) -> None:
        """The run's numbers (known once its config is), then ``on_init_end`` as TRL calls it; once (a
        Ray learner's trainer, rebuilt with these callbacks, binds them again)."""
        from transformers import TrainerControl, TrainerState

        if self.state is not None:
            return
        self.args, self.kwargs = args, kwargs
        self.state = TrainerState(max_steps=max_steps, logging_steps=logging_steps, save_steps=save_steps,
                                  eval_steps=eval_steps)
        self.control = TrainerControl()
        self._epoch_per_step = epoch_per_step
        self._event("on_init_end")

    def _event(self, name: str, **extra) -> bool:
        """Call hook `name` as TRL's `CallbackHandler` does (a returned control replaces ours); False
        when the callback asked the run to stop."""
        result = getattr(self.callback, name)(self.args, self.state, self.control, **self.kwargs, **extra)
        if result is not None:
            self.control = result
        return not self.control.should_training_stop

    def _at(self, step: int) -> None:
        if not self._begun:
            self._begun = True
            self._event("on_train_begin")
        self.state.global_step = step
        if self._epoch_per_step:
            self.state.epoch = step * self._epoch_per_step

    def on_step_begin(self, step: int) -> bool:
        self._at(step - 1)
        return self._event("on_step_begin")

    def on_step_end(self, step: int, metrics: dict) -> bool:
        self._at(step)
        go_on = self._event("on_step_end")
        every = max(int(self.state.logging_steps or 1), 1) if self.state.logging_steps >= 1 else max(
            1, math.ceil(self.state.logging_steps * self.state.max_steps))  # a float below 1: a share of the run
        if step % every == 0 or step == self.state.max_steps:
            logs = {**trl_logs(metrics), "epoch": self.state.epoch}
            self.state.log_history.append({**logs, "step": step})
            go_on = self._event("on_log", logs=logs) and go_on
        return go_on

    def on_evaluate(self, step: int, metrics: dict) -> bool:
        self._at(step)
        named = {"eval_" + k.split("/", 1)[1].replace("/", "_"): v for k, v in metrics.items()}
        self.state.log_history.append({**named, "epoch": self.state.epoch, "step": step})
        return self._event("on_evaluate", metrics=named)

    def on_checkpoint(self, step: int, path: Path) -> bool:
        self._at(step)
        return self._event("on_save")

    def finish(self) -> None:
        """``on_train_end``, once, after the run (also after a stop)."""
        if self._begun and not self._ended:
            self._ended = True
            self._event("on_train_end")
