"""Math answers: extract the final answer from a completion and decide equivalence.

``math_reward(prompt, completion, answer=...)`` is 1.0 when the extracted answer equals the
reference, 0.0 when it does not, and ``None`` when the reference itself is unusable.

Extraction, first rule that matches: the last ``\\boxed{...}`` (balanced braces), the last
``<answer>X</answer>`` tag, the last ``#### X`` (GSM8K), then, unless ``strict``, the last
"the (final) answer is X" / "Answer: X" and the last number. Strict extraction takes only an
explicit final-answer marker, so text that merely mentions the right number somewhere scores 0
(the lenient fallbacks reward a policy for spraying numbers).

Equivalence, cheapest first: (1) the normalised strings are equal; (2) both are plain numbers
(integers, decimals, ``a/b``, ``\\frac{a}{b}``, percentages, thousands separators) compared
exactly as fractions, with a relative tolerance of 1e-6 when either side is a rounded decimal;
(3) otherwise symbolic comparison with ``math-verify`` (LaTeX parsing via latex2sympy, sympy
simplification) in a **pool of worker processes** (``rlvr.rewards.math_pool``), each check under
a deadline and each worker under a memory limit: past either, the worker is killed and replaced
and the pair scores as not equal (counted in ``STATS``).

Deviations from math-verify's own ``parse``/``verify`` on raw completions:
1. Extraction is ours (the rules above), so GSM8K ``####`` and "the answer is" are honoured.
2. Only math-verify's LaTeX parser is used, never its sympy ``parse_expr`` path (which
   evaluates Python expressions built from model text); answers are wrapped in ``$...$``.
3. Units and ``\\text{...}`` are dropped, ``%`` is dropped (``50\\%`` equals ``50``, as in most
   GSM8K/MATH graders) and also read as a fraction (``50\\%`` equals ``0.5``).
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr.rewards.math_pool import STATS, symbolic_equal

__all__ = ["extract_answer", "normalize_answer", "parse_number", "math_equal", "math_reward", "STATS"]

_NUM = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
_ANSWER_IS = re.compile(r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LAST_NUMBER = re.compile(_NUM)
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_UNITS = ("dollars", "dollar", "cents", "units", "unit", "degrees", "degree", "meters", "cm", "km", "kg",
          "hours", "hour", "minutes", "minute", "seconds", "inches", "feet", "miles", "mph", "pounds",
          "apples", "people", "students", "days", "years", "sq", "square")


def _last_boxed(text: str) -> str | None:
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start:].split(None, 1)  # "\boxed 5"
        return rest[1].split("$")[0].strip() if len(rest) > 1 else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def extract_answer(text: str, *, strict: bool = False) -> str | None:
    """The final answer in a completion, or None; `strict`: only from ``\\boxed{}``, an
    ``<answer>`` tag or ``#### X``.

    >>> [extract_answer(t) for t in ("so \\\\boxed{\\\\frac{1}{2}}.", "x\\n#### 1,234", "The answer is 7.",
    ...                              "3 then 4 apples")]
    ['\\\\frac{1}{2}', '1,234', '7', '4']
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tagged = _ANSWER_TAG.findall(text)
    if tagged and tagged[-1].strip():
        return tagged[-1].strip()
    for pattern in (_HASHES,) if strict else (_HASHES, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            answer = found[-1].strip().splitlines()[0].strip() if found[-1].strip() else ""
            answer = answer.rstrip(".").strip().strip("$").strip()
            if answer:
                return answer
    if strict:
        return None
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].rstrip(".") if numbers else None


def normalize_answer(s: str) -> str:
    """Canonical text form: no ``$``, spacing, ``\\left``/``\\right``, units, ``\\text``, trailing dot.

    >>> normalize_answer("$\\\\dfrac{3}{4}\\\\text{ cm}$"), normalize_answer("\\\\$1,000.00"), normalize_answer("x = 5")
    ('\\\\frac{3}{4}', '1000.00', '5')
    """
    s = s.strip().strip("$").strip()
    s = s.replace("\\$", "").replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "").replace("\\%", "%")
    s = _TEXT.sub(lambda m: "" if m.group(1).strip().lower() in _UNITS or not m.group(1).strip() else m.group(1), s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5" (single variable only)
    words = s.split()
    while len(words) > 1 and words[-1].lower().rstrip(".") in _UNITS:
        words.pop()
    s = " ".join(words).rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s.replace(" ", "")


def parse_number(s: str) -> tuple[Fraction, bool] | None:
    """A plain number as an exact Fraction, and whether it was a (possibly rounded) decimal.

    >>> parse_number("\\\\frac{3}{4}"), parse_number("-2.50"), parse_number("50%"), parse_number("x")
    ((Fraction(3, 4), False), (Fraction(-5, 2), True), (Fraction(1, 2), False), None)
    """
    s = normalize_answer(s)
    percent = s.endswith("%")
    s = s.rstrip("%")
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?)\\frac(\d)(\d)", s)
    try:
        if m:
            value, decimal = Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1), False
        elif re.fullmatch(r"-?\d+/-?\d+", s):
            a, b = s.split("/")
            value, decimal = Fraction(int(a), int(b)), False
        elif re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e-?\d+)?", s) and len(s) < 100:
            value, decimal = Fraction(s), "." in s or "e" in s
        else:
            return None
    except (ZeroDivisionError, ValueError):
        return None
    return (value / 100 if percent else value), decimal


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    if a[0] == b[0]:
        return True
    if a[1] or b[1]:
        return abs(a[0] - b[0]) <= Fraction(1, 10**6) * max(1, abs(b[0]))
    return False


def math_equal(pred: str | None, gold: str | None, *, timeout_s: float = 5.0) -> bool:
    """Whether two final answers are mathematically the same (see the module doc).

    >>> math_equal("0.5", "\\\\frac{1}{2}"), math_equal("1,000", "1000"), math_equal("3", "4")
    (True, True, False)
    """
    if pred is None or gold is None:
        return False
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return False
    if p == g:
        return True
    pn, gn = parse_number(p), parse_number(g)
    if pn is not None and gn is not None and _numbers_equal(pn, gn):
        return True
    if p.endswith("%") != g.endswith("%"):  # "50%" vs "50": graders usually accept the bare number
        pb, gb = parse_number(p.rstrip("%")), parse_number(g.rstrip("%"))
        if pb is not None and gb is not None and _numbers_equal(pb, gb):
            return True
    if pn is not None and gn is not None:
        return False
    if pn is not None and gn is None and not re.search(r"[\\{}^()\[\]a-zA-Z]", g):
        return False
    if len(p) > 2000 or len(g) > 2000:
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
