"""DOTS rollout replay: part of each step's groups come from a buffer of recent ones.

Rollout replay (arXiv:2506.05316, with DOTS) generates fresh completions for only
`1 − fraction` of a step's prompts and fills the rest with groups drawn uniformly from a FIFO
buffer of the last `capacity` groups that trained. A replayed group keeps its completions, its
rewards and the behaviour log-probs of the weights that sampled it; a batch holding one is
trained as a stale batch (the plan's decoupled-PPO path: an old-policy pass and per-token
weights π_prox / π_behav), so the reuse is importance-corrected. Deviations:
1. The group baseline of a replayed group is its own old rewards (the paper's off-policy GRPO
   objective is not reproduced beyond the importance weights).
2. Replayed groups are not shown to the sampler again: it learns from fresh generations only.
"""

from __future__ import annotations

import math
import random
from collections import deque


class ReplayBuffer:
    """The last `capacity` trained groups as (policy version, group) pairs; `fraction` of each
    step's prompt slots are replayed once the buffer holds that many."""

    def __init__(self, *, capacity: int, fraction: float, seed: int):
        self.capacity, self.fraction = capacity, fraction
        self.groups: deque = deque(maxlen=capacity)
        self.rng = random.Random(f"{seed}/replay")

    def slots(self, n_prompts: int) -> int:
        """How many of `n_prompts` slots this step replays: ⌊fraction·n⌋, 0 until the buffer holds them."""
        k = math.floor(self.fraction * n_prompts)
        return k if len(self.groups) >= k else 0

    def draw(self, k: int) -> list:
        """`k` distinct buffered (version, group) pairs, uniformly, oldest first."""
        return [self.groups[i] for i in sorted(self.rng.sample(range(len(self.groups)), k))]

    def add(self, version: int, groups: list) -> None:
        self.groups.extend((version, g) for g in groups)

    def state_dict(self) -> dict:
        return {"groups": list(self.groups), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.groups = deque(state["groups"], maxlen=self.capacity)
        self.rng.setstate(state["rng"])
