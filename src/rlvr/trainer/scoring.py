"""The verifier's verdicts on a batch of completions, as tensors: rewards, correctness and, with
several reward functions, each one's own score."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from rlvr.rewards.forms import COMPLETION_IDS
from rlvr.types import Example


class Scored(NamedTuple):
    rewards: torch.Tensor  # (B,) the (weighted) reward; NaN = not scorable or failed
    correct: torch.Tensor  # (B,) 1.0 where the task says correct
    metrics: dict[str, float]
    components: torch.Tensor | None = None  # (B, K) each reward function's own score (K >= 2 functions)
    weights: torch.Tensor | None = None  # (K,) their weights in the sum
    names: tuple[str, ...] = ()  # (K,) their names (`reward/<name>/...`)


def scored(reward, task, group: list[Example], texts: list[str], token_ids: list[list[int]] | None = None) -> Scored:
    """The verifier's scores of `texts`, with the per-function components when it has several.
    `token_ids`: each completion's token ids, handed to TRL-form reward functions (`completion_ids`)."""
    examples = [dataclasses.asdict(ex) for ex in group]
    if token_ids is not None:
        examples = [{**ex, COMPLETION_IDS: ids} for ex, ids in zip(examples, token_ids)]
    # Correctness under the verifier's deadlines (`RewardRunner.correct`); asked beside the rewards when
    # both run in worker processes, so a completion that stalls both costs one deadline, not two.
    bounded = getattr(reward, "correct", None)
    if getattr(reward, "derives_correct", lambda task: False)(task):  # is_correct = "the reward is 1"
        out = reward([ex.prompt for ex in group], texts, examples)
        correct = [float(r == 1.0) for r in out.rewards]
    elif bounded is not None and getattr(reward, "correct_in_workers", lambda task: False)(task):
        with ThreadPoolExecutor(1, thread_name_prefix="rlvr-correct") as side:
            verdicts = side.submit(bounded, task, group, texts)
            out = reward([ex.prompt for ex in group], texts, examples)
            correct = [float(c) for c in verdicts.result()]
    else:
        out = reward([ex.prompt for ex in group], texts, examples)
        correct = [float(c) for c in (bounded(task, group, texts) if bounded is not None else
                                      (task.is_correct(text, ex) for ex, text in zip(group, texts)))]
    components = weights = None
    names = ()
    if getattr(out, "components", None):  # a RewardSum of several functions
        names = tuple(out.components)
        components = torch.tensor([out.components[n] for n in names], dtype=torch.float32).T
        weights = torch.tensor([out.weights.get(n, 1.0) for n in names], dtype=torch.float32)
    return Scored(torch.tensor(out.rewards, dtype=torch.float32), torch.tensor(correct), out.metrics, components,
                  weights, names)


def score(reward, task, group: list[Example], texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(rewards (B,), correct (B,), reward metrics). Unscorable or failed samples are NaN."""
    return scored(reward, task, group, texts)[:3]


def reads_step(reward) -> bool:
    """Whether the verifier's scores depend on the step it was told last (`on_step_begin`: TRL-form
    functions' `trainer_state`), so a batch scored ahead must be scored with its own step set."""
    return getattr(reward, "reads_step", hasattr(reward, "on_step_begin"))
