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
in a **separate worker process with a wall-clock limit**: sympy can hang on adversarial input,
``signal.alarm`` only works in the main thread, so the parent kills and restarts the worker on
timeout and scores the pair as not equal (counted in ``STATS``).

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

import atexit
import json
import os
import re
import selectors
import subprocess
import sys
import threading

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

__all__ = ["extract_answer", "normalize_answer", "parse_number", "math_equal", "math_reward", "STATS"]

STATS = {"symbolic_checks": 0, "timeouts": 0, "worker_restarts": 0}
"""Process-wide counters: how often the worker was asked, timed out, restarted."""

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
    return _WORKER.equal(p, g, timeout_s)


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


class _Worker:
    """A long-lived ``python -m rlvr.rewards._math_worker`` child answering one pair at a time."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        STATS["worker_restarts"] += self.proc is not None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "rlvr.rewards._math_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        if self._readline(60.0) != "ready":
            self._kill()
            raise RuntimeError("math worker failed to start")

    def _readline(self, timeout_s: float) -> str | None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return None
        line = self.proc.stdout.readline()
        return line.strip() if line else None

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def equal(self, pred: str, gold: str, timeout_s: float) -> bool:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            STATS["symbolic_checks"] += 1
            self.proc.stdin.write(json.dumps({"pred": pred, "gold": gold}) + "\n")
            self.proc.stdin.flush()
            line = self._readline(timeout_s)
            if line is None:
                STATS["timeouts"] += 1
                self._kill()
                return False
            try:
                return bool(json.loads(line)["equal"])
            except (ValueError, KeyError):
                return False

    def close(self) -> None:
        with self.lock:
            self._kill()


_WORKER = _Worker()
atexit.register(_WORKER.close)

