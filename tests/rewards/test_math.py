"""Math answer extraction and equivalence: a table of (prediction, reference, equal?)."""

from __future__ import annotations

import random
import string

import pytest

from rlvr.rewards import math as m

EQUIV = [
    # integers, separators, signs
    ("72", "72", True), ("1,000", "1000", True), ("1000", "1,000", True), ("-3", "-3", True),
    ("+5", "5", True), ("007", "7", True), ("12", "21", False), ("1,000,000", "1000000", True),
    # decimals and fractions
    ("0.5", "\\frac{1}{2}", True), ("\\frac12", "0.5", True), ("1/2", "0.5", True), ("2/4", "\\frac{1}{2}", True),
    ("\\dfrac{3}{4}", "0.75", True), ("\\tfrac{3}{4}", "3/4", True), ("-\\frac{1}{2}", "-0.5", True),
    ("1/3", "0.333", False), ("1/3", "0.3333333", True), ("2.50", "2.5", True), ("2.5", "5/2", True),
    ("0.1", "0.10", True), ("3.0", "3", True), ("1e3", "1000", True), ("0.5", "0.51", False),
    ("\\frac{1}{3}", "\\frac{2}{6}", True), ("\\frac{1}{2}", "\\frac{1}{3}", False),
    # percent, currency, units
    ("50\\%", "50", True), ("50%", "0.5", True), ("75\\%", "\\frac{3}{4}", True), ("11%", "10", False),
    ("\\$18", "18", True), ("18 dollars", "18", True), ("5\\text{ cm}", "5", True), ("90^\\circ", "90", True),
    ("12 apples", "12", True), ("\\$1,200.00", "1200", True),
    # LaTeX and symbolic
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True), ("3\\sqrt{3}", "\\sqrt{27}", True), ("2^{10}", "1024", True),
    ("x^2+2x+1", "(x+1)^2", True), ("2\\pi", "\\pi \\cdot 2", True), ("\\pi", "3.14159", False),
    ("\\sqrt{8}", "2\\sqrt{2}", True), ("\\frac{\\pi}{2}", "\\pi/2", True), ("e^{0}", "1", True),
    ("\\left(1,2\\right)", "(1,2)", True), ("x = 5", "5", True), ("\\boxed{5}", "5", True),
    # intervals and sets
    ("[1,2)", "[1, 2)", True), ("(1,2]", "[1,2)", False), ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("\\{1,2\\}", "\\{2,1\\}", True), ("(0,1)", "(0,2)", False), ("[0,\\infty)", "[0, \\infty)", True),
    # wrong answers that look right
    ("73", "72", False), ("7.2", "72", False), ("-72", "72", False), ("720", "72", False),
    ("\\frac{1}{2}", "2", False), ("\\sqrt{3}", "3", False), ("x+1", "x-1", False), ("2x", "x^2", False),
    # empty and junk
    ("", "5", False), ("abc", "5", False), ("5", "", False), (None, "5", False),
]


@pytest.mark.parametrize("pred,gold,expected", EQUIV)
def test_equivalence_table(pred, gold, expected):
    assert m.math_equal(pred, gold) is expected


def test_table_is_large_enough():
    assert len(EQUIV) >= 60


@pytest.mark.parametrize("text,answer", [
    ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{a} then \\boxed{\\{1, 2\\}}", None),  # boxes that disagree: no final answer
    ("\\boxed{0.5} so \\boxed{\\frac12}", "\\frac12"),  # boxes that agree: the last
    ("steps\n#### 1,234", "1,234"),
    ("The answer is 7.", "7"),
    ("Final answer: $42$", "42"),
    ("3 apples then 4 apples", "4"),
    ("no numbers here", None),
    ("\\boxed{\\frac{a}{b}", None),  # unbalanced: falls back to the last number (none)
])
def test_extract_answer(text, answer):
    assert m.extract_answer(text) == answer


def test_math_reward_gsm8k_reference():
    gold = "6 packs hold 6*19 = 114.\n35+114 = 149\n#### 149"
    assert m.math_reward("q", "Adding gives 149. The answer is 149.", answer=gold) == 1.0
    assert m.math_reward("q", "The answer is 148.", answer=gold) == 0.0
    assert m.math_reward("q", "whatever", answer=None) is None


def test_strict_mode_scores_garbage_holding_the_right_number_zero():
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + " .,:;()+-*=\n"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) + " 72" for _ in range(300)]
    texts = [t for t in texts if "answer" not in t.lower()]
    assert len(texts) > 250
    assert [m.math_reward("q", t, answer="#### 72", strict=True) for t in texts] == [0.0] * len(texts)
    # the lenient fallback (the last number) gives the same garbage full marks
    assert [m.math_reward("q", t, answer="#### 72") for t in texts] == [1.0] * len(texts)
    assert m.math_reward("q", "garbage 13 \\boxed{72} 13", answer="#### 72", strict=True) == 1.0
    assert m.math_reward("q", "<answer>72</answer> 13", answer="#### 72", strict=True) == 1.0
    assert m.extract_answer("The answer is 72.", strict=True) is None


# One final answer or nothing: (prediction, reference, equal?)
ONE_ANSWER = [
    ("x = 3 \\text{ or } x = 5", "5", False), ("3 or 5", "5", False), ("3, 5", "5", False), ("3; 5", "5", False),
    ("3 \\quad 5", "5", False), ("3 5", "35", False), ("\\pm 5", "5", False), ("[3, 5]", "5", False),
    ("\\{3, 5\\}", "5", False), ("3 \\le x \\le 5", "5", False), ("5 = 3", "3", False), ("2 + 3 = 5", "5", False),
    ("x = 5", "5", True), ("f(3) = 5", "5", True), ("y_1 = 5", "5", True), ("x = 3, 5", "3, 5", True),
    ("(C)", "C", True), ("\\text{(C)}", "C", True), ("c", "C", True), ("C or D", "C", False), ("CD", "C", False),
    ("(C) 42", "C", False), ("D", "C", False),
    # integers exact; decimals within the reference's stated precision, never looser than 5e-7
    ("1234568", "1234567", False), ("1,234,568", "1234567", False), ("72.0001", "72", False),
    ("71.99999", "72", False), ("72.0000001", "72", False), ("72.0", "72", True), ("7.2e1", "72", True),
    ("\\frac{1}{3}", "0.3333333", True), ("0.333333", "\\frac{1}{3}", True), ("0.3333", "\\frac{1}{3}", False),
    ("0.46", "0.5", False), ("0.5000001", "0.5", True),
    # unicode minus signs and digits; never superscripts
    ("\u22125", "-5", True), ("\u0664\u0662", "42", True), ("\uff15\uff10", "50", True), ("10\u00b2", "102", False),
    # literals past the caps are refused before any Fraction or sympy sees them
    ("1e99999999", "72", False), ("10^{99999}", "72", False), ("1" * 101, "72", False),
]


@pytest.mark.parametrize("pred,gold,expected", ONE_ANSWER)
def test_one_final_answer_or_nothing(pred, gold, expected):
    assert m.math_equal(pred, gold) is expected


@pytest.mark.parametrize("text", [
    "the answer is 5, not the answer is 6",  # two answers on one line: no answer, no fallback
    "Either \\boxed{5} or \\boxed{6}",
    "<answer>5</answer> #### 6 \\boxed{5} \\boxed{6}",
])
def test_extraction_refuses_two_answers(text):
    assert m.math_reward("q", text, answer="6") == 0.0
    assert m.math_reward("q", text, answer="5") == 0.0


def test_minerva_final_answer_line():
    text = "So it is 28.\nFinal Answer: The final answer is $28\\%$. I hope it is correct."
    assert m.extract_answer(text) == "28\\%"
    assert m.extract_answer("Final Answer: The final answer is $3$ or $5$.") == "3$ or $5"  # then refused
    assert m.math_reward("q", "Final Answer: The final answer is $3$ or $5$.", answer="5") == 0.0


def test_answers_doctests():
    import doctest

    from rlvr.rewards import answers

    result = doctest.testmod(answers)
    assert result.failed == 0 and result.attempted >= 8
