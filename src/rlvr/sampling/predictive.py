"""DOTS-style difficulty prediction: attention over the groups already measured.

DOTS (arXiv:2506.05316) predicts an unseen prompt's difficulty as a similarity-weighted average
of the measured difficulties of a small reference set, weights softmax(⟨eₓ, e_q⟩/τ) over
embeddings, and rolls out the prompts predicted nearest a 0.5 success rate; each step's `K`
reference prompts are rolled out too (they train like the others). Deviations:
1. The embedding is a hashed bag of character bigrams of the prompt (`dims` buckets, L2-normed),
   not a pretrained embedding model with an adapter: procedural prompts of one difficulty look
   alike character-wise, and nothing is downloaded.
2. The reference set is every group measured in the last `window` records (the `K` random
   `reference` slots of each step are what keeps it unbiased), not only that step's reference
   prompts.
3. No rollout replay: every group is generated fresh.
"""

from __future__ import annotations

import random
import zlib
from collections import deque

import torch

from rlvr.protocols import Task
from rlvr.sampling.base import GroupFeedback, Request, spread
from rlvr.sampling.selection import closest_to_target, num_candidates


def embed(text: str, dims: int) -> torch.Tensor:
    """(dims,) L2-normalised counts of the character bigrams of `text`, hashed into `dims` buckets."""
    v = torch.zeros(dims, dtype=torch.float64)
    for a, b in zip(text, text[1:]):
        v[zlib.crc32((a + b).encode()) % dims] += 1.0
    return v / v.norm().clamp_min(1e-12)


def predicted_rates(queries: torch.Tensor, keys: torch.Tensor, rates: torch.Tensor, temperature: float) -> torch.Tensor:
    """(Q,) success rates predicted for `queries` (Q, D) from measured `rates` (K,) of `keys` (K, D):
    softmax over keys of ⟨q, k⟩/τ, then the weighted mean of their rates."""
    weights = torch.softmax(queries @ keys.T / temperature, dim=-1)  # (Q, K)
    return weights @ rates


class DOTS:
    """`reference` random candidates plus the ones predicted nearest a 0.5 success rate."""

    reads_feedback = True

    def __init__(self, *, task: Task, rng: random.Random, group_size: int, seed: int, candidates: float = 4.0,
                 reference: int = 2, temperature: float = 0.1, window: int = 256, dims: int = 64):
        self.task, self.draws, self.group_size, self.candidates = task, rng, group_size, candidates
        self.reference, self.temperature, self.dims = reference, temperature, dims
        self.rng = random.Random(f"{seed}/dots")
        self.measured: deque = deque(maxlen=window)  # (prompt, success rate) of recent groups

    def propose(self, step: int, n_prompts: int, budget: int) -> list[Request]:
        cands = self.task.sample(num_candidates(n_prompts, self.candidates), self.draws)
        k = n_prompts if not self.measured else min(self.reference, n_prompts)
        refs = sorted(self.rng.sample(range(len(cands)), k))
        rest = [i for i in range(len(cands)) if i not in set(refs)]
        chosen = refs
        if n_prompts > k:
            guess = self.predict(step, [cands[i] for i in rest])
            chosen = sorted(refs + [rest[j] for j in closest_to_target(guess, n_prompts - k, 0.5)])
        return spread([cands[i] for i in chosen], self.group_size)

    def predict(self, step: int, examples: list) -> list[float]:
        """Each example's success rate predicted from the measured groups (0.5 before any)."""
        if not self.measured:
            return [0.5] * len(examples)
        keys = torch.stack([embed(p, self.dims) for p, _ in self.measured])
        rates = torch.tensor([r for _, r in self.measured], dtype=torch.float64)
        queries = torch.stack([embed(ex.prompt, self.dims) for ex in examples])
        return predicted_rates(queries, keys, rates, self.temperature).tolist()

    def observe(self, step: int, feedback: list[GroupFeedback]) -> None:
        for f in feedback:
            self.measured.append((f.prompt_id, f.successes / max(f.n_rollouts, 1)))

    def metrics(self) -> dict[str, float]:
        return {"sampler/measured_groups": float(len(self.measured))}

    def state_dict(self) -> dict:
        return {"measured": [list(m) for m in self.measured], "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.measured.clear()
        self.measured.extend(tuple(m) for m in state["measured"])
        self.rng.setstate(state["rng"])


