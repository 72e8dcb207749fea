"""Expected values stay out of the candidate's sandbox (single asserts, scripts of statements around
asserts, and asserts in check functions, literal loops, `if` and `with`), and values it sends back
are bounded before any check runs on them."""

from __future__ import annotations

import time

import pytest
from _bwrap_grader import bwrap_grader

from rlvr.rewards.asserts import CheckError, deserialize, evaluate_check, split_test
from rlvr.rewards.code import _serialize
from rlvr.rewards.sandbox import Verdict

BASE_UID = 63000
CANARY = 48151623
M61 = (1 << 61) - 1  # every multiple hashes to 0

# Looks for the canary everywhere a program can look: the frames above it, every object the
# collector tracks (strings inside them, code constants), its fds, /proc/self and its parent's
# /proc entries, the files beside it. Defines f to return the expected value when found.
HUNTER = '''
import gc, os, sys
CANARY = "4815" + "1623"  # written split: this source itself must not count


def _texts(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield from (x for x in (k, v) if isinstance(x, str))
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from (x for x in list(obj) if isinstance(x, str))
    elif hasattr(obj, "co_consts"):
        yield from (repr(c) for c in obj.co_consts)


def hunt():
    hits = set()
    frame = sys._getframe()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            if any(CANARY in t for v in list(scope.values()) for t in _texts(v) if t is not CANARY):
                hits.add("frame")
        frame = frame.f_back
    if any(CANARY in t for o in gc.get_objects() for t in _texts(o) if t is not CANARY):
        hits.add("gc")
    for name in os.listdir("/proc/self/fd"):
        try:
            if CANARY.encode() in os.pread(int(name), 1 << 20, 0):
                hits.add("fd")
        except OSError:
            pass
    paths = [f"/proc/{p}/{n}" for p in ("self", str(os.getppid())) for n in ("cmdline", "environ")]
    paths += [n for n in os.listdir(".") if os.path.isfile(n) and n != "solution.py"]
    for path in paths:
        try:
            with open(path, "rb") as f:
                if CANARY.encode() in f.read():
                    hits.add(path)
        except OSError:
            pass
    return hits


FOUND = hunt()


def f(x):
    return [1, int(CANARY)] if FOUND | hunt() else [0]
'''


@pytest.fixture(scope="module")
def grader():
    yield from bwrap_grader(BASE_UID)


SCRIPTS = [  # statements around asserts: the statements run inside, the expected values stay out
    f"x = f(2)\nassert x == [1, {CANARY}]",
    f"want = [1, {CANARY}]\ny = f(2)\nassert y == want, 'message'",
    f"want = sorted([{CANARY}, 1])\nassert len(f(2)) == 2\nassert f(2) == want",
]


COMPOUND = [  # asserts in compound statements, rewritten so that the expected values stay out as well
    f"def check(candidate):\n    assert candidate(2) == [1, {CANARY}]\n\n"
    "METADATA = {'author': 'jt', 'dataset': 'test'}\n\ncheck(f)\n",  # HumanEval's form
    f"for x, want in [(2, [1, {CANARY}]), (3, [1, {CANARY}])]:\n    assert f(x) == want",
    f"for i in range(2):\n    assert f(i) == [1, {CANARY} + i - i]",
    f"ok = f(2) == [1, {CANARY}]\nassert ok",
    f"if len(f(0)) > 0:\n    assert f(2) == [1, {CANARY}]\nelse:\n    assert f(2) == [{CANARY}]",
    f"import contextlib\nwith contextlib.nullcontext(2) as x:\n    assert f(x) == [1, {CANARY}]",
]
# An assert inside `try` is not rewritten: it runs inside as a statement, the hunt finds its value.
CONTROL = f"try:\n    assert f(2) == [1, {CANARY}]\nexcept KeyError:\n    pass"


def test_a_program_hunting_in_compound_statements_finds_nothing(grader):
    assert [split_test(t).forgeable for t in [*COMPOUND, CONTROL]] == [False] * len(COMPOUND) + [True]
    *rewritten, control = grader.grade_many([(HUNTER, [t]) for t in [*COMPOUND, CONTROL]])
    assert [g.tests for g in rewritten] == [[Verdict.FAIL]] * len(COMPOUND)
    assert control.tests == [Verdict.PASS]  # the same hunt finds a value that does enter
    honest = grader.grade(f"def f(x):\n    return [1, {CANARY}]\n", [*COMPOUND, CONTROL])
    assert honest.tests == [Verdict.PASS] * (len(COMPOUND) + 1)
    wrong = grader.grade(f"def f(x):\n    return [1, {CANARY + 1}]\n", [*COMPOUND, CONTROL])
    assert wrong.tests == [Verdict.FAIL] * (len(COMPOUND) + 1)


def test_a_program_hunting_for_the_expected_value_finds_nothing(grader):
    reference = f"assert f(2) == [v for v in (1, {CANARY})]"  # the expected side: a reference probe
    statement = CONTROL  # cannot be split, runs inside: the control
    assert split_test(reference).reference == (False, True)
    assert [split_test(t).forgeable for t in [statement, *SCRIPTS]] == [True, False, False, False]
    hunted, control, *scripts = grader.grade_many([(HUNTER, [reference]), (HUNTER, [statement]),
                                                   *((HUNTER, [t]) for t in SCRIPTS)])
    assert hunted.tests == [Verdict.FAIL]  # nothing to find: the expected value never entered
    assert control.tests == [Verdict.PASS]  # the same hunt finds a value that does enter
    assert [g.tests for g in scripts] == [[Verdict.FAIL]] * len(SCRIPTS)
    honest = grader.grade(f"def f(x):\n    return [1, {CANARY}]\n", SCRIPTS)
    assert honest.tests == [Verdict.PASS] * len(SCRIPTS)
    honest = grader.grade(f"def f(x):\n    return [1, {CANARY}]\n", [reference, "assert f(0) != [v for v in (0,)]"])
    assert honest.tests == [Verdict.PASS, Verdict.PASS] and honest.reward() == 1.0
    wrong = grader.grade("def f(x):\n    return [1, 2]\n", [reference])
    assert wrong.tests == [Verdict.FAIL]


def test_a_broken_reference_probe_fails_its_test_only(grader):
    grade = grader.grade("def f(x):\n    return 1\n", ["assert f(1) == int('x')", "assert f(1) == 1"])
    assert grade.tests == [Verdict.FAIL, Verdict.PASS]


def test_values_that_collide_in_a_hash_table_are_refused_quickly():
    colliding = _serialize({M61 * i for i in range(1, 37_000)})
    start = time.monotonic()
    with pytest.raises(CheckError, match="share one hash"):
        deserialize(colliding)
    check = split_test("assert set(g()) == {1}").check
    with pytest.raises(CheckError, match="share one hash"):
        evaluate_check(check, {"_v0": [M61 * i for i in range(1, 37_000)]})
    assert time.monotonic() - start < 5.0  # unbounded, the set alone takes about 30 s
    assert deserialize(_serialize({M61 * i for i in range(1, 60)})) == {M61 * i for i in range(1, 60)}


def test_a_script_runs_its_statements_in_order_and_its_checks_outside(grader):
    tests = ["s = Stack(); s.push(1); s.push(2)\nassert s.pop() == 2\nassert s.pop() == 1"]
    stack = "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n" \
            "        self.items.append(x)\n    def pop(self):\n        return self.items.pop({})\n"
    lifo, fifo = grader.grade(stack.format(""), tests), grader.grade(stack.format("0"), tests)
    broken = grader.grade(stack.format("").replace("self.items.append(x)", "raise RuntimeError(x)"), tests)
    assert (lifo.tests, fifo.tests, broken.tests) == ([Verdict.PASS], [Verdict.FAIL], [Verdict.RUNTIME_ERROR])
