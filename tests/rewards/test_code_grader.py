"""The grader parses the sandbox's output as hostile input: a malformed result line fails that
sample's tests and never raises (a raise would stop the training run for every sample)."""

import json

import pytest

from rlvr.rewards.code import _assert_grade, split_assert
from rlvr.rewards.sandbox import RunResult, Verdict

NONCE = "n" * 32
SPECS = [split_assert("assert add(1, 2) == 3"), split_assert("assert is_ok(1)")]


def _run(*lines: str) -> RunResult:
    return RunResult(Verdict.OK, 0, "\n".join(lines) + "\n", "", 0.01, "none")


def _line(record) -> str:
    return NONCE + (record if isinstance(record, str) else json.dumps(record))


FORGED = {
    "non_string_error": _line({"i": 0, "error": 7}),
    "error_as_list": _line({"i": 1, "error": ["AssertionError"]}),
    "overflowing_index": _line('{"i": 1e999}'),
    "float_index": _line({"i": 0.0, "value": 3}),
    "bool_index": _line({"i": True, "ok": True}),
    "index_out_of_range": _line({"i": 5, "ok": True}),
    "deeply_nested": _line("[" * 100_000 + "]" * 100_000),
    "deep_value": _line('{"i": 0, "value": ' + "[" * 900 + "]" * 900 + "}"),
    "not_a_dict": _line([0, 1]),
    "not_json": NONCE + "{not json",
    "nan_value": _line('{"i": 0, "value": NaN}'),
}


@pytest.mark.parametrize("name", FORGED)
def test_a_malformed_line_fails_only_its_tests(name):
    grade = _assert_grade(_run(FORGED[name]), SPECS, NONCE)
    assert grade.passed == 0 and grade.verdict is Verdict.FAIL, grade


def test_well_formed_lines_still_grade():
    honest = _run(_line({"i": 0, "value": 3}), _line({"i": 1, "ok": True}), *FORGED.values())  # first record wins
    grade = _assert_grade(honest, SPECS, NONCE)
    assert grade.passed == 2 and grade.verdict is Verdict.PASS
    wrong = _assert_grade(_run(_line({"i": 0, "value": 4}), _line({"i": 1, "error": "AssertionError: no"})),
                          SPECS, NONCE)
    assert wrong.passed == 0 and wrong.tests == [Verdict.FAIL, Verdict.FAIL]
