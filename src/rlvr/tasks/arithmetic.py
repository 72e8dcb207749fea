"""arithmetic: add two numbers, one source per digit count.

Prompt ``"47+385="``, completion the bare sum ``"432"``; reward 1.0 for the exact sum (surrounding
whitespace ignored), else 0.0. ``digits="2,3,4"`` makes three sources, ``d2``, ``d3`` and ``d4``,
whose operands have that many digits, so a source curriculum has easy and hard buckets to choose
between. Held-out split: a stable hash of the (unordered) operand pair puts one problem in
``HELDOUT_BUCKETS`` into the held-out bucket; ``sample`` never draws one.
"""

from __future__ import annotations

import hashlib
import random

from rlvr.tasks.sources import Mixture, heldout_shares
from rlvr.types import Example

HELDOUT_BUCKETS = 10
_HELDOUT_SEED = "rlvr.arithmetic.heldout"


def is_heldout(a: int, b: int) -> bool:
    key = f"{min(a, b)}+{max(a, b)}"
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def parse_digits(digits: str) -> list[int]:
    """``"2,3,4"`` -> [2, 3, 4]; a ValueError naming the knob otherwise."""
    try:
        counts = [int(d) for d in digits.split(",") if d.strip()]
    except ValueError:
        counts = []
    if not counts or any(not 1 <= d <= 9 for d in counts) or len(set(counts)) != len(counts):
        raise ValueError(f"arithmetic: digits must be distinct digit counts 1..9, comma-separated, e.g. '2,3,4'; "
                         f"got {digits!r}")
    return counts


class Addition:
    """Sums of two `digits`-digit numbers (one source of `Arithmetic`)."""

    def __init__(self, digits: int, heldout_size: int):
        self.digits, self.heldout_size = digits, heldout_size
        self.low, self.high = 10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(self.low, self.high), rng.randint(self.low, self.high)

    @staticmethod
    def example(a: int, b: int) -> Example:
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), meta={"operands": [a, b]})

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        while len(out) < n:
            a, b = self._draw(rng)
            if not is_heldout(a, b):
                out.append(self.example(a, b))
        return out

    def heldout(self) -> list[Example]:
        rng, seen, out = random.Random(f"{_HELDOUT_SEED}/{self.digits}"), set(), []
        space = (self.high - self.low + 1) ** 2
        for _ in range(200 * space):
            if len(out) == self.heldout_size:
                break
            a, b = self._draw(rng)
            key = (min(a, b), max(a, b))
            if key not in seen and is_heldout(a, b):
                seen.add(key)
                out.append(self.example(a, b))
        if len(out) < self.heldout_size:
            raise ValueError(f"arithmetic: only {len(out)} held-out {self.digits}-digit problems exist; "
                             "lower task.heldout_size or drop that digit count")
        return out


class Arithmetic:
    """Procedural addition with one source per digit count. Knobs: ``digits``, ``heldout_size``."""

    name = "arithmetic"

    def __init__(self, *, digits: str = "2,3,4", heldout_size: int = 200, seed: int = 0):
        counts = parse_digits(digits)
        shares = heldout_shares(heldout_size, len(counts))
        self.mixture = Mixture({f"d{d}": Addition(d, share) for d, share in zip(counts, shares)})
        self.sources = self.mixture.sources
        self._rng = random.Random(seed)
        self._heldout = self.mixture.heldout()  # now: a source too small for its share fails at build time

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        return self.mixture.sample(n, self._rng if rng is None else rng)

    def sample_source(self, source: str, n: int, rng: random.Random) -> list[Example]:
        return self.mixture.sample_source(source, n, rng)

    def heldout(self) -> list[Example]:
        return list(self._heldout)

    def reward(self, prompt: str, completion: str, /, **example) -> float:
        """1.0 for the exact sum, else 0.0.

        >>> Arithmetic().reward("47+385=", " 432 ", answer="432")
        1.0
        """
        answer = example.get("answer")
        if answer is None:
            a, b = prompt.rstrip("=").split("+")
            answer = str(int(a) + int(b))
        return 1.0 if completion.strip() == answer else 0.0

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.reward(example.prompt, completion, answer=example.answer) == 1.0
