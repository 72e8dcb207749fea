"""A finite training set over any task: `task.train_size` examples drawn once, then drawn from.

Procedural tasks give a fresh problem at every draw, so a prompt never comes round again; methods
that reuse what a prompt produced before (SPEC-RL's drafts, per-prompt posteriors) need prompts
that recur, as a dataset's epochs make them. The set is drawn with its own seeded generator (the
run's prompt RNG then only picks from it), and every other attribute is the task's own.
"""

from __future__ import annotations

import random

from rlvr.types import Example


class FiniteTrainSet:
    """`size` examples of `task`, drawn once with a generator of `seed`; `sample` draws from them
    uniformly with replacement using the run's `rng`."""

    def __init__(self, task, size: int, seed: int):
        if size < 1:
            raise ValueError(f"train_size must be >= 1, got {size}")
        self.task = task
        self.examples = task.sample(size, random.Random(f"rlvr.train_set.{seed}"))

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        return [self.examples[rng.randrange(len(self.examples))] for _ in range(n)]

    def __getattr__(self, name: str):
        if name == "task":  # not set yet (copy and pickle build the object without __init__)
            raise AttributeError(name)
        return getattr(self.task, name)
