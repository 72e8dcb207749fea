"""The math verifier on a labelled corpus: no wrong answer passes, every right one refused is known.

``math_corpus.jsonl``: one row per (completion, reference, expected verdict, category). Categories:
GSM8K-style honest answers and near misses, hedges (several candidate values in one final answer),
disagreeing boxes, LaTeX variants (MATH style, and facts from math-verify's and verl's own test
tables), unicode digits and minus signs, multiple choice, the reference's precision, garbage under
strict extraction, empty answers, and right answers refused by design (``why`` says each reason).
``bench/math_corpus.py`` prints the table that ``docs/results/rewards.md`` records.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlvr.rewards.math import math_reward

ROWS = [json.loads(line) for line in (Path(__file__).parent / "math_corpus.jsonl").read_text("utf-8").splitlines()]
KINDS = {"gsm8k-honest", "gsm8k-near-miss", "hedge", "hedge-boxes", "boxes-agree", "latex-honest",
         "latex-near-miss", "unicode", "choice", "precision", "strict-garbage", "empty", "refused-by-design"}


def _ours(row: dict) -> bool:
    return math_reward("q", row["completion"], answer=row["reference"], strict=row.get("strict", False)) == 1.0


@pytest.fixture(scope="module")
def verdicts() -> list[bool]:
    return [_ours(row) for row in ROWS]


def test_corpus_is_large_and_covers_every_category():
    assert len(ROWS) >= 400
    assert {row["kind"] for row in ROWS} == KINDS
    assert sum(not row["expected"] for row in ROWS) >= 200  # wrong answers: what a false pass would need


def test_no_wrong_answer_passes(verdicts):
    false_passes = [row for row, ok in zip(ROWS, verdicts) if ok and not row["expected"]]
    assert false_passes == []


def test_every_false_rejection_is_a_documented_refusal(verdicts):
    rejected = [row for row, ok in zip(ROWS, verdicts) if row["expected"] and not ok]
    assert [row["kind"] for row in rejected] == ["refused-by-design"] * len(rejected)
    assert 0 < len(rejected) <= 10
    assert all(row["why"] for row in rejected)


def test_agreement_with_math_verify(verdicts):
    from math_verify import parse, verify

    logging.disable(logging.CRITICAL)
    try:
        theirs = [bool(verify(parse(f"${row['reference']}$"), parse(row["completion"]))) for row in ROWS]
    finally:
        logging.disable(logging.NOTSET)
    agree = sum(a == b for a, b in zip(verdicts, theirs))
    # math-verify passes hedges (a set holding the reference, an equation's right side, the last of
    # several boxes) and any last number; rlvr refuses them: that is most of the disagreement
    their_false_passes = sum(t and not row["expected"] for t, row in zip(theirs, ROWS))
    assert their_false_passes >= 50
    assert agree >= 0.7 * len(ROWS)
