"""Final answers in model text: extraction, normalisation, plain numbers, hedges. Linear time.

Model text is hostile: every scan here is a ``str`` method, a single forward pass over brace
positions, or a pattern with possessive quantifiers (``*+``, no backtracking), so no completion
can hold the GIL for long. Bounds, all module constants:

- ``MAX_READ_CHARS``: extraction reads only the last 8192 characters of a completion (a final
  answer is at the end; whatever comes earlier is never looked at);
- ``MAX_ANSWER_CHARS``: an extracted answer longer than 1000 characters is refused (None);
- ``MAX_NUMBER_CHARS`` and ``MAX_EXPONENT``: a number is parsed only when its text has at most
  100 characters and its exponent (``1e400``) at most 400 in size, so no ``Fraction`` or ``int``
  builds a huge power of ten.

One final answer or nothing (`several_values`): a final answer holding more than one candidate
value, such as ``x = 3 or x = 5``, ``3, 5``, ``\\pm 5``, ``[3, 5]``, ``3 \\quad 5`` or ``5 = 3``,
is refused against a reference that is one value; several ``\\boxed{}`` that disagree are refused
by `extract_answer` itself.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction
from typing import NamedTuple

__all__ = ["MAX_ANSWER_CHARS", "MAX_EXPONENT", "MAX_NUMBER_CHARS", "MAX_READ_CHARS", "Number",
           "choice_letter", "extract_answer", "normalize_answer", "numbers_equal", "parse_number",
           "several_values", "too_large"]

MAX_READ_CHARS = 8192
"""Extraction reads only this many characters from the end of a completion."""
MAX_ANSWER_CHARS = 1000
"""An extracted (or reference) answer longer than this is refused."""
MAX_NUMBER_CHARS = 100
"""A plain number is parsed only when its normalised text is at most this long."""
MAX_EXPONENT = 400
"""Scientific notation with a larger exponent (in size) is not a plain number."""

_BRACES = re.compile(r"\\(?:boxed|fbox)\s*+\{|[{}]")
_ANSWER_IS = re.compile(r"(?:final answer|the answer|answer)\s*+(?:is|:|=)\s*+:?\s*+(.+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"-?\d[\d,]*+(?:\.\d++)?+|-?\.\d++")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*+\{([^{}]*+)\}")
_LHS = re.compile(r"(?:[a-zA-Z](?:_\{?+\w++\}?+|\([^()=]{0,20}+\))?+|\\[a-zA-Z]++)\s*+=\s*+")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}+(?:,\d{3})++(?![\d])|(?<![\d.])\d{1,3}+(?: \d{3})++(?![\d])")
_GROUPED = re.compile(r"-?+\d{1,3}+(?:(?:,\d{3})++|(?: \d{3})++)(?:\.\d++)?+")
_OR_WORDS = re.compile(r"\b(?i:or|and)\b|\\(?:pm|mp|lor|vee|cup|quad|qquad|le|ge|leq|geq|lt|gt|neq|ne)(?![a-zA-Z])"
                       r"|[;±∓∪≤≥≠<>]|\\\\")
_SPACED_NUMBERS = re.compile(r"\d(?:\s|\\[,;:! ]|~)++\.?+\d")
_HUGE = re.compile(r"\d{101}|\^\{?+[-+]?+\d{4}|\d[eE][-+]?+\d{4}")
_DIGIT = re.compile(r"\d")
_INT = r"-?+\d++"
_PLAIN = re.compile(r"-?+\d++(?:\.\d++)?+")  # already canonical: normalisation and hedge checks skip it
_FRAC = re.compile(rf"(-?)\\frac\{{({_INT})\}}\{{({_INT})\}}|(-?)\\frac(\d)(\d)")
_RATIO = re.compile(rf"({_INT})/({_INT})")
_DECIMAL = re.compile(r"-?+(\d++)?+(?:\.(\d*+))?+(?:e([-+]?+\d++))?+")
_CHOICE = re.compile(r"\(?+([A-J])\)?+")
_CHOICE_PRED = re.compile(r"\(?+([A-Ja-j])\)?+")
_UNITS = ("dollars", "dollar", "cents", "units", "unit", "degrees", "degree", "meters", "cm", "km", "kg",
          "hours", "hour", "minutes", "minute", "seconds", "inches", "feet", "miles", "mph", "pounds",
          "apples", "people", "students", "days", "years", "sq", "square")
_MINUS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})


class Number(NamedTuple):
    """An exact value, and how many decimal places its text states (None: exact, an integer or a ratio)."""

    value: Fraction
    places: int | None


def _boxes(text: str) -> list[str] | None:
    """Contents of the ``\\boxed{}``/``\\fbox{}`` that hold no other box, in order; None when one is
    too long. One pass over the braces (a stack), so nested and unclosed boxes cost linear time."""
    first, fbox = text.find("\\boxed"), text.find("\\fbox")
    if first < 0 or 0 <= fbox < first:
        first = fbox
    stack, found = [], []
    for m in _BRACES.finditer(text, first):  # braces before the first box never close one
        if m.group() == "}":
            if stack:
                start = stack.pop()
                if start >= 0:
                    found.append((start, m.start()))
        else:
            stack.append(m.end() if m.end() - m.start() > 1 else -1)
    if len(found) > 1:
        found.sort()
        found = [(a, b) for i, (a, b) in enumerate(found) if not (i + 1 < len(found) and found[i + 1][0] < b)]
    if any(b - a > MAX_ANSWER_CHARS for a, b in found):
        return None
    return [text[a:b] for a, b in found]


def _unbraced_box(text: str) -> str | None:
    """``\\boxed 5``: the token after the last ``\\boxed `` when no braced box exists."""
    start = text.rfind("\\boxed ")
    if start < 0:
        return None
    rest = text[start + 7:start + 7 + MAX_ANSWER_CHARS].split(None, 1)
    return rest[0].split("$")[0].strip() if rest else None


def _same_answer(values: list[str]) -> bool:
    norms = {normalize_answer(v) for v in values}
    if len(norms) == 1:
        return True
    numbers = [parse_number(v) for v in norms]
    return None not in numbers and len({n.value for n in numbers}) == 1


def _marker_answer(text: str, strict: bool) -> str | None:
    """The answer after the last ``#### `` (GSM8K), then (unless strict) "the answer is X"; None when
    neither marker is there, "" when a marker is there but gives no single answer."""
    i = text.rfind("####")
    if i >= 0:
        answer = _first_line(text[i + 4:])
        if answer:
            return answer
    if strict:
        return None
    last = None
    for last in _ANSWER_IS.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    content, inner = last.group(1), None
    for inner in _ANSWER_IS.finditer(content):  # noqa: B007 - "Final Answer: The final answer is $X$"
        pass
    if inner is not None:
        if _DIGIT.search(content, 0, inner.start()):
            return ""  # "the answer is 5, not the answer is 6": two answers on one line, no answer
        content = inner.group(1)
    return _first_line(content)


def _first_line(s: str) -> str:
    """The first non-blank line; only its opening ``$...$`` when the rest holds no math or digit
    ("$28$. I hope it is correct.", never "$3$ or $5$")."""
    s = s.lstrip()
    end = s.find("\n")
    line = (s if end < 0 else s[:end]).strip()
    if line.startswith("$") and (close := line.find("$", 1)) > 0:
        rest = line[close + 1:]
        if "$" not in rest and not _DIGIT.search(rest):
            return line[1:close].strip()
    return line.rstrip(".").strip().strip("$").strip()


def extract_answer(text: str, *, strict: bool = False) -> str | None:
    """The final answer in a completion (its last `MAX_READ_CHARS`), or None; `strict`: only from
    ``\\boxed{}``, an ``<answer>`` tag or ``#### X``. Boxes that disagree give None.

    First rule that matches: the last ``\\boxed{...}`` (balanced braces), the last
    ``<answer>X</answer>``, the last ``#### X``; unless ``strict``, the last "the (final) answer
    is X" / "Answer: X", then the last number.

    >>> [extract_answer(t) for t in ("so \\\\boxed{\\\\frac{1}{2}}.", "x\\n#### 1,234", "The answer is 7.",
    ...                              "3 then 4 apples", "\\\\boxed{3} or \\\\boxed{5}")]
    ['\\\\frac{1}{2}', '1,234', '7', '4', None]
    """
    text = text[-MAX_READ_CHARS:]
    answer = _extract(text, strict)
    return answer if answer is None or len(answer) <= MAX_ANSWER_CHARS else None


def _extract(text: str, strict: bool) -> str | None:
    if "\\boxed" in text or "\\fbox" in text:
        boxes = _boxes(text)
        if boxes is None or (boxes and not _same_answer(boxes)):
            return None
        if boxes:
            return boxes[-1].strip()
        unbraced = _unbraced_box(text)
        if unbraced:
            return unbraced
    close = text.rfind("</answer>")
    if close >= 0:
        opened = text.rfind("<answer>", 0, close)
        if opened >= 0 and text[opened + 8:close].strip():
            return text[opened + 8:close].strip()
    answer = _marker_answer(text, strict)
    if answer is not None or strict:
        return answer or None  # a marker that gives no answer never falls back to the last number
    last = None
    for last in _LAST_NUMBER.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    return last.group().rstrip(".,") if last else None  # "... then 4," -> "4"


def _ascii_digits(s: str) -> str:
    """Unicode minus signs to ``-`` and decimal digits of any script to ASCII (never ``²`` or ``½``)."""
    if s.isascii():
        return s
    s = s.translate(_MINUS)
    return "".join(str(unicodedata.digit(c)) if unicodedata.category(c) == "Nd" else c for c in s)


def normalize_answer(s: str) -> str:
    """Canonical text form: no ``$``, spacing, ``\\left``/``\\right``, units, ``\\text``, trailing dot,
    a leading ``x =`` (one variable), thousands separators; ASCII digits and minus signs.

    >>> normalize_answer("$\\\\dfrac{3}{4}\\\\text{ cm}$"), normalize_answer("\\\\$1,000.00"), normalize_answer("x = 5")
    ('\\\\frac{3}{4}', '1000.00', '5')
    """
    s = _ascii_digits(s[:MAX_ANSWER_CHARS + 1].strip().strip("$").strip())
    if _PLAIN.fullmatch(s):
        return s
    s = s.replace("\\$", "").replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("{,}", ",")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "").replace("\\%", "%")
    s = _TEXT.sub(lambda m: "" if m.group(1).strip().lower() in _UNITS or not m.group(1).strip() else m.group(1), s)
    lhs = _LHS.match(s)  # "x = 5", "y_1 = 5", "f(3) = 5", "\theta = 5" -> the value
    if lhs:
        s = s[lhs.end():]
    words = s.split()
    while len(words) > 1 and words[-1].lower().rstrip(".") in _UNITS:
        words.pop()
    s = " ".join(words).rstrip(".").strip()
    if _GROUPED.fullmatch(s):
        s = s.replace(",", "").replace(" ", "")
    return s.replace(" ", "")


def parse_number(s: str) -> Number | None:
    """A plain number (integer, decimal, ``a/b``, ``\\frac{a}{b}``, percent) as an exact value and the
    decimal places its text states; None for anything else, or past the size caps.

    >>> parse_number("\\\\frac{3}{4}"), parse_number("-2.50"), parse_number("50%"), parse_number("1e999999999")
    (Number(value=Fraction(3, 4), places=None), Number(value=Fraction(-5, 2), places=2), \
Number(value=Fraction(1, 2), places=None), None)
    """
    s = normalize_answer(s)
    if not s or len(s) > MAX_NUMBER_CHARS or not s.isascii():
        return None
    percent = s.endswith("%")
    s = s[:-1] if percent else s
    try:
        number = _plain_number(s)
    except ZeroDivisionError:
        return None
    if number is None or not percent:
        return number
    return Number(number.value / 100, None if number.places is None else number.places + 2)


def _plain_number(s: str) -> Number | None:
    if m := _FRAC.fullmatch(s):
        sign, a, b = (m.group(1), m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5), m.group(6))
        return Number(Fraction(int(a), int(b)) * (-1 if sign else 1), None)
    if m := _RATIO.fullmatch(s):
        return Number(Fraction(int(m.group(1)), int(m.group(2))), None)
    m = _DECIMAL.fullmatch(s.lstrip("+"))
    if not m or not (m.group(1) or m.group(2)):
        return None
    exponent = int(m.group(3) or 0)
    if abs(exponent) > MAX_EXPONENT:
        return None
    places = len(m.group(2) or "") - exponent if (m.group(2) is not None or m.group(3)) else None
    return Number(Fraction(s.lstrip("+")), None if places is None else max(places, 0))


def numbers_equal(pred: Number, gold: Number) -> bool:
    """Equal exactly; or, for a non-integer reference, within the precision it states: half a unit
    of its last decimal place, never looser than math-verify's six-place rounding (5e-7).

    >>> g = parse_number("0.3333333")
    >>> numbers_equal(parse_number("1/3"), g), numbers_equal(parse_number("72.0001"), parse_number("72"))
    (True, False)
    """
    if pred.value == gold.value:
        return True
    if gold.value.denominator == 1 and not gold.places:
        return False  # integers compare exactly
    tolerance = Fraction(1, 2 * 10**6)
    if gold.places is not None:
        tolerance = min(tolerance, Fraction(1, 2 * 10**gold.places))
    return abs(pred.value - gold.value) < tolerance


def several_values(answer: str) -> bool:
    """Whether an answer holds more than one candidate value: a separator (a comma that is not a
    thousands separator, "or", "and", ``;``, ``\\pm``, ``\\cup``, ``\\quad``, a line break), an
    inequality, two numbers side by side, or an equation left after the variable (``5 = 3``).

    >>> [several_values(a) for a in ("x = 3 or x = 5", "1,234", "(1, 2)", "\\\\pm 2", "5 = 3", "y = 7", "3 5")]
    [True, False, True, True, True, False, True]
    """
    if _PLAIN.fullmatch(answer):
        return False
    s = _ascii_digits(answer[:MAX_ANSWER_CHARS + 1]).replace("\\,", "").replace("{,}", ",").replace("$", "")
    s = _THOUSANDS.sub("0", s)
    if "," in s or _OR_WORDS.search(s) or _SPACED_NUMBERS.search(s):
        return True
    lhs = _LHS.match(s.strip())
    return "=" in (s.strip()[lhs.end():] if lhs else s)


def too_large(answer: str) -> bool:
    """Whether an answer holds a literal past the caps: a digit run over 100, or an exponent of four
    or more digits (``1e99999999``, ``10^{1000}``); such answers are refused, never handed to sympy.

    >>> too_large("1e99999999"), too_large("10^{1000}"), too_large("2^{10}")
    (True, True, False)
    """
    return _HUGE.search(answer) is not None


def choice_letter(normalized: str, *, reference: bool) -> str | None:
    """The letter of a normalised multiple-choice answer (``C``, ``(C)``), None if not exactly one
    letter; a reference must be a capital A-J, a prediction may be lower case.

    >>> choice_letter("(C)", reference=True), choice_letter("c", reference=False), choice_letter("CD", reference=False)
    ('C', 'C', None)
    """
    m = (_CHOICE if reference else _CHOICE_PRED).fullmatch(normalized)
    return m.group(1).upper() if m else None
