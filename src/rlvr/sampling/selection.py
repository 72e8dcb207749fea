"""Which prompts a step rolls out: uniform draws, or MoPPS posterior selection.

MoPPS (Model Predictive Prompt Selection, arXiv:2507.04632) keeps a Beta posterior
over each prompt's success rate, fed by the verifier's verdicts on that prompt's past groups at
no extra rollout cost. Each step draws `candidates_per_prompt × P` candidates from the task,
samples a success rate for each from its posterior (Thompson sampling) and rolls out the `P`
whose sampled rate is closest to the target (0.5: the rate at which a group is most likely to
have varying rewards, i.e. a non-zero GRPO advantage). A prompt never seen has the prior
Beta(1, 1), so new prompts are tried at random.

The posterior update discounts old evidence toward the prior (factor λ per observation), since
the policy that produced it has moved:  α ← λα + (1-λ)α₀ + s,  β ← λβ + (1-λ)β₀ + f.
"""

from __future__ import annotations

import random

from rlvr.types import Example

PRIOR = (1.0, 1.0)  # Beta(α₀, β₀): uniform


def posterior_update(alpha: float, beta: float, successes: float, failures: float, *,
                     decay: float, prior: tuple[float, float] = PRIOR) -> tuple[float, float]:
    """MoPPS conjugate update with forgetting: (α, β) after observing `successes` and `failures`."""
    a0, b0 = prior
    return (decay * alpha + (1 - decay) * a0 + successes,
            decay * beta + (1 - decay) * b0 + failures)


def closest_to_target(rates: list[float], n: int, target: float) -> list[int]:
    """Indices of the `n` rates nearest `target` (ties: the earlier index), in candidate order."""
    ranked = sorted(range(len(rates)), key=lambda i: (abs(rates[i] - target), i))
    return sorted(ranked[:n])


class PosteriorSelector:
    """Per-prompt Beta posteriors and Thompson selection; state is plain data for checkpoints."""

    def __init__(self, *, candidates_per_prompt: float, target: float, decay: float, seed: int):
        self.candidates_per_prompt, self.target, self.decay = candidates_per_prompt, target, decay
        self.rng = random.Random(f"{seed}/prompt-selection")  # private: never shares the task's draws
        self.table: dict[str, tuple[float, float]] = {}

    def num_candidates(self, n: int) -> int:
        return max(n, round(n * self.candidates_per_prompt))

    def choose(self, candidates: list[Example], n: int) -> list[Example]:
        """The `n` candidates whose posterior draw is closest to the target success rate."""
        rates = [self.rng.betavariate(*self.table.get(ex.prompt, PRIOR)) for ex in candidates]
        return [candidates[i] for i in closest_to_target(rates, n, self.target)]

    def observe(self, prompt: str, successes: float, trials: int) -> None:
        """Fold one rolled-out group's verdicts into its prompt's posterior (kept or filtered)."""
        alpha, beta = self.table.get(prompt, PRIOR)
        self.table[prompt] = posterior_update(alpha, beta, successes, trials - successes, decay=self.decay)

    def metrics(self) -> dict[str, float]:
        return {"selection/prompts_seen": float(len(self.table))}

    def state_dict(self) -> dict:
        return {"table": dict(self.table), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.table = dict(state["table"])
        self.rng.setstate(state["rng"])


SELECTIONS = ("uniform", "mopps")
"""Values of `rollout.prompt_selection`."""


def build_selector(rollout, seed: int) -> PosteriorSelector | None:
    """The configured selector, or None for uniform draws."""
    if rollout.prompt_selection == "uniform":
        return None
    return PosteriorSelector(candidates_per_prompt=rollout.selection_candidates,
                             target=rollout.selection_target, decay=rollout.selection_decay, seed=seed)
