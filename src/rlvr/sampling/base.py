"""The sampler seams: which prompts a step rolls out and how many completions each gets
(`Sampler`), and what happens to the groups once generated (`GroupFilter`).

A sampler proposes `Request`s before generation and learns only from one `GroupFeedback` per
request after it, including requests whose groups a filter then dropped (they were generated;
their verdicts are evidence). It owns a private seeded generator for its own decisions and
returns its whole state as plain data for exact resume. Prompt *draws* come from the task with
the run's prompt RNG (`rng` below), which the loop already checkpoints, so a uniform sampler
draws exactly what a plain `task.sample(n, rng)` draws.

Budgets are counted in completions. The loop groups rows by `G` (its advantage estimators
normalise over groups of exactly `G`), so a sampler that varies budgets gives each prompt a
multiple of `G`: a prompt with `n_rollouts = 2G` is two groups of the same prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

import torch

from rlvr.algos.shaping import zero_variance_groups
from rlvr.protocols import Task
from rlvr.types import Example


@dataclass(frozen=True)
class Request:
    """One prompt to roll out `n_rollouts` times (a multiple of the group size G)."""

    example: Example
    n_rollouts: int
    source: str = ""  # the data source (difficulty bucket) it was drawn from; "" = the task's one

    @property
    def prompt_id(self) -> str:
        return self.example.prompt


@dataclass(frozen=True)
class GroupFeedback:
    """What the loop tells the sampler about one request once generated and scored."""

    prompt_id: str
    source: str
    step: int
    policy_version: int  # the weights that sampled it (older than step - 1 under async rollouts)
    rewards: tuple[float, ...]  # (n,) task reward per completion, NaN = not scorable
    correct: tuple[float, ...]  # (n,) 1.0 where the verifier says correct
    truncated: tuple[bool, ...]  # (n,) max_new_tokens ended the completion
    gen_tokens: int  # completion tokens generated for it
    kept: bool  # a filter kept at least one of its groups for the update

    @property
    def successes(self) -> float:
        return float(sum(self.correct))

    @property
    def n_rollouts(self) -> int:
        return len(self.correct)


class Sampler(Protocol):
    """Chooses prompts and budgets; learns from every generated group."""

    reads_feedback: bool
    """Whether its proposals depend on the feedback it observed (False: uniform draws, so a batch's
    prompts can be drawn before the batches ahead of it are scored)."""

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        """Requests for step `step`: `n_prompts` group slots, their `n_rollouts` summing to `budget`.
        Called again within a step when a filter asks for a refill."""

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        """One record per request generated at `step`, kept by the filter or not."""

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def source_of(example: Example) -> str:
    """The source an example belongs to: its `meta["source"]` (difficulty buckets), else ""."""
    return str(example.meta.get("source", ""))


def spread(requests_per_slot: list[Example], group_size: int) -> list[Request]:
    """One request of one group per example (the fixed-budget samplers' proposal)."""
    return [Request(ex, group_size, source_of(ex)) for ex in requests_per_slot]


class Uniform:
    """Uniform task draws with the run's prompt RNG; it keeps no state of its own."""

    reads_feedback = False

    def __init__(self, *, task: Task, rng: random.Random, group_size: int):
        self.task, self.rng, self.group_size = task, rng, group_size

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        return spread(self.task.sample(n_prompts, self.rng), self.group_size)

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GroupFilter(Protocol):
    """Decides after generation which groups train, and whether to ask the sampler for more."""

    def keep(self, rewards: torch.Tensor, correct: torch.Tensor, group_size: int) -> torch.Tensor:
        """(groups,) bool: which groups of G rows of `rewards` (B,) and verdicts `correct` (B,) train."""

    def refill(self, kept_groups: int, wanted_groups: int, rounds_done: int) -> bool:
        """Whether to generate another round of requests."""


@dataclass(frozen=True)
class ZeroVariance:
    """DAPO dynamic sampling: a group whose rewards all tie has zero group-relative advantage and
    is dropped; refill until `wanted_groups` are kept or `max_rounds` rounds are spent (verl
    raises at its cap; here the step trains on what it has)."""

    max_rounds: int

    def keep(self, rewards: torch.Tensor, correct: torch.Tensor, group_size: int) -> torch.Tensor:
        return ~zero_variance_groups(rewards, group_size)

    def refill(self, kept_groups: int, wanted_groups: int, rounds_done: int) -> bool:
        return kept_groups < wanted_groups and rounds_done < self.max_rounds


def in_pass_band(rewards: torch.Tensor, correct: torch.Tensor, group_size: int, *, low: float,
                 high: float) -> tuple[torch.Tensor, dict[str, float]]:
    """(P,) bool, True where a group's pass rate p lies strictly inside (low, high), and the mean p.

    p is the solved fraction of the group's scorable completions (`rewards` (B,) NaN = not
    scorable, `correct` (B,) 1.0 = solved); a group with none scorable has no rate and is dropped.
    The band is open so that (0, 1) drops exactly the all-solved and none-solved groups: the
    verdicts' own zero-variance filter, whatever shaped credit the rewards add."""
    scorable = ~torch.isnan(rewards).view(-1, group_size)                 # (P, G)
    solved = (correct.view(-1, group_size) * scorable).sum(-1)            # (P,)
    count = scorable.sum(-1)                                              # (P,)
    rate = solved / count.clamp(min=1)
    keep = (count > 0) & (rate > low) & (rate < high)
    return keep, {"batch/group_pass_rate": float(rate[count > 0].mean()) if bool((count > 0).any()) else 0.0}


@dataclass(frozen=True)
class PassRateBand(ZeroVariance):
    """TraceRL's pass-rate filter (arXiv:2509.06949): train only groups whose pass rate lies in
    (`low`, `high`), refilled as DAPO's filter refills until `wanted_groups` are kept or `max_rounds` are spent.
    Deviation: the paper's thresholds and whether it refills are not stated in the material
    available; here both are the user's (`algo.pass_rate_low` / `algo.pass_rate_high`,
    `algo.max_sampling_rounds`)."""

    low: float = 0.0
    high: float = 1.0

    def keep(self, rewards: torch.Tensor, correct: torch.Tensor, group_size: int) -> torch.Tensor:
        return in_pass_band(rewards, correct, group_size, low=self.low, high=self.high)[0]
