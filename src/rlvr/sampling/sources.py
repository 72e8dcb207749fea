"""DUMP: a UCB curriculum over data sources (difficulty buckets), on advantage magnitude.

DUMP (automated distribution-level curriculum learning, arXiv:2504.09710) scores each source j by its
learnability L̂ⱼ, the mean |advantage| of its recent rollouts, plus an exploration bonus:
Uⱼ = L̂ⱼ + c·sqrt(2 ln Σₖnₖ / nⱼ), with nⱼ the groups drawn from j. The step's prompts come from
the sources in proportions softmax(U/τ), uniformly within a source; a source never drawn has an
infinite bonus and is tried first. A source that is always solved or never solved gives dead
groups, |A| = 0, and falls behind one where the policy is half right. Deviations:
1. |A| is computed here from each group's rewards as mean |r − r̄| (the unnormalised, Dr.GRPO
   form: 2p(1 − p) for binary rewards), whatever advantage estimator trains, so the score means
   the same under every estimator.
2. The window is the last `window` groups of each source; the slots of a step are drawn
   independently from the softmax (the paper's exact batching is not reproduced).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Protocol

from rlvr.algos._registry import Requirement
from rlvr.errors import ConfigError
from rlvr.sampling.base import GroupFeedback, Request
from rlvr.types import Example


class SourcedTask(Protocol):
    """A task made of named sources (`rlvr.tasks.sources.Mixture`)."""

    sources: tuple[str, ...]

    def sample_source(self, source: str, n: int, rng: random.Random) -> list[Example]: ...


def mean_abs_advantage(rewards: tuple[float, ...]) -> float:
    """mean |r − r̄| over the scorable rewards of one group (0 when fewer than two)."""
    scored = [r for r in rewards if not math.isnan(r)]
    if len(scored) < 2:
        return 0.0
    mean = sum(scored) / len(scored)
    return sum(abs(r - mean) for r in scored) / len(scored)


def ucb_scores(learnability: list[float], counts: list[int], c: float) -> list[float]:
    """Uⱼ = L̂ⱼ + c·sqrt(2 ln N / nⱼ), N = Σ nₖ; infinite for a source never drawn."""
    total = sum(counts)
    return [math.inf if n == 0 else mean + c * math.sqrt(2 * math.log(total) / n)
            for mean, n in zip(learnability, counts)]


def source_mix(scores: list[float], temperature: float) -> list[float]:
    """softmax(U/τ); with untried sources (U = ∞), those share everything equally."""
    untried = [math.isinf(s) for s in scores]
    if any(untried):
        return [u / sum(untried) for u in untried]
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return [w / sum(weights) for w in weights]


class DUMP:
    """Per-source windows of |A| and draw counts; each slot's source drawn from softmax(UCB/τ)."""

    reads_feedback = True
    requires = (Requirement({"task.train_size": 0}, "sampler dump draws from the task's sources, not a finite train "
                            "set; set task.train_size=0", field="task.train_size"),)

    def __init__(self, *, task: SourcedTask, rng: random.Random, group_size: int, seed: int, ucb_c: float = 1.0,
                 temperature: float = 0.1, window: int = 64):
        self.task, self.draws, self.group_size = task, rng, group_size
        self.c, self.temperature, self.window = ucb_c, temperature, window
        if not getattr(task, "sources", ()):
            raise ConfigError("sampler.name: dump chooses between a task's sources and this task has none; "
                              "use task.name=countdown with task.countdown.buckets, or another sampler")
        self.rng = random.Random(f"{seed}/dump")
        self.names = tuple(task.sources)
        self.counts = {s: 0 for s in self.names}
        self.recent: dict[str, deque] = {s: deque(maxlen=window) for s in self.names}
        self.last_mix = [1 / len(self.names)] * len(self.names)

    def learnability(self) -> list[float]:
        return [sum(self.recent[s]) / len(self.recent[s]) if self.recent[s] else 0.0 for s in self.names]

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        self.last_mix = source_mix(ucb_scores(self.learnability(), [self.counts[s] for s in self.names], self.c),
                                   self.temperature)
        chosen = self.rng.choices(self.names, weights=self.last_mix, k=n_prompts)
        requests = []
        for source in self.names:  # one draw per source, in a fixed order: the task's RNG stays reproducible
            k = chosen.count(source)
            if k:
                drawn = self.task.sample_source(source, k, self.draws)
                requests += [Request(ex, self.group_size, source) for ex in drawn]
        return requests

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        for f in feedback:
            if f.source in self.counts:
                self.counts[f.source] += 1
                self.recent[f.source].append(mean_abs_advantage(f.rewards))

    def metrics(self) -> dict[str, float]:
        return {f"sampler/source_share/{s}": p for s, p in zip(self.names, self.last_mix)}

    def state_dict(self) -> dict:
        return {"counts": dict(self.counts), "recent": {s: list(d) for s, d in self.recent.items()},
                "rng": self.rng.getstate(), "mix": list(self.last_mix)}

    def load_state_dict(self, state: dict) -> None:
        self.counts = dict(state["counts"])
        self.recent = {s: deque(v, maxlen=self.window) for s, v in state["recent"].items()}
        self.rng.setstate(state["rng"])
        self.last_mix = list(state["mix"])
