"""Countdown: combine the given numbers with arithmetic to hit a target.

Procedural and seeded, sized for a character-level model on a CPU. A prompt lists the numbers
and the target, ``"3 5 2>13:"``; the completion is a bare expression, ``"3+5*2"``. The reward
follows d1's Countdown verifier (1.0 right, 0.1 well-formed but wrong, 0.0 otherwise), with an
exact parser instead of ``eval`` and floats.

Generator. ``num_count`` numbers are drawn i.i.d. uniform from ``1..max_number``; they are
shuffled into the leaves of a random binary tree (split point uniform at every node), each
inner node gets an operator uniform over ``+ - *`` (and ``/`` where ``allow_division`` and the
division is exact), and the problem is kept when the value is a positive integer. The prompt
shows the numbers in drawn order; ``answer`` is the generating tree printed with minimal
parentheses.

Held-out split. A problem's key is ``(sorted numbers, target)``. A stable hash of the key
(SHA-256, not Python's salted ``hash``) puts one key in ``HELDOUT_BUCKETS`` into the held-out
bucket; ``sample`` never returns such a problem, and ``heldout()`` draws only such problems (same
generator, fixed internal seed), so the two are disjoint by construction. The bucket depends on
the key alone, not on the knobs, so a held-out problem stays held out under every setting.

Deviations from the usual Countdown setups (TinyZero, d1):
1. No ``<answer>`` tags or reasoning: the completion is the expression itself (every character
   costs compute for a character-level model).
2. Values are exact ``Fraction``s, not floats with a 1e-5 tolerance; intermediate values may be
   negative or non-integer in a completion, the generator uses exact integer division only.
3. Stricter format: no spaces inside the expression, no unary minus, no leading zeros, and ``/``
   is a syntax error when division is off (see ``Countdown.reward``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from fractions import Fraction
from itertools import combinations_with_replacement

from rlvr.errors import ConfigError
from rlvr.tasks.countdown_expr import Expr, ParseError, evaluate, leaves, parse, to_string
from rlvr.tasks.countdown_steps import score_steps, steps_from_expr
from rlvr.tasks.sources import Mixture, heldout_shares
from rlvr.types import Example

MAX_COMPLETION_CHARS = 64
"""Completions longer than this (after stripping) score 0.0 without being parsed."""

HELDOUT_BUCKETS = 5
"""One problem key in this many hashes into the held-out bucket."""

KEY_POOL_DRAWS = 50_000
"""Generator draws behind ``sampling="keys"``: enough to reach every 3-number key from 1..9."""

_HELDOUT_SEED = "rlvr.countdown.heldout"
MAX_DRAWS = 100_000  # tries for one problem (targets out of a bucket's range are drawn again)
_EXHAUSTIVE_LIMIT = 5_000  # count the problem space exactly when it has at most this many multisets
_PROMPT_RE = re.compile(r"^(\d+(?: \d+)*)>(\d+):$")

# ---------------------------------------------------------------------------- problem space


def _random_expr(numbers: list[int], rng: random.Random, allow_division: bool) -> Expr:
    """A random tree over ``numbers`` in the given order (split point uniform at every node)."""
    if len(numbers) == 1:
        return numbers[0]
    k = rng.randint(1, len(numbers) - 1)
    left = _random_expr(numbers[:k], rng, allow_division)
    right = _random_expr(numbers[k:], rng, allow_division)
    ops = ["+", "-", "*"]
    if allow_division:
        b = evaluate(right)
        if b != 0 and (evaluate(left) / b).denominator == 1:
            ops.append("/")
    return (rng.choice(ops), left, right)


def _splits(ms: tuple[int, ...]) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every ordered split of a sorted multiset into two non-empty sorted parts (deduplicated)."""
    n = len(ms)
    out = set()
    for mask in range(1, 2**n - 1):
        left = tuple(ms[i] for i in range(n) if mask >> i & 1)
        right = tuple(ms[i] for i in range(n) if not mask >> i & 1)
        out.add((left, right))
    return out


@functools.lru_cache(maxsize=1 << 16)
def _values(ms: tuple[int, ...], allow_division: bool) -> frozenset[Fraction]:
    """All values of generator trees over the sorted multiset ``ms`` (exact division only)."""
    if len(ms) == 1:
        return frozenset({Fraction(ms[0])})
    out: set[Fraction] = set()
    for left, right in _splits(ms):
        for a in _values(left, allow_division):
            for b in _values(right, allow_division):
                out.update((a + b, a - b, a * b))
                if allow_division and b != 0 and (a / b).denominator == 1:
                    out.add(a / b)
    return frozenset(out)


def reachable_targets(numbers, allow_division: bool) -> set[int]:
    """Every positive integer a generator tree over ``numbers`` (each used once) can produce."""
    values = _values(tuple(sorted(numbers)), allow_division)
    return {int(v) for v in values if v > 0 and v.denominator == 1}


def count_problems(
    num_count: int, max_number: int, allow_division: bool, *, stop_at_heldout: int | None = None
) -> tuple[int, int]:
    """(distinct problems, of which held out) over all multisets, by exhaustive enumeration.

    With ``stop_at_heldout`` it returns as soon as that many held-out problems are found.
    """
    total = held = 0
    for ms in combinations_with_replacement(range(1, max_number + 1), num_count):
        for t in reachable_targets(ms, allow_division):
            total += 1
            held += is_heldout_key(ms, t)
        if stop_at_heldout is not None and held >= stop_at_heldout:
            break
    return total, held


def is_heldout_key(numbers, target: int) -> bool:
    """Whether the problem ``(sorted numbers, target)`` hashes into the held-out bucket."""
    key = " ".join(map(str, sorted(numbers))) + f">{target}"
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_BUCKETS == 0


def format_prompt(numbers, target: int) -> str:
    """``[3, 5, 2], 13 -> "3 5 2>13:"``"""
    return " ".join(map(str, numbers)) + f">{target}:"


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """Inverse of ``format_prompt``; raises ValueError if the prompt is not in that format."""
    m = _PROMPT_RE.match(prompt)
    if m is None:
        raise ValueError(f"not a Countdown prompt: {prompt!r}")
    return [int(x) for x in m.group(1).split(" ")], int(m.group(2))


def solve(numbers, target: int, *, allow_division: bool = False) -> str | None:
    """A minimal-parentheses expression hitting ``target`` with each number once, or None.

    Deterministic; exhaustive over sub-multisets, so meant for small ``numbers`` (≤ 5).
    """
    memo: dict[tuple[int, ...], dict[Fraction, Expr]] = {}

    def exprs(ms: tuple[int, ...]) -> dict[Fraction, Expr]:
        if ms in memo:
            return memo[ms]
        out: dict[Fraction, Expr] = {}
        if len(ms) == 1:
            out[Fraction(ms[0])] = ms[0]
        for lt, rt in sorted(_splits(ms)):  # sorted: a deterministic first-found expression
            for a, ea in exprs(lt).items():
                for b, eb in exprs(rt).items():
                    out.setdefault(a + b, ("+", ea, eb))
                    out.setdefault(a - b, ("-", ea, eb))
                    out.setdefault(a * b, ("*", ea, eb))
                    if allow_division and b != 0:
                        out.setdefault(a / b, ("/", ea, eb))
        memo[ms] = out
        return out

    found = exprs(tuple(sorted(numbers))).get(Fraction(target))
    return None if found is None else to_string(found)


# ---------------------------------------------------------------------------- the task


SAMPLINGS = ("draws", "keys")
"""How `Countdown.sample` picks training problems (its `sampling` knob)."""
PARTIAL_CREDITS = ("parse", "numbers")
"""Which wrong answers earn Countdown's 0.1 (its `partial_credit` knob)."""


def parse_buckets(buckets: str) -> list[tuple[int, int, int]]:
    """``"3:1-20,4:21-99"`` -> [(3, 1, 20), (4, 21, 99)]: (numbers per problem, lowest and highest
    target) per bucket; ``"3:20"`` means targets 1..20. A ValueError naming the knob otherwise.

    >>> parse_buckets("3:20,4:10-50")
    [(3, 1, 20), (4, 10, 50)]
    """
    out = []
    for spec in buckets.split(","):
        try:
            count, targets = spec.strip().split(":")
            low, _, high = targets.rpartition("-")
            out.append((int(count), int(low or 1), int(high)))
        except ValueError:
            out = []
            break
    if not out or any(c < 2 or lo < 1 or hi < lo for c, lo, hi in out) or len(set(out)) != len(out):
        raise ValueError(f"countdown: buckets must be distinct 'COUNT:LOW-HIGH' targets (COUNT >= 2, "
                         f"1 <= LOW <= HIGH), comma-separated, e.g. '3:1-20,4:21-99'; got {buckets!r}")
    return out


def _check_reachable(count: int, max_number: int, allow_division: bool, low: int) -> None:
    """Refuse at once a bucket whose lowest target is above every value its numbers can make. Without
    division a value is at most max(M, 2)^n (a + b <= a·b for a, b >= 2, and a − b <= a), so no draws are
    needed to know; with division the bounded draws of `_draw` decide."""
    top = max(max_number, 2) ** count
    if not allow_division and low > top:
        raise ConfigError(f"task.countdown.buckets: targets from {low} are out of reach of {count} numbers up to "
                          f"{max_number} (at most {top} without division); lower that bucket's targets or raise "
                          f"task.countdown.max_number")


class Countdown:
    """Procedural Countdown task: ``sample`` for training, ``heldout`` for evaluation.

    Knobs: ``num_count`` numbers per problem (3 or 4 are the useful settings), each in
    ``1..max_number``; ``allow_division`` adds exact ``/``; ``heldout_size`` distinct held-out
    problems; ``buckets`` (``"3:1-20,4:21-99"``) makes the task a mixture of difficulty buckets,
    one source each (numbers per problem and target range; ``num_count`` is then unused), drawn
    uniformly by ``sample`` and one at a time by ``sample_source``; ``seed`` seeds the task's own
    generator, used only when ``sample`` gets no rng (``heldout`` never depends on it).
    """

    name = "countdown"

    def __init__(
        self,
        *,
        num_count: int = 3,
        max_number: int = 9,
        allow_division: bool = False,
        heldout_size: int = 200,
        show_work: bool = False,
        ordered: bool = False,
        partial_credit: str = "parse",
        sampling: str = "draws",
        buckets: str = "",
        seed: int = 0,
    ):
        if num_count < 2:
            raise ValueError(f"countdown: num_count must be >= 2, got {num_count}")
        if max_number < 1:
            raise ValueError(f"countdown: max_number must be >= 1, got {max_number}")
        if heldout_size < 0:
            raise ValueError(f"countdown: heldout_size must be >= 0, got {heldout_size}")
        longest = num_count * len(str(max_number)) + (num_count - 1) + 2 * (num_count - 2)
        if longest > MAX_COMPLETION_CHARS:  # n leaves, n-1 operators, at most n-2 paren pairs
            raise ValueError(
                f"countdown: num_count={num_count}, max_number={max_number} allow answers of "
                f"{longest} chars, over MAX_COMPLETION_CHARS={MAX_COMPLETION_CHARS}"
            )
        self.num_count, self.max_number = num_count, max_number
        self.allow_division, self.heldout_size = allow_division, heldout_size
        if partial_credit not in PARTIAL_CREDITS:
            raise ValueError(f"countdown: partial_credit must be 'parse' or 'numbers', got {partial_credit!r}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"countdown: sampling must be 'draws' or 'keys', got {sampling!r}")
        self.show_work, self.ordered, self.partial_credit = show_work, ordered, partial_credit
        self.sampling = sampling
        self._pool: list[list[Example]] | None = None
        self._rng = random.Random(seed)
        self._heldout: list[Example] | None = None
        self._targets: tuple[int, int] | None = None  # a bucket's target range (inclusive)
        self.mixture, self.sources = None, ()
        if buckets:
            specs = parse_buckets(buckets)
            parts = {}
            for (count, low, high), share in zip(specs, heldout_shares(heldout_size, len(specs))):
                part = Countdown(num_count=count, max_number=max_number, allow_division=allow_division,
                                 heldout_size=share, show_work=show_work, ordered=ordered,
                                 partial_credit=partial_credit, sampling=sampling, seed=seed)
                part._targets = (low, high)
                _check_reachable(count, max_number, allow_division, low)
                parts[f"n{count}_t{low}-{high}"] = part
            for part in parts.values():  # a bucket no problem reaches: said now, not at the first step
                part.sample(1, random.Random(seed))
            self.mixture = Mixture(parts)
            self.sources = self.mixture.sources
            return
        self._check_heldout_space()

    def _check_heldout_space(self) -> None:
        """Raise if the held-out bucket has fewer than ``heldout_size`` distinct problems.

        Counts exactly (stopping once enough are found) when the multisets are few enough to
        enumerate; larger spaces hold far more problems than any sensible ``heldout_size``.
        """
        if math.comb(self.max_number + self.num_count - 1, self.num_count) > _EXHAUSTIVE_LIMIT:
            return
        total, held = count_problems(
            self.num_count, self.max_number, self.allow_division, stop_at_heldout=self.heldout_size
        )
        if held < self.heldout_size:
            raise ValueError(
                f"countdown: heldout_size={self.heldout_size} but only {held} of the {total} "
                f"distinct problems (num_count={self.num_count}, max_number={self.max_number}, "
                f"allow_division={self.allow_division}) are in the held-out bucket; lower "
                f"heldout_size or raise max_number / num_count"
            )

    def _draw(self, rng: random.Random) -> Example:
        """One problem from the generator, held-out bucket or not; a bounded number of tries, so a
        bucket whose target range no problem reaches is an error, not an endless loop."""
        for _ in range(MAX_DRAWS):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.num_count)]
            leaves_order = numbers[:]
            if not self.ordered:  # ordered: the prompt lists the numbers in the order a solution uses them
                rng.shuffle(leaves_order)
            expr = _random_expr(leaves_order, rng, self.allow_division)
            value = evaluate(expr)
            if value > 0 and value.denominator == 1:
                target = int(value)
                if self._targets and not self._targets[0] <= target <= self._targets[1]:
                    continue
                return Example(
                    prompt=format_prompt(numbers, target),
                    answer=to_string(expr),
                    meta={"numbers": numbers, "target": target},
                )
        low, high = self._targets or (1, "any")
        raise ConfigError(f"task.countdown.buckets: no problem of {self.num_count} numbers up to {self.max_number} "
                          f"reached a target in {low}-{high} in {MAX_DRAWS} draws; widen that bucket's targets "
                          f"or raise task.countdown.max_number")

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        """``n`` fresh training problems (repeats possible), never in the held-out bucket.

        ``sampling="draws"`` takes the generator's draws as they come, so problems it reaches by
        many routes (small all-``+`` ones) recur often; ``"keys"`` picks a problem key uniformly
        first, as the held-out set does by taking distinct keys, then one of its prompts.
        """
        rng = self._rng if rng is None else rng
        if self.mixture is not None:  # buckets: each example's bucket drawn uniformly
            return self.mixture.sample(n, rng)
        if self.sampling == "keys":
            pool = self._key_pool()
            return [rng.choice(rng.choice(pool)) for _ in range(n)]
        out: list[Example] = []
        for _ in range(MAX_DRAWS + n):
            if len(out) == n:
                return out
            ex = self._draw(rng)
            if not is_heldout_key(ex.meta["numbers"], ex.meta["target"]):
                out.append(ex)
        raise ConfigError(f"task.countdown: every problem drawn ({MAX_DRAWS}) is in the held-out bucket, so none is "
                          f"left to train on; widen the targets (task.countdown.buckets) or raise "
                          f"task.countdown.max_number")

    def sample_source(self, source: str, n: int, rng: random.Random) -> list[Example]:
        """``n`` training problems of bucket ``source`` (one of ``sources``)."""
        return self.mixture.sample_source(source, n, rng)

    def _key_pool(self) -> list[list[Example]]:
        """The distinct prompts of each training key, keys in sorted order, from a fixed number of
        generator draws (built once)."""
        if self._pool is None:
            rng, pool = random.Random(f"{_HELDOUT_SEED}/key-pool"), {}
            for _ in range(KEY_POOL_DRAWS):
                ex = self._draw(rng)
                key = (tuple(sorted(ex.meta["numbers"])), ex.meta["target"])
                if not is_heldout_key(*key):
                    prompts = pool.setdefault(key, {})
                    prompts.setdefault(ex.prompt, ex)
            self._pool = [list(prompts.values()) for _, prompts in sorted(pool.items())]
        return self._pool

    def heldout(self) -> list[Example]:
        """The first ``heldout_size`` distinct held-out-bucket problems from a fixed seed.

        Same generator as training, so the same distribution; depends on the knobs only. With
        buckets: each bucket's share, in bucket order.
        """
        if self.mixture is not None:
            return self.mixture.heldout()
        if self._heldout is None:
            knobs = f"{self.num_count}/{self.max_number}/{self.allow_division}" + ("/ordered" if self.ordered else "")
            rng = random.Random(f"{_HELDOUT_SEED}/{knobs}")  # str seeds are stable across runs
            seen: set[tuple] = set()
            out: list[Example] = []
            misses = 0
            while len(out) < self.heldout_size:
                ex = self._draw(rng)
                key = (tuple(sorted(ex.meta["numbers"])), ex.meta["target"])
                if key in seen or not is_heldout_key(*key):
                    misses += 1
                    if misses > 1_000_000:  # only reachable when the space was too big to count
                        raise ValueError(
                            f"countdown: cannot collect heldout_size={self.heldout_size} problems"
                        )
                    continue
                misses = 0
                seen.add(key)
                out.append(ex)
            self._heldout = out
        # Copies, so a caller mutating meta cannot change the evaluation set.
        return [
            Example(ex.prompt, ex.answer, {**ex.meta, "numbers": list(ex.meta["numbers"])})
            for ex in self._heldout
        ]

    def reward(self, prompt: str, completion: str, /, **example) -> float:
        """Score a completion: 1.0 correct, 0.1 well-formed but wrong, 0.0 malformed.

        Rule: strip surrounding whitespace. If the rest is empty, longer than
        ``MAX_COMPLETION_CHARS``, or does not parse under the grammar of ``parse`` (which has no
        spaces, unary minus or leading zeros, and treats ``/`` as a syntax error unless
        ``allow_division``), the reward is 0.0. Otherwise it is 1.0 when the literals are
        exactly the given numbers as a multiset (each used once) and the exact (Fraction) value
        equals the target, and 0.1 when not: wrong value, numbers missing, reused or extra, or
        a division by zero. Numbers and target come from ``meta`` when given, else from the
        prompt. With ``partial_credit="numbers"`` the 0.1 needs the given numbers too: an
        expression over other numbers (e.g. a bare ``9``, a shortcut small policies find) gets 0.

        >>> task = Countdown()
        >>> [task.reward("3 5 2>13:", c) for c in ("3+5*2", "3*5+2", "3+5+5", "3+5*", "")]
        [1.0, 0.1, 0.1, 0.0, 0.0]
        """
        meta = example.get("meta") or {}
        if "numbers" in meta and "target" in meta:
            numbers, target = meta["numbers"], meta["target"]
        else:
            numbers, target = parse_prompt(prompt)
        if self.show_work:
            return score_steps(completion, numbers, target, allow_division=self.allow_division)
        text = completion.strip()
        if not text or len(text) > MAX_COMPLETION_CHARS:
            return 0.0
        try:
            expr = parse(text, allow_division=self.allow_division)
        except ParseError:
            return 0.0
        if sorted(leaves(expr)) != sorted(numbers):
            return 0.1 if self.partial_credit == "parse" else 0.0
        try:
            value = evaluate(expr)
        except ZeroDivisionError:
            return 0.1
        return 1.0 if value == target else 0.1

    def is_correct(self, completion: str, example: Example) -> bool:
        """Whether ``completion`` earns the full reward on ``example``."""
        score = self.reward(example.prompt, completion, answer=example.answer, meta=example.meta)
        return score == 1.0

    def solution(self, example: Example) -> str:
        """A correct completion: the stored answer when it verifies, else one found by search
        (as a step list when ``show_work``)."""
        answer = steps_from_expr(parse(example.answer)) if self.show_work and example.answer else example.answer
        if answer and self.is_correct(answer, example):
            return answer
        numbers, target = example.meta.get("numbers"), example.meta.get("target")
        if numbers is None or target is None:
            numbers, target = parse_prompt(example.prompt)
        found = solve(numbers, target, allow_division=self.allow_division)
        if found is None:
            raise ValueError(f"countdown: no solution for {example.prompt!r}")
        return steps_from_expr(parse(found)) if self.show_work else found
