"""Countdown with shown work: the completion lists the operations one at a time.

``"5*2=10,10+3=13"`` for prompt ``"3 5 2>13:"``. Each step combines two numbers of the pool
(the given numbers plus earlier results, each usable once) and writes the result, which joins
the pool. It is the same game as the bare expression (a step list is a post-order walk of the
expression tree), written so that a small model can check its arithmetic as it goes: every
intermediate value is on the page instead of in the hidden state.

Why it exists: at the 1M-parameter scale, RL on bare expressions sharpens the warm start on the
training problems but does not move held-out accuracy (docs/results.md); with shown work, what
RL teaches (small arithmetic facts and "which operation reaches the target from here") transfers
to unseen problems.
"""

from __future__ import annotations

import re
from fractions import Fraction

STEP_RE = re.compile(r"^(-?\d+)([+\-*/])(-?\d+)=(-?\d+)$")
MAX_STEPS_CHARS = 96


def steps_from_expr(expr) -> str:
    """Post-order step list of an expression tree (int leaf or (op, left, right))."""
    steps: list[str] = []

    def walk(node) -> Fraction:
        if isinstance(node, int):
            return Fraction(node)
        op, left, right = node
        a, b = walk(left), walk(right)
        value = {"+": a + b, "-": a - b, "*": a * b}.get(op) if op != "/" else a / b
        steps.append(f"{_show(a)}{op}{_show(b)}={_show(value)}")
        return value

    walk(expr)
    return ",".join(steps)


def _show(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _apply(op: str, a: int, b: int) -> Fraction | None:
    if op == "/":
        return None if b == 0 else Fraction(a, b)
    return Fraction({"+": a + b, "-": a - b, "*": a * b}[op])


def score_steps(text: str, numbers: list[int], target: int, *, allow_division: bool) -> float:
    """1.0 correct, 0.1 well-formed but wrong, 0.0 malformed.

    Well-formed: comma-separated steps ``a<op>b=c`` with integer literals (an optional leading
    minus), ``/`` only when division is allowed. Correct: every step's arithmetic is exact and
    true, each operand is taken from the pool (the given numbers plus earlier results, each used
    once), there are exactly len(numbers) - 1 steps, and the last result equals the target.

    >>> [score_steps(t, [3, 5, 2], 13, allow_division=False)
    ...  for t in ("5*2=10,10+3=13", "5*2=10,10+3=14", "5*2=11,11+2=13", "5*2=10", "5x2")]
    [1.0, 0.1, 0.1, 0.1, 0.0]
    """
    text = text.strip()
    if not text or len(text) > MAX_STEPS_CHARS:
        return 0.0
    parsed = []
    for step in text.split(","):
        m = STEP_RE.match(step)
        if m is None or (m.group(2) == "/" and not allow_division):
            return 0.0
        parsed.append((m.group(2), int(m.group(1)), int(m.group(3)), int(m.group(4))))
    pool = list(numbers)
    for op, a, b, c in parsed:
        for operand in (a, b):
            if operand not in pool:
                return 0.1
            pool.remove(operand)
        if _apply(op, a, b) != c:
            return 0.1
        pool.append(c)
    return 1.0 if len(parsed) == len(numbers) - 1 and pool == [target] else 0.1
