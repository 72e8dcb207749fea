"""The grader parses the sandbox's output as hostile input: a malformed result line fails that
sample's tests and never raises (a raise would stop the training run for every sample)."""

import json

import pytest

from rlvr.rewards.asserts import split_test
from rlvr.rewards.code import grade_asserts
from rlvr.rewards.sandbox import RunResult, Verdict

NONCE = "n" * 32
SPECS = [split_test("assert add(1, 2) == 3"), split_test("x = is_ok(1)")]  # a probe test and a statement


def _run(*lines: str) -> RunResult:
    return RunResult(Verdict.OK, 0, "\n".join(lines) + "\n", "", 0.01, "none")


def _line(record) -> str:
    return NONCE + (record if isinstance(record, str) else json.dumps(record))


FORGED = {
    "non_string_error": _line({"i": 0, "error": 7}),
    "error_as_list": _line({"i": 1, "error": ["AssertionError"]}),
    "overflowing_index": _line('{"i": 1e999}'),
    "float_index": _line({"i": 0.0, "values": [3]}),
    "bool_index": _line({"i": True, "ok": True}),
    "index_out_of_range": _line({"i": 5, "ok": True}),
    "deeply_nested": _line("[" * 100_000 + "]" * 100_000),
    "deep_value": _line('{"i": 0, "values": [' + "[" * 900 + "]" * 900 + "]}"),
    "values_not_a_list": _line({"i": 0, "values": 3}),
    "too_few_values": _line({"i": 0, "values": []}),
    "bad_tag": _line({"i": 0, "values": [{"__evil__": 1}]}),
    "not_a_dict": _line([0, 1]),
    "not_json": NONCE + "{not json",
    "nan_value": _line('{"i": 0, "values": [NaN]}'),
}


@pytest.mark.parametrize("name", FORGED)
def test_a_malformed_line_fails_only_its_tests(name):
    grade = grade_asserts(_run(FORGED[name]), SPECS, NONCE)
    assert grade.passed == 0 and grade.verdict is Verdict.FAIL, grade


def test_well_formed_lines_still_grade():
    honest = _run(_line({"i": 0, "values": [3]}), _line({"i": 1, "ok": True}), *FORGED.values())  # first record wins
    grade = grade_asserts(honest, SPECS, NONCE)
    assert grade.passed == 2 and grade.verdict is Verdict.PASS
    wrong = grade_asserts(_run(_line({"i": 0, "values": [4]}), _line({"i": 1, "error": "AssertionError: no"})),
                          SPECS, NONCE)
    assert wrong.passed == 0 and wrong.tests == [Verdict.FAIL, Verdict.FAIL]


# Hand vectors of the split and of the interpreter that evaluates checks in the parent.

SPLITS = [
    ("assert add(1, 2) == 3", ("add(1, 2)",), "_v0 == 3"),
    ("assert is_prime(7)", ("is_prime(7)",), "_v0"),
    ("assert not is_prime(8), 'composite'", ("is_prime(8)",), "not _v0"),
    ("assert abs(area(2) - 12.57) < 0.01", ("area(2)",), "abs(_v0 - 12.57) < 0.01"),
    ("assert sorted(f([3, 1])) == [1, 3]", ("f([3, 1])",), "sorted(_v0) == [1, 3]"),
    ("assert f(2) < f(3) <= 10", ("f(2)", "f(3)"), "_v0 < _v1 <= 10"),
    ("assert math.isclose(g(1), 0.5, rel_tol=1e-3)", ("g(1)",), "math.isclose(_v0, 0.5, rel_tol=0.001)"),
    ("assert all(h(i) > 0 for i in range(3))", ("all((h(i) > 0 for i in range(3)))",), "_v0"),
    ("assert s.upper() == 'A'", ("s.upper()",), "_v0 == 'A'"),
    ("assert f(1)[0] == 2 and len(f(2)) == 3", ("f(1)", "f(2)"), "_v0[0] == 2 and len(_v1) == 3"),
]


@pytest.mark.parametrize("test, probes, check", SPLITS)
def test_split_sends_only_the_candidates_expressions_into_the_sandbox(test, probes, check):
    import ast

    spec = split_test(test)
    assert spec.probes == probes and ast.unparse(spec.check) == check and not spec.forgeable


@pytest.mark.parametrize("check, values, expected", [
    ("_v0 == 3", [3], True), ("_v0 == 3", [True], False), ("_v0 == 1", [True], False),  # a bool is not an int
    ("_v0 == (1, 3)", [(1, 3)], True), ("_v0 == (1, 3)", [[1, 3]], False),  # a list is not a tuple
    ("abs(_v0 - 12.57) < 0.01", [12.566], True), ("abs(_v0 - 12.57) < 0.01", [12.5], False),
    ("sorted(_v0) == [1, 3]", [[3, 1]], True), ("_v0 < _v1 <= 10", [2, 3], True), ("_v0 < _v1 <= 10", [2, 11], False),
    ("math.isclose(_v0, 0.5, rel_tol=1e-3)", [0.50001], True), ("_v0 in {1, 2}", [2], True),
    ("_v0[1:] == 'bc'", ["abc"], True), ("len(_v0) == 2 and _v0['a'] == 1", [{"a": 1, "b": 2}], True),
])
def test_checks_evaluate_like_python(check, values, expected):
    import ast

    from rlvr.rewards.asserts import evaluate_check

    env = {f"_v{i}": v for i, v in enumerate(values)}
    assert bool(evaluate_check(ast.parse(check, mode="eval").body, env)) is expected


@pytest.mark.parametrize("check, values", [
    ("_v0 * 10 ** 9 == ''", ["ab"]),       # a string bomb is refused, not built
    ("_v0 ** 100000 == 0", [7]),            # so is a huge power
    ("_v0 + 1 == 2", ["1"]),                # a wrong type is a failed test
    ("_v0.__class__ == 1", [1]),            # attributes other than math's are never evaluated here
    ("(lambda: 1)() == 1", []),
])
def test_checks_refuse_what_they_cannot_evaluate_safely(check, values):
    import ast

    from rlvr.rewards.asserts import CheckError, evaluate_check

    with pytest.raises(CheckError):
        evaluate_check(ast.parse(check, mode="eval").body, {f"_v{i}": v for i, v in enumerate(values)})
