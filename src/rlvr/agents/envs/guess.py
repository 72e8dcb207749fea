"""Guess the number: a hidden integer in 1..N, feedback `higher` / `lower` after each guess.

    first observation  guess 1-64\n
    action             <guess>32</guess>     observation  <r>lower</r>
    ...                <guess>23</guess>     observation  <r>correct</r>  (done, reward 1)

Success within the turn budget needs search; the state (the interval still possible) recurs
across a group exactly (a group's episodes share their range), which is what GiGPO's anchor
states need. `reward_decay` > 0 pays 1 - decay * (guesses - 1) for a success, so fewer guesses
score more. With `min_high` set, each episode also draws its range 1..H, H in min_high..high:
the problem key is the pair (H, target), so the held-out split has about a tenth of all pairs
instead of a tenth of `high` numbers (6 of 64), and holds ranges the model was trained on with
targets it never had in them.
"""

from __future__ import annotations

import random
import re

from rlvr.agents.env import StepResult
from rlvr.agents.task import AgentTask

_GUESS = re.compile(r"<guess>\s*+(-?+\d++)\s*+</guess>")  # possessive: no backtracking on model text


class GuessEnv:
    def __init__(self, *, high: int = 64, min_high: int | None = None, reward_decay: float = 0.0, tools: bool = True,
                 tool_timeout_s: float = 2.0):
        self.high, self.min_high, self.reward_decay = high, min_high or high, reward_decay
        self.registry = _NoTools()
        self.answer, self.key, self.lo, self.hi, self.guesses = 0, "", 1, high, 0

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        top = self.high if self.min_high == self.high else rng.randint(self.min_high, self.high)
        self.answer = rng.randint(1, top)
        self.key, self.lo, self.hi, self.guesses = f"1-{top}:{self.answer}", 1, top, 0
        return f"guess 1-{top}\n"

    def state_key(self):
        """The interval still possible (what GiGPO groups on)."""
        return (self.lo, self.hi)

    def step(self, action_text: str) -> StepResult:
        state = self.state_key()
        found = _GUESS.findall(action_text)
        if not found:
            return StepResult("say <guess>n</guess>", 0.0, False, {"malformed": 1, "state_key": state, "role": "user"})
        guess = int(found[-1])
        self.guesses += 1
        if guess == self.answer:
            reward = max(0.0, 1.0 - self.reward_decay * (self.guesses - 1))
            return StepResult("correct", reward, True, {"success": True, "state_key": state})
        if guess < self.answer:
            self.lo = max(self.lo, guess + 1)
            return StepResult("higher", 0.0, False, {"state_key": (self.lo, self.hi), "role": "user"})
        self.hi = min(self.hi, guess - 1)
        return StepResult("lower", 0.0, False, {"state_key": (self.lo, self.hi), "role": "user"})

    def scripted(self, use_tool: bool, rng: random.Random):
        """Bisection (optimal) or, for the other demonstrations, a random guess inside the interval."""
        def policy(observation: str) -> str:
            guess = (self.lo + self.hi) // 2 if use_tool else rng.randint(self.lo, self.hi)
            return f"<guess>{guess}</guess>"
        return policy


class _NoTools:
    def schemas(self) -> list:
        return []


class GuessNumber(AgentTask):
    """Task `agent_guess`: find a hidden number in 1..`high` (or 1..H, H in `min_high`..`high`) from
    higher/lower feedback."""

    env_class = GuessEnv

    def __init__(self, *, high: int = 64, min_high: int | None = None, reward_decay: float = 0.1,
                 heldout_size: int = 64, max_turns: int = 8, max_total_tokens: int = 256, env_timeout_s: float = 60.0,
                 tool_timeout_s: float = 2.0,
                 tools: bool = True, train_drifted: bool = False, demo_tool_rate: float = 0.5):
        if high < 2:
            raise ValueError(f"high must be >= 2, got {high}")
        if min_high is not None and not 2 <= min_high <= high:
            raise ValueError(f"min_high must be in 2..high ({high}), got {min_high}")
        super().__init__(heldout_size=heldout_size, max_turns=max_turns, max_total_tokens=max_total_tokens,
                         env_timeout_s=env_timeout_s,
                         tool_timeout_s=tool_timeout_s, tools=True, train_drifted=train_drifted,
                         demo_tool_rate=demo_tool_rate, high=high, min_high=min_high, reward_decay=reward_decay)
