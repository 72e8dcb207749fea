"""Countdown: verifier vectors, generator invariants, held-out split, determinism."""

from __future__ import annotations

import ast
import collections
import dataclasses
import doctest
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.tasks import TASKS, make_task
from rlvr.tasks import countdown as cd
from rlvr.tasks.countdown import Countdown, evaluate, is_heldout_key, parse, to_string
from rlvr.types import Example


def key(ex: Example) -> tuple:
    return tuple(sorted(ex.meta["numbers"])), ex.meta["target"]


@pytest.fixture(scope="module")
def task() -> Countdown:
    return Countdown()


# 3 5 2 -> 13: 3+5*2 = 13
EX = Example("3 5 2>13:", "3+5*2", {"numbers": [3, 5, 2], "target": 13})


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("3+5*2", 1.0),
        ("2*5+3", 1.0),  # any order of the numbers
        ("(5*2)+3", 1.0),  # redundant parentheses are fine
        ("((3+(5*2)))", 1.0),
        (" 3+5*2\n", 1.0),  # surrounding whitespace is stripped
        ("3*5+2", 0.1),  # 17: well-formed, wrong value
        ("(3+5)*2", 0.1),  # 16
        ("3+5+5", 0.1),  # 13, but 5 reused and 2 missing
        ("3+5*2+0", 0.1),  # 13, extra number
        ("3+5*2*1", 0.1),  # 13, extra number
        ("13", 0.1),  # the target itself
        ("", 0.0),
        ("   ", 0.0),
        ("abc", 0.0),
        ("3+5*2=13", 0.0),  # trailing junk
        ("3 + 5 * 2", 0.0),  # no spaces inside
        ("(3+5*2", 0.0),  # unbalanced
        ("3+5*2)", 0.0),
        ("()", 0.0),
        ("3+*5*2", 0.0),
        ("-3+5*2+6", 0.0),  # no unary minus
        ("03+5*2", 0.0),  # no leading zeros
        ("3+5*02", 0.0),
        ("３+5*2", 0.0),  # non-ASCII digit
        ("3+5*2/1", 0.0),  # '/' is a syntax error when division is off
        ("3+5**2", 0.0),
    ],
)
def test_reward_vectors(task, completion, expected):
    assert task.reward(EX.prompt, completion, answer=EX.answer, meta=EX.meta) == expected


def test_missing_number_hits_target():
    task = Countdown()
    ex = Example("1 9 4>13:", "9+4*1", {"numbers": [1, 9, 4], "target": 13})
    assert task.reward(ex.prompt, "9+4*1", meta=ex.meta) == 1.0
    assert task.reward(ex.prompt, "9+4", meta=ex.meta) == 0.1  # 13 without the 1


def test_division_rules():
    task = Countdown(allow_division=True)
    meta = {"numbers": [6, 3, 3], "target": 6}
    assert task.reward("6 3 3>6:", "6/3*3", meta=meta) == 1.0
    # Division by zero is well-formed but wrong.
    assert task.reward("6 3 3>6:", "6/(3-3)", meta=meta) == 0.1
    # Exact arithmetic: 1/3 is a Fraction, so 1/3*3 is exactly 1 (no float rounding).
    assert task.reward("1 3 3>1:", "1/3*3", meta={"numbers": [1, 3, 3], "target": 1}) == 1.0
    extra = {"numbers": [1, 3, 3], "target": 1}
    assert task.reward("1 3 3>1:", "1/3*3*3", meta=extra) == 0.1  # an extra 3, and = 3
    assert task.reward("1 3 6>2:", "1/3*6", meta={"numbers": [1, 3, 6], "target": 2}) == 1.0
    assert task.reward("7 2 2>7:", "7/2*2", meta={"numbers": [7, 2, 2], "target": 7}) == 1.0


def test_reward_reads_prompt_without_meta(task):
    assert task.reward("3 5 2>13:", "3+5*2") == 1.0
    assert task.reward("3 5 2>13:", "3+5+2") == 0.1
    assert task.is_correct("3+5*2", EX) and not task.is_correct("3+5+2", EX)


def test_reward_accepts_example_fields(task):
    # Callers may splat the whole Example, prompt included: prompt and completion are
    # positional-only, so the duplicate keys land in **example.
    assert task.reward(EX.prompt, "3+5*2", **dataclasses.asdict(EX)) == 1.0
    assert task.reward(EX.prompt, "3+5*2", completion="x", prompt="y") == 1.0


def test_length_bound(task, monkeypatch):
    padded = "(" * 29 + "3+5*2" + ")" * 29  # 63 chars: still scored
    assert task.reward(EX.prompt, padded, meta=EX.meta) == 1.0
    too_long = "(" * 30 + "3+5*2" + ")" * 30  # 65 chars
    assert task.reward(EX.prompt, too_long, meta=EX.meta) == 0.0
    parsed = []
    monkeypatch.setattr(cd, "parse", lambda text, **kw: parsed.append(text) or parse(text, **kw))
    for hostile in ("(" * 10**6, "9" * 10**6, "9*" * 10**6 + "9"):
        assert task.reward(EX.prompt, hostile, meta=EX.meta) == 0.0
    assert parsed == []  # rejected on length, before the parser sees a character
    # The length bound applies after stripping.
    assert task.reward(EX.prompt, " " * 10**6 + "3+5*2", meta=EX.meta) == 1.0
    assert parsed == ["3+5*2"]


# ---------------------------------------------------------------------------- printing / parsing


@pytest.mark.parametrize(
    "expr, text",
    [
        (("-", 9, ("-", 5, 2)), "9-(5-2)"),
        (("-", ("-", 9, 5), 2), "9-5-2"),
        (("+", 3, ("-", 5, 2)), "3+5-2"),  # same value without parentheses
        (("*", 3, ("+", 5, 2)), "3*(5+2)"),
        (("*", ("+", 3, 5), 2), "(3+5)*2"),
        (("+", 3, ("*", 5, 2)), "3+5*2"),
        (("/", 8, ("*", 2, 2)), "8/(2*2)"),
        (("/", ("*", 8, 2), 2), "8*2/2"),
        (("*", 8, ("/", 4, 2)), "8*4/2"),
        (("-", ("*", 2, 3), ("*", 4, 5)), "2*3-4*5"),
        (("*", ("-", 2, 3), ("-", 4, 5)), "(2-3)*(4-5)"),
    ],
)
def test_minimal_parentheses(expr, text):
    assert to_string(expr) == text
    assert evaluate(parse(text)) == evaluate(expr)


def test_parse_is_left_associative():
    assert parse("9-5-2") == ("-", ("-", 9, 5), 2)
    assert evaluate(parse("8/2/2")) == 2
    assert evaluate(parse("2+3*4-5")) == 9


def test_round_trip_random_trees():
    rng = random.Random(0)
    for _ in range(3000):
        numbers = [rng.randint(0, 12) for _ in range(rng.randint(1, 6))]
        expr = _any_tree(numbers, rng)
        text = to_string(expr)
        assert sorted(cd.leaves(parse(text))) == sorted(numbers)
        try:
            value = evaluate(expr)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                evaluate(parse(text))
            continue
        assert evaluate(parse(text)) == value, text


def _any_tree(numbers, rng):
    if len(numbers) == 1:
        return numbers[0]
    k = rng.randint(1, len(numbers) - 1)
    return (rng.choice("+-*/"), _any_tree(numbers[:k], rng), _any_tree(numbers[k:], rng))


# ---------------------------------------------------------------------------- generator


def test_solutions_verify(task):
    examples = task.sample(2000, random.Random(1))
    for ex in examples:
        assert task.solution(ex) == ex.answer
        assert task.reward(ex.prompt, task.solution(ex), answer=ex.answer, meta=ex.meta) == 1.0
        assert ex.prompt == cd.format_prompt(ex.meta["numbers"], ex.meta["target"])
        assert set(ex.prompt + ex.answer) <= set("0123456789 +-*/()>:")
        assert ex.meta["target"] > 0 and len(ex.meta["numbers"]) == 3
        assert all(1 <= x <= 9 for x in ex.meta["numbers"])
        assert "/" not in ex.answer


def test_solution_by_search_when_answer_missing(task):
    for ex in task.sample(200, random.Random(2)):
        bare = Example(ex.prompt, "", {})
        assert task.is_correct(task.solution(bare), ex)
    with pytest.raises(ValueError):
        task.solution(Example("1 1 1>100:", "", {}))


def test_four_numbers():
    task = Countdown(num_count=4)
    for ex in task.sample(500, random.Random(3)):
        assert len(ex.meta["numbers"]) == 4 and len(ex.prompt.split(">")[0].split(" ")) == 4
        assert task.is_correct(task.solution(ex), ex)
    assert len(task.heldout()) == 200


def test_division_knob_exact_only():
    task = Countdown(allow_division=True, num_count=4)
    divisions = 0
    for ex in task.sample(2000, random.Random(4)):
        assert task.is_correct(ex.answer, ex)
        divisions += _check_exact_divisions(parse(ex.answer))
    assert divisions > 100  # the knob actually produces divisions


def _check_exact_divisions(expr) -> int:
    if isinstance(expr, int):
        return 0
    op, left, right = expr
    if op == "/":
        a, b = evaluate(left), evaluate(right)
        assert b != 0 and (a / b).denominator == 1 and a.denominator == 1
    return (op == "/") + _check_exact_divisions(left) + _check_exact_divisions(right)


def test_reachable_targets_match_generator():
    # Everything the generator draws for one multiset is in the exhaustive set, and vice versa
    # for a tiny case counted by hand: {1, 2} -> 1+2=3, 2-1=1, 1*2=2 (positive only).
    assert cd.reachable_targets((1, 2), False) == {1, 2, 3}
    assert cd.reachable_targets((1, 2), True) == {1, 2, 3}  # 2/1 = 2, 1/2 is not exact
    assert cd.reachable_targets((2, 4), True) == {2, 6, 8}  # 4-2, 4+2, 2*4, 4/2
    task = Countdown()
    for ex in task.sample(500, random.Random(5)):
        assert ex.meta["target"] in cd.reachable_targets(ex.meta["numbers"], False)


# ---------------------------------------------------------------------------- held-out split


@pytest.mark.parametrize("kwargs", [{}, {"num_count": 4}, {"allow_division": True}])
def test_heldout_disjoint_from_training(kwargs):
    task = Countdown(**kwargs)
    held = task.heldout()
    held_keys = {key(ex) for ex in held}
    assert len(held) == len(held_keys) == 200  # distinct
    assert all(cd.is_heldout_key(*k) for k in held_keys)
    for seed in range(3):
        train_keys = {key(ex) for ex in task.sample(5000, random.Random(seed))}
        assert not train_keys & held_keys
        assert not any(cd.is_heldout_key(*k) for k in train_keys)
    for ex in held:
        assert task.is_correct(ex.answer, ex)


def test_problem_space_3_numbers():
    # 165 multisets of 3 numbers from 1..9; with + - * they reach 1973 (multiset, target)
    # problems, 360 of which hash into the held-out bucket (about 1 in 5).
    assert cd.count_problems(3, 9, False) == (1973, 360)


def test_heldout_too_small_raises():
    with pytest.raises(ValueError, match="heldout_size"):
        Countdown(max_number=3)
    with pytest.raises(ValueError, match="num_count"):
        Countdown(num_count=20, max_number=99)  # answers could exceed MAX_COMPLETION_CHARS
    assert len(Countdown(max_number=3, heldout_size=10).heldout()) == 10


def test_determinism():
    a, b = Countdown(seed=1), Countdown(seed=1)
    assert a.sample(100) == b.sample(100)
    assert a.sample(100) != Countdown(seed=2).sample(100)
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert Countdown().sample(50, rng_a) == Countdown(seed=99).sample(50, rng_b)
    assert Countdown(seed=1).heldout() == Countdown(seed=2).heldout()
    assert Countdown().heldout() != Countdown(num_count=4).heldout()


def test_heldout_copies_are_independent(task):
    held = task.heldout()
    held[0].meta["numbers"].append(99)
    assert 99 not in task.heldout()[0].meta["numbers"]


# ---------------------------------------------------------------------------- module


def test_the_character_tokenizer_spells_every_prompt_and_answer(task):
    from rlvr.models.tokenizer import char_tokenizer

    tok = char_tokenizer()
    for ex in task.sample(200, random.Random(2)):
        ids = tok(ex.prompt + ex.answer, add_special_tokens=False).input_ids
        assert len(ids) == len(ex.prompt + ex.answer) and tok.unk_token_id not in ids
        assert tok.decode(ids) == ex.prompt + ex.answer


def test_registry():
    assert TASKS["countdown"] is Countdown
    assert isinstance(make_task("countdown", num_count=4), Countdown)
    with pytest.raises(ValueError, match="countdown"):
        make_task("nope")
    assert Countdown.name == "countdown"


def test_doctests():
    from rlvr.tasks import countdown_expr

    for module in (cd, countdown_expr):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_no_torch_import():
    tasks_dir = Path(cd.__file__).parent
    for path in tasks_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in {"torch", "numpy"} for n in names), path
    code = (
        "import sys, rlvr; pre = 'torch' in sys.modules; import rlvr.tasks.countdown; "
        "sys.exit(0 if pre or 'torch' not in sys.modules else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_partial_credit_numbers_pays_only_expressions_over_the_given_numbers():
    # The reward hack of docs/results/main-job.md §1b: a bare digit parses and earns 0.1 under the d1 rule.
    strict = Countdown(partial_credit="numbers")
    got = [strict.reward("3 5 2>13:", c) for c in ("3+5*2", "3*5+2", "9", "13", "3+5+5", "3+5*")]
    assert got == [1.0, 0.1, 0.0, 0.0, 0.0, 0.0]
    assert [Countdown().reward("3 5 2>13:", c) for c in ("9", "13")] == [0.1, 0.1]


def test_partial_credit_rejects_unknown_rule():
    with pytest.raises(ValueError, match="partial_credit must be 'parse' or 'numbers'"):
        Countdown(partial_credit="loose")


def test_key_sampling_is_uniform_over_training_keys_and_never_held_out():
    # The generator reaches small all-'+' problems by many routes, so raw draws repeat them;
    # sampling="keys" picks each training key about equally often, as heldout() picks keys.
    # Spread of the per-key counts (coefficient of variation): a uniform pick gives the Poisson
    # value 1/sqrt(16,000 / 1,612) ≈ 0.32; raw draws measured 0.72.
    num_keys = len(Countdown(ordered=True, sampling="keys")._key_pool())

    def spread(task):
        got = collections.Counter((tuple(sorted(e.meta["numbers"])), e.meta["target"])
                                  for e in task.sample(16_000, random.Random(4)))
        assert not any(is_heldout_key(*key) for key in got)
        counts = list(got.values()) + [0] * (num_keys - len(got))
        return statistics.pstdev(counts) / statistics.mean(counts)
    assert num_keys > 1_600
    assert spread(Countdown(ordered=True, sampling="keys")) < 0.4 < 0.6 < spread(Countdown(ordered=True))
    with pytest.raises(ValueError, match="sampling must be 'draws' or 'keys'"):
        Countdown(sampling="often")
