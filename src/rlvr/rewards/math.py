"""Math answers: extract the final answer from a completion and decide equivalence.

``math_reward(prompt, completion, answer=...)`` is 1.0 when the extracted answer equals the
reference, 0.0 when it does not, and ``None`` when the reference itself is unusable.

Extraction and plain numbers live in ``rlvr.rewards.answers`` (linear time, bounded: a verifier
reads the last ``MAX_READ_CHARS`` of a completion, answers past ``MAX_ANSWER_CHARS`` and numbers
past ``MAX_NUMBER_CHARS``/``MAX_EXPONENT`` are refused). First rule that matches: the last
``\\boxed{...}`` (balanced braces; several boxes that disagree give no answer), the last
``<answer>X</answer>`` tag, the last ``#### X`` (GSM8K), then, unless ``strict``, the last
"the (final) answer is X" / "Answer: X" and the last number. Strict extraction takes only an
explicit final-answer marker, so text that merely mentions the right number somewhere scores 0
(the lenient fallbacks reward a policy for spraying numbers).

Equivalence, one final answer or nothing: (0) an answer holding several candidate values
(``x = 3 or x = 5``, ``3, 5``, ``\\pm 5``, an interval, ``5 = 3``) is refused against a
reference that is one value, and a multiple-choice reference (one capital letter) takes exactly
one letter; (1) the normalised strings are equal; (2) both are plain numbers (integers,
decimals, ``a/b``, ``\\frac{a}{b}``, percentages, thousands separators) compared as exact
fractions: an integer reference exactly, a decimal reference within half a unit of the last
place it states (never looser than 5e-7, math-verify's six-place rounding); (3) otherwise
symbolic comparison with ``math-verify`` (LaTeX parsing via latex2sympy, sympy simplification)
in a **pool of worker processes** (``rlvr.rewards.math_pool``), each check under a deadline and
each worker under a memory limit: past either, the worker is killed and replaced and the pair
scores as not equal (counted in ``STATS``).

Deviations from math-verify's own ``parse``/``verify`` on raw completions (measured on the
labelled corpus in ``tests/rewards/``; see ``docs/rewards.md``):
1. Extraction is ours (the rules above), so GSM8K ``####`` and "the answer is" are honoured.
2. Only math-verify's LaTeX parser is used, never its sympy ``parse_expr`` path (which
   evaluates Python expressions built from model text); answers are wrapped in ``$...$``.
3. Units and ``\\text{...}`` are dropped, ``%`` is dropped (``50\\%`` equals ``50``, as in most
   GSM8K/MATH graders) and also read as a fraction (``50\\%`` equals ``0.5``).
4. An equation between values (``5 = 3``, ``2 + 3 = 5``), a hedge (``3 \\lor 5``, a set holding
   the reference) and boxes that disagree are refused; math-verify takes the right side, the
   matching member, the last box.
"""

from __future__ import annotations

import re

from rlvr.rewards.answers import (
    MAX_ANSWER_CHARS,
    choice_letter,
    extract_answer,
    normalize_answer,
    numbers_equal,
    parse_number,
    several_values,
    too_large,
)
from rlvr.rewards.math_pool import STATS, symbolic_equal

__all__ = ["extract_answer", "normalize_answer", "parse_number", "math_equal", "math_reward", "STATS"]

_SYMBOLIC = re.compile(r"[\\{}^()\[\]a-zA-Z]")


def _numeric_verdict(p: str, g: str) -> bool | None:
    """True/False when both sides are plain numbers (a percent also read as its bare number), else None."""
    pn, gn = parse_number(p), parse_number(g)
    if pn is not None and gn is not None and numbers_equal(pn, gn):
        return True
    if p.endswith("%") != g.endswith("%"):  # "50%" vs "50": graders usually accept the bare number
        pb, gb = parse_number(p.rstrip("%")), parse_number(g.rstrip("%"))
        if pb is not None and gb is not None and numbers_equal(pb, gb):
            return True
    if pn is not None and (gn is not None or not _SYMBOLIC.search(g)):
        return False
    return None


def math_equal(pred: str | None, gold: str | None, *, timeout_s: float = 5.0) -> bool:
    """Whether two final answers are mathematically the same (see the module doc).

    >>> math_equal("0.5", "\\\\frac{1}{2}"), math_equal("1,000", "1000"), math_equal("3", "4")
    (True, True, False)
    >>> math_equal("x = 3 \\\\text{ or } x = 5", "5"), math_equal("1234568", "1234567"), math_equal("72.0001", "72")
    (False, False, False)
    """
    if pred is None or gold is None or len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return False
    letter = choice_letter(g, reference=True)
    if letter is not None:
        return choice_letter(p, reference=False) == letter
    if several_values(pred) and not several_values(gold):
        return False
    if p == g:
        return True
    verdict = _numeric_verdict(p, g)
    if verdict is not None:
        return verdict
    if too_large(p) or too_large(g):
        return False
    return symbolic_equal(p, g, timeout_s)


def math_reward(prompt: str, completion: str, /, answer: str | None = None, *, strict: bool = False,
                **example) -> float | None:
    """1.0 if the completion's final answer equals ``answer`` (extracted the same way), else 0.0.
    `strict`: the completion's answer only from an explicit marker (`extract_answer`).

    A GSM8K reference ``"...#### 72"`` is reduced to ``72``. ``None`` when there is no reference.

    >>> math_reward("q", "... so the answer is $\\\\frac{6}{4}$.", answer="#### 1.5")
    1.0
    """
    if answer is None or not str(answer).strip():
        return None
    gold = extract_answer(str(answer)) if ("####" in str(answer) or "\\boxed" in str(answer)) else str(answer)
    return 1.0 if math_equal(extract_answer(completion, strict=strict), gold) else 0.0
