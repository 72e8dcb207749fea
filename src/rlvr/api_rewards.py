"""`rlvr.Trainer`'s reward arguments: the functions and weights a run scores with, and the probe of
each on one of the rows before anything loads (`rlvr.rewards.probe`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["AccuracyWatch", "model_options", "probe_rows", "reward_arguments", "watch_accuracy"]

WATCH_STEPS = 3  # steps of zero accuracy before the warning that no completion reached the threshold


def reward_arguments(config: Any, rows: list | None, reward_funcs: Any,
                     reward_weights: Any) -> tuple[list[Callable], list[float]]:
    """The reward functions and weights: the arguments, else the config's `reward.fn`."""
    from rlvr.rewards.forms import TASK_VERIFIER
    from rlvr.rewards.runner import load_reward_fn, load_reward_spec, reward_form, spec_entries

    if reward_funcs is None:
        names_task = config.reward.fn and any(target == "task" for _, target in spec_entries(config.reward.fn))
        if names_task and rows is None:  # the builder weighs the task's verifier in (it builds the task)
            return [], []
        if config.reward.fn:
            fns, weights = (list(x) for x in zip(*load_reward_spec(config.reward.fn, **model_options(config))))
            if rows is not None and TASK_VERIFIER in fns:
                raise ConfigError(f"reward.fn={config.reward.fn!r}: 'task' names a task's own verifier, "
                                  f"and rows passed as train_dataset have none; name reward functions only")
        elif rows is not None:
            raise ConfigError("reward_funcs: rows need reward functions; pass a callable, 'file.py:name' or a "
                              "list of them (or set reward.fn)")
        elif reward_weights is not None:
            raise ConfigError("reward_weights: given without reward_funcs; the task's own verifier has no weights")
        else:
            return [], []
    else:
        items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not items:
            raise ConfigError("reward_funcs: empty list; pass at least one function")
        fns = []
        for i, item in enumerate(items):
            where = "reward_funcs" if len(items) == 1 else f"reward_funcs[{i}]"
            if isinstance(item, (str, Path)):
                try:
                    item = load_reward_fn(str(item), **model_options(config))
                except ConfigError as err:
                    raise ConfigError(str(err).replace("reward.fn=", f"{where}=", 1)) from None
            elif is_sequence_classifier(item):  # an in-memory reward model, as TRL takes one
                from rlvr.rewards.reward_model import make_reward_model

                item = make_reward_model(item, **model_options(config)["model_options"])
            elif not callable(item):
                raise ConfigError(f"{where}: expected a callable or 'file.py:name', got {type(item).__name__}")
            reward_form(item, where)
            fns.append(item)
        weights = [1.0] * len(fns)
    if reward_weights is not None:
        weights = _numbers(reward_weights, "reward_weights")
        if len(weights) != len(fns):
            raise ConfigError(f"reward_weights: {len(weights)} weights for {len(fns)} reward functions; "
                              f"give one per function")
    return fns, weights


def model_options(config: Any) -> dict:
    """The keywords of `load_reward_fn` for learned rewards: reward models' and judges' options."""
    from rlvr.builder.build import judge_options, reward_model_options

    return {"model_options": reward_model_options(config), "judge_options": judge_options(config)}


def is_sequence_classifier(item: Any) -> bool:
    """A `transformers` model with a classification head (`...ForSequenceClassification`)."""
    return type(item).__name__.endswith("ForSequenceClassification") and hasattr(item, "config")


def _numbers(values: Any, argument: str) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ConfigError(f"{argument}: expected a list of numbers, got {values!r}") from None
    return out


def probe_rows(fns: list[Callable], weights: list[float], rows: list | None, prompt_key: str,
               steps: int) -> list[str]:
    """Each reward function called once on the first row (`rlvr.rewards.probe.probe_rewards`): lines
    for the run's start; none without rows (a task's examples come from its build)."""
    from rlvr.rewards.forms import TASK_VERIFIER
    from rlvr.rewards.probe import probe_rewards
    from rlvr.rewards.runner import RewardSum

    if rows is None or not fns or TASK_VERIFIER in fns:
        return []
    return probe_rewards(fns, RewardSum(fns, weights).names, rows[0], prompt_key, steps)


class AccuracyWatch:
    """Warns once when accuracy is 0 at each of the first `WATCH_STEPS` steps and no completion's
    weighted reward reached the threshold: with a reward such as TRL's length reward (at most 0),
    accuracy cannot count anything."""

    def __init__(self, threshold: float, steps: int, echo: Callable):
        self.threshold, self.echo = threshold, echo
        self.at, self.best, self.zero = min(WATCH_STEPS, steps), float("-inf"), True

    def on_step_end(self, step: int, metrics: dict) -> None:
        self.best = max(self.best, metrics.get("reward/generated_max", self.best))
        self.zero = self.zero and not metrics.get("reward/generated_accuracy", metrics.get("reward/accuracy", 0.0))
        if step == self.at and self.zero and self.best < self.threshold:
            self.echo(f"warning: accuracy is 0: a completion counts as correct when its weighted reward reaches "
                      f"{self.threshold:g}, and the highest in {step} steps is {self.best:g}; pass correct_fn= (a "
                      f"verdict per completion) or correct_threshold= for accuracy to mean something here")


def watch_accuracy(callbacks: list, rows: bool, threshold: float, steps: int, echo: Callable) -> list:
    """`callbacks` with an `AccuracyWatch` where accuracy is the weighted reward's (rows, no correct_fn)."""
    if not rows or any(isinstance(cb, AccuracyWatch) for cb in callbacks):
        return callbacks
    return [*callbacks, AccuracyWatch(threshold, steps, echo)]
