"""The verifier's verdicts on a batch of completions, as tensors: rewards, correctness and, with
several reward functions, each one's own score; and a scored batch (`Collected`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from rlvr.agents.batch import TurnTensors
from rlvr.batch import Rollouts
from rlvr.protocols import BatchVerifier, Task
from rlvr.rewards.forms import COMPLETION_IDS
from rlvr.types import Example


@dataclass(frozen=True)
class Collected:
    """A scored batch: B rows, grouped contiguously by prompt (G rows each). Frozen: a step that
    changes it (a replacement, a filter, a merge) makes a new one (`dataclasses.replace`)."""

    group: list[Example]       # the example of each row
    rollouts: Rollouts
    texts: list[str]
    rewards: torch.Tensor      # (B,) task reward, NaN = not scorable
    correct: torch.Tensor      # (B,) 1.0 where the verifier says correct
    metrics: dict[str, float]
    baseline_rewards: torch.Tensor | None = None  # (P,) reward of each prompt's greedy completion (ReMax)
    turns: TurnTensors | None = None  # agent tasks: the per-turn tensors
    components: torch.Tensor | None = None  # (B, K) each reward function's score when there are several
    component_weights: torch.Tensor | None = None  # (K,) their weights in `rewards`
    oldest_version: int | None = None  # rollout replay: the policy version of its oldest replayed group
    component_names: tuple[str, ...] = ()  # (K,) their names

    def component_inputs(self, wanted: bool) -> dict:
        """The `AdvantageInputs` fields of the reward components when the estimator reads them
        (`wanted`: GDPO); none without several reward functions."""
        if not wanted or self.components is None:
            return {}
        return {"reward_components": self.components, "reward_weights": self.component_weights}


class Scored(NamedTuple):
    rewards: torch.Tensor  # (B,) the (weighted) reward; NaN = not scorable or failed
    correct: torch.Tensor  # (B,) 1.0 where the task says correct
    metrics: dict[str, float]
    components: torch.Tensor | None = None  # (B, K) each reward function's own score (K >= 2 functions)
    weights: torch.Tensor | None = None  # (K,) their weights in the sum
    names: tuple[str, ...] = ()  # (K,) their names (`reward/<name>/...`)


def scored(reward: BatchVerifier, task: Task, group: list[Example], texts: list[str],
           token_ids: list[list[int]] | None = None) -> Scored:
    """The verifier's scores of `texts`, with the per-function components when it has several.
    `token_ids`: each completion's token ids, handed to TRL-form reward functions (`completion_ids`)."""
    examples = [dataclasses.asdict(ex) for ex in group]
    if token_ids is not None:
        examples = [{**ex, COMPLETION_IDS: ids} for ex, ids in zip(examples, token_ids)]
    out, verdicts = reward.judged(task, group, texts, examples)  # correctness under the verifier's bounds
    correct = [float(c) for c in verdicts]
    components = weights = None
    names = ()
    if out.components:  # a RewardSum of several functions
        names = tuple(out.components)
        components = torch.tensor([out.components[n] for n in names], dtype=torch.float32).T
        weights = torch.tensor([out.weights.get(n, 1.0) for n in names], dtype=torch.float32)
    return Scored(torch.tensor(out.rewards, dtype=torch.float32), torch.tensor(correct), out.metrics, components,
                  weights, names)


def score(reward: BatchVerifier, task: Task, group: list[Example],
          texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(rewards (B,), correct (B,), reward metrics). Unscorable or failed samples are NaN."""
    return scored(reward, task, group, texts)[:3]
