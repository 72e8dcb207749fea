"""A task made of named sources (difficulty buckets) that share one verifier.

`sample` draws each example's source uniformly, then the example from that source; a source
sampler (`rlvr.sampling.sources.DUMP`) draws from one source at a time with `sample_source`.
Every example carries its source in `meta["source"]`; the held-out set is the sources' held-out
sets in order, so accuracy can be read per source.
"""

from __future__ import annotations

import random

from rlvr.types import Example


def tagged(example: Example, source: str) -> Example:
    """`example` with `meta["source"] = source`."""
    return Example(example.prompt, example.answer, {**example.meta, "source": source})


def heldout_shares(total: int, parts: int) -> list[int]:
    """`total` held-out problems split over `parts` sources, the first ones taking the remainder."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class Mixture:
    """Named parts, each a task of the same kind (its `sample(n, rng)` and `heldout()` used)."""

    def __init__(self, parts: dict):
        self.parts = parts
        self.sources = tuple(parts)

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        return [self.sample_source(rng.choice(self.sources), 1, rng)[0] for _ in range(n)]

    def sample_source(self, source: str, n: int, rng: random.Random) -> list[Example]:
        return [tagged(ex, source) for ex in self.parts[source].sample(n, rng)]

    def heldout(self) -> list[Example]:
        return [tagged(ex, name) for name, part in self.parts.items() for ex in part.heldout()]
