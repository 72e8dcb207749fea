"""Asserts in compound statements (HumanEval's check function, MBPP-style loops over literals, `if`,
`with`, comparisons bound to a name) are rewritten so that their expected values stay outside the
sandbox; an honest program is graded exactly as running the test in Python would: pass where the
test raises nothing, fail where it raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _bwrap_grader import bwrap_grader

from rlvr.rewards.asserts import split_test
from rlvr.rewards.code import _sent
from rlvr.rewards.flatten import MAX_UNROLLED
from rlvr.rewards.sandbox import Verdict

BASE_UID = 63700
FIXTURE = Path(__file__).resolve().parents[2] / "data" / "code_fixture.jsonl"

HUMANEVAL = ["""

METADATA = {
    'author': 'jt',
    'dataset': 'test'
}


def check(candidate):
    SCALE = 5  # the check's own name: the candidate's global SCALE stays as it is
    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) == True
    assert candidate([1.0, 2.0, 3.0], 0.5) == False
    assert candidate([], 1.0) == False
    for xs, t in [([1.0, 1.05], 0.1), ([0.0, 9.0], 10.0)]:
        assert candidate(xs, t)
    assert SCALE == 5

check(close)
""", """
def check(candidate):
    import math
    for i in range(4):
        got = candidate([float(i), float(i) + 0.5], 0.75)
        assert got is True, f"case {i}"
    assert math.isclose(float(candidate([1.0, 3.0], 1.0)), 0.0)

check(close)
"""]
MBPP = [
    "assert close([1.0, 1.2], 0.5) == True",
    "for xs, t, want in [([1.0, 2.0], 0.5, False), ([3.0, 3.1], 0.2, True)]:\n    assert close(xs, t) == want",
    "ok = close([1.0, 1.1], 0.5) == True and close([1.0, 5.0], 0.5) == False\nassert ok",
    "if close([1.0, 1.01], 0.1):\n    assert close([2.0, 2.01], 0.1) == True\nelse:\n    assert close([2.0], 0.1) == 7",
    "import contextlib\nwith contextlib.nullcontext(0.5) as t:\n    assert close([1.0, 1.2], t) == True",
    "def check(candidate):\n    assert candidate([1.0, 9.0], 0.5) == False\n\ncheck(close)\ncheck(close)",
]
PROGRAMS = {
    "right": "SCALE = 1\n\ndef close(xs, t):\n    return any(abs(a - b) < t * SCALE for i, a in enumerate(xs)"
             " for b in xs[i + 1:])\n",
    "always": "def close(xs, t):\n    return True\n",
    "never": "def close(xs, t):\n    return False\n",
    "raises": "def close(xs, t):\n    raise ValueError(t)\n",
    "int": "def close(xs, t):\n    return len(xs) > 1 and abs(xs[0] - xs[1]) < t\n",
}


@pytest.fixture(scope="module")
def grader():
    yield from bwrap_grader(BASE_UID)


def _python(code: str, test: str) -> Verdict:
    """The test's verdict when run in Python beside the program (trusted fixtures only)."""
    try:
        exec(compile(code + "\n" + test, "<test>", "exec"), {"__name__": "solution"})  # noqa: S102
    except AssertionError:
        return Verdict.FAIL
    except Exception:  # noqa: BLE001 - any other error is the program's
        return Verdict.RUNTIME_ERROR
    return Verdict.PASS


def test_compound_tests_are_split_with_no_expected_value_sent_in():
    for test in [*HUMANEVAL, *MBPP]:
        spec = split_test(test)
        assert not spec.forgeable, test
        assert spec.probes
    sent = json.dumps([split_test(t).probes for t in HUMANEVAL])
    assert "0.3" in sent and "3.9" in sent  # inputs go in ...
    assert "== True" not in sent and "== False" not in sent and "case" not in sent  # ... checks do not


def test_tests_that_cannot_be_rewritten_still_run_inside():
    for test in ["for x in g():\n    assert f(x) == 1", "while True:\n    assert f(1) == 1\n    break",
                 "def check(c):\n    assert c(1) == 1\n    return True\ncheck(f)",  # a check function that returns
                 "def check(candidate):\n    assert candidate(1) == 1\nrun = check\nrun(f)",  # used other than called
                 "for x, y in [(1, 2)]:\n    assert f(x) == y\nprint(y)",  # an expected name, unbound, read after
                 "for x in [1, 2]:\n    if f(x):\n        break\n    assert f(x) == 1",
                 f"for x in range({MAX_UNROLLED + 1}):\n    assert f(x) == 1",
                 "try:\n    assert f(1) == 1\nexcept KeyError:\n    pass",
                 "def check(candidate):\n    assert candidate(1) == 1\ndef run():\n    check(f)\nrun()"]:
        assert split_test(test).forgeable, test
    # a comparison between two of the candidate's values holds no expected value: it runs inside
    assert split_test("s = Stack()\nok = s == Stack()\nassert ok").steps[1] == ("exec", "ok = s == Stack()")
    assert split_test("ok = f(1) == 2\nassert ok").steps == (("probes", 0, 1), ("probes", 1, 1))


def test_honest_programs_are_graded_as_python_runs_the_tests(grader):
    tests = [*HUMANEVAL, *MBPP]
    grades = grader.grade_many([(code, tests) for code in PROGRAMS.values()])
    for (name, code), grade in zip(PROGRAMS.items(), grades):
        python = [_python(code, t) for t in tests]
        assert grade.tests == python, name
    assert grades[0].tests == [Verdict.PASS] * len(tests)  # the fixtures hold: the right program passes all
    assert {v for g in grades[1:] for v in g.tests} == {Verdict.PASS, Verdict.FAIL, Verdict.RUNTIME_ERROR}


def test_the_code_fixture_rows_grade_the_same_as_check_functions(grader):
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    items, expected = [], []
    for row in rows:
        if not all(isinstance(t, str) for t in row["tests"]):
            continue  # stdin/stdout rows: no asserts
        name = row["solution"].split("def ", 1)[1].split("(", 1)[0]
        as_check = "def check(candidate):\n" + "".join(f"    {t}\n" for t in row["tests"]) + f"\ncheck({name})\n"
        in_if = "if True:\n" + "".join(f"    {t}\n" for t in row["tests"])
        wrong = f"def {name}(*args):\n    return args[0]\n"
        for code in (row["solution"], wrong):
            tests = [*row["tests"], as_check, in_if]
            items.append((code, tests))
            expected.append([_python(code, t) for t in tests])
    assert all(not split_test(t).forgeable for _, tests in items for t in tests)
    assert [g.tests for g in grader.grade_many(items)] == expected
    assert all(v is Verdict.PASS for e in expected[::2] for v in e)  # each solution passes its row
    assert any(v is not Verdict.PASS for e in expected[1::2] for v in e)


ROOTS = '''
import math
def poly(xs, x):
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])
def find_zero(xs):
    begin, end = -1., 1.
    while poly(xs, begin) * poly(xs, end) > 0:
        begin *= 2.0
        end *= 2.0
    while end - begin > 1e-10:
        center = (begin + end) / 2.0
        if poly(xs, center) * poly(xs, begin) > 0:
            begin = center
        else:
            end = center
    return begin
def largest(xs):
    return None if not xs else max(xs)
'''
ROOT_TESTS = ['''

METADATA = {}


def check(candidate):
    import math
    import random
    rng = random.Random(42)
    import copy
    for _ in range(100):
        ncoeff = 2 * rng.randint(1, 4)
        coeffs = []
        for _ in range(ncoeff):
            coeff = rng.randint(-10, 10)
            if coeff == 0:
                coeff = 1
            coeffs.append(coeff)
        solution = candidate(copy.deepcopy(coeffs))
        assert math.fabs(poly(coeffs, solution)) < 1e-4

check(find_zero)
''', '''
def check(candidate):

    # Check some simple cases
    assert candidate([]) is None
    assert candidate([1, 5, 3]) == 5, "This prints if this assert fails 1 (good for debugging!)"
    assert True, "This prints if this assert fails 2 (also good for debugging!)"

check(largest)
''', '''
def check(candidate):
    for x in range(2, 8):
        assert candidate([x, 1]) == x
    for x in range(2, 8):  # the same name again: the first loop's copies read none of it
        assert candidate([1, x]) != 0

check(largest)
''']


def test_humaneval_checks_with_random_inputs_and_repeated_loops_grade_as_python(grader):
    specs = [split_test(t) for t in ROOT_TESTS]
    assert [len(s.probes) for s in specs] == [100, 2, 12] and not any(s.forgeable for s in specs)
    programs = [ROOTS, ROOTS.replace("return begin", "return end + 1"), ROOTS.replace("max(xs)", "min(xs)")]
    grades = grader.grade_many([(code, ROOT_TESTS) for code in programs])
    assert [g.tests for g in grades] == [[_python(code, t) for t in ROOT_TESTS] for code in programs]
    assert [g.passed for g in grades] == [3, 2, 1]


FORMS = [
    "if f(1) == 1:\n    assert f(2) == 2\nelif f(1) == 2:\n    assert f(2) == 4\nelse:\n    assert f(2) == 0",
    "for x in [1, 2]:\n    for y in (3, 4):\n        assert f(x) + y == x * 1 + y",
    "for x in [1, 2]:\n    r = f(x)\n    assert r == x",
    "xs = [1, 2]\nfor x in [1, 2]:\n    xs.append(f(x))\nassert xs[2:] == [1, 2]",
    "def check(candidate):\n    total = 0\n    for v in [1, 2, 3]:\n        total += candidate(v)\n"
    "    assert total == 6\ncheck(f)",
    "def check(candidate):\n    assert [candidate(i) for i in range(3)] == [0, 1, 2]\ncheck(f)",
    "ok = f(1) == 1\nok2 = not f(2) == 3\nassert ok and ok2",
    "for i in range(3):\n    if i % 2:\n        assert f(i) == i\n    else:\n        assert f(i) >= 0",
    "x = 5\ndef check(candidate):\n    x = 1\n    assert candidate(x) == 1\ncheck(f)\nassert x == 5",
    "for x in [1, 2]:\n    assert f(x) == x\nx = 3\nassert f(x) == 3",
]
FORM_PROGRAMS = ["def f(x):\n    return x\n", "def f(x):\n    return 2 * x\n", "def f(x):\n    raise KeyError(x)\n",
                 "x = 9\n\ndef f(v):  # reads the global a test's loop binds\n    return v if x == 9 else -1\n"]


def _python_in_one_namespace(code: str, tests: list[str]) -> list[Verdict]:
    """Each test's verdict with the tests run one after another beside the program, as the harness runs them."""
    ns = {"__name__": "solution"}
    exec(compile(code, "<program>", "exec"), ns)  # noqa: S102 - trusted fixtures
    verdicts = []
    for test in tests:
        try:
            exec(compile(test, "<test>", "exec"), ns)  # noqa: S102
            verdicts.append(Verdict.PASS)
        except AssertionError:
            verdicts.append(Verdict.FAIL)
        except Exception:  # noqa: BLE001 - any other error is the program's
            verdicts.append(Verdict.RUNTIME_ERROR)
    return verdicts


def test_rewritten_forms_keep_pythons_bindings(grader):
    """elif chains, nested loops, `+=` on a check's local, a loop's names the program reads as globals
    (bound as the loop binds them, since they enter anyway), names rebound after a loop."""
    assert not any(split_test(t).forgeable for t in FORMS)
    assert _sent_text("for x, y in [(1, 2)]:\n    assert f(x) == y") == ["x = 1", "f(1)"]  # y, expected, stays out
    grades = grader.grade_many([(code, FORMS) for code in FORM_PROGRAMS])
    assert [g.tests for g in grades] == [_python_in_one_namespace(code, FORMS) for code in FORM_PROGRAMS]
    assert grades[0].passed == len(FORMS) and grades[3].passed < len(FORMS)


def _sent_text(test: str) -> list[str]:
    return [s.get("exec") or s["probes"][0] for s in _sent(split_test(test))["steps"]]
