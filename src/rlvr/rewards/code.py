"""Grade model-written Python against a row's tests; the grader stays outside the sandbox.

Two kinds of tests (a row's ``tests`` field):

- **stdin/stdout**: ``[{"input": "1 2\\n", "output": "3\\n"}, ...]``. Each test is one sandbox
  run with that stdin; the parent compares stdout with the expected text: lines right-stripped,
  trailing blank lines dropped, and the **line counts must match** (printing only a correct
  prefix fails).
- **assert-style**: ``["assert add(1, 2) == 3", ...]`` (MBPP/HumanEval-like). Each assert is
  split (``rlvr.rewards.asserts``) into probes, the sub-expressions that call the candidate's
  code, and a check that stays in the parent: a harness in the sandbox imports the solution,
  evaluates the probes and prints their values as strict JSON (exact builtin types only; an
  object whose ``__eq__`` is always true cannot be serialised), and the parent evaluates every
  check on those values. Expected values and comparisons never enter the sandbox, so whatever a
  program prints, it is graded like an honest program returning the printed values. A probe
  that names only builtins and ``math`` (the expected side, ``sorted([3, 1, 2])``) is evaluated
  in a sandbox run of its own without the candidate's code (cached per set of such probes), so a
  program that walks the harness's frames, ``gc``, ``/proc`` or its fds finds no expected value. Result
  lines are tagged with a per-run random nonce read from stdin (then replaced by
  ``/dev/null``), so ``print("PASSED")``, ``sys.exit(0)`` or ``os._exit(0)`` before the tests
  produce no tagged lines and FAIL; a malformed line fails its test only. A test of several
  statements with its asserts at the top level (``s = Stack(); s.push(1); assert s.pop() == 1``)
  is a script: its statements run inside in order, each assert's probes are evaluated where the
  assert stands, and the checks stay here; a name bound to an expected value (``want = [1, 2]``)
  that no statement reads stays here too, as does a comparison bound to a name (``ok = f(1) == 2``:
  its probes go in, the comparison stays here). HumanEval's ``def check(candidate)`` called as
  ``check(fn)`` is inlined, a loop over literals unrolled, and ``if``/``with`` run as branch steps
  (`rlvr.rewards.flatten`). What does enter with a script is what its statements hold (inputs, an
  ``if``'s condition). A test with an assert left in another compound statement (``while``,
  ``try``, a loop over computed values) runs inside as a statement (passed when it raises nothing):
  the one form a program that introspects the interpreter could forge.

The checks run on values the program chose, so they run in check workers (`CodeGrader.checks`,
processes of their own): each sample's checks under ``check_timeout_s``, a breach failing that
sample's tests and counted (`Grade.breach`, the task's ``check_breaches`` metric).

Reward = fraction of tests passed, or 1/0 with ``all_or_nothing``. ``SANDBOX_ERROR`` (our
fault) gives reward ``None`` (not scorable) and is counted, never turned into a silent zero.
"""

from __future__ import annotations

import inspect
import json
import re
import secrets
from dataclasses import dataclass, field

from rlvr.rewards.asserts import BoundError, CheckError, Spec, deserialize, evaluate_check, split_test
from rlvr.rewards.sandbox import Limits, RunResult, Sandbox, Verdict
from rlvr.rewards.workers import WorkerPool

__all__ = ["Grade", "CodeGrader", "extract_code", "compare_stdout", "clean_detail"]

CHECK_TIMEOUT_S = 5.0  # one sample's checks, in a check worker; honest checks take milliseconds
CHECK_MEMORY_MB = 512  # a check worker's memory budget beyond its size at start
DETAIL_CHARS = 200  # a grade's detail kept at most (grades are cached: thousands of them)

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced code block of a completion, else the completion itself.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    >>> extract_code("print(2)")
    'print(2)'
    """
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def _norm_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def compare_stdout(actual: str, expected: str) -> bool:
    """Exact match up to trailing spaces per line and trailing blank lines; same line count.

    >>> compare_stdout("3 \\n", "3"), compare_stdout("1\\n", "1\\n2\\n"), compare_stdout("1\\n2\\n3\\n", "1\\n2")
    (True, False, False)
    """
    return _norm_lines(actual) == _norm_lines(expected)


def _serialize(value, _depth=0):
    """Strict JSON form of a value: exact builtin types only, containers tagged.

    Used by the harness inside the sandbox and by the parent on the expected literal.
    """
    if _depth > 50:
        raise ValueError("too deep")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"__float__": repr(value)}
        return value
    if t is list:
        return [_serialize(v, _depth + 1) for v in value]
    if t is tuple:
        return {"__tuple__": [_serialize(v, _depth + 1) for v in value]}
    if t is set or t is frozenset:
        items = [_serialize(v, _depth + 1) for v in value]
        return {"__set__": sorted(items, key=lambda x: json.dumps(x, sort_keys=True))}
    if t is dict:
        pairs = [[_serialize(k, _depth + 1), _serialize(v, _depth + 1)] for k, v in value.items()]
        return {"__dict__": sorted(pairs, key=lambda x: json.dumps(x, sort_keys=True))}
    raise TypeError(f"cannot serialise {t.__name__}")


_HARNESS = '''
import sys, os, json
def _steps(steps, ns, values):
    for step in steps:
        if "exec" in step:
            exec(step["exec"], ns)
        elif "probes" in step:
            values += [eval(src, ns) for src in step["probes"]]
        elif "if" in step:  # the branch taken comes back as a value; the other's probes as None
            taken = bool(eval(step["if"], ns))
            values.append(taken)
            values += [] if taken else [None] * step["n_then"]
            _steps(step["then"] if taken else step["else"], ns, values)
            values += [None] * step["n_else"] if taken else []
        else:
            with eval(step["with"], ns) as entered:
                if step["as"]:
                    ns[step["as"]] = entered
                _steps(step["body"], ns, values)
def _main():
    nonce = sys.stdin.readline().strip()
    tests = json.loads(sys.stdin.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.fdopen(os.dup(1), "w")
    dumps = json.dumps
    def report(i, **kw):
        out.write(nonce + dumps({"i": i, **kw}) + "\\n")
        out.flush()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "solution.py"), encoding="utf-8") as f:
        source = f.read()
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(source, "solution.py", "exec"), ns)
    except BaseException as e:
        report(-1, error=type(e).__name__ + ": " + str(e)[:200])
        return
    for i, t in enumerate(tests):
        try:
            if t["kind"] in ("probes", "script"):
                if t["kind"] == "probes":
                    values = [eval(src, ns) for src in t["src"]]
                else:  # statements run in order, each assert's probes where it stands
                    values = []
                    _steps(t["steps"], ns, values)
                try:
                    values = [_serialize(v) for v in values]
                except BaseException:
                    report(i, unserialisable=True)
                    continue
                report(i, values=values)
            else:
                exec(t["src"], ns)
                report(i, ok=True)
        except BaseException as e:
            report(i, error=type(e).__name__ + ": " + str(e)[:200])
'''


def _harness_source() -> str:
    return "import json\n" + inspect.getsource(_serialize) + _HARNESS + "_main()\n"


@dataclass
class Grade:
    """A graded completion: overall verdict, tests passed, per-test verdicts."""

    verdict: Verdict
    passed: int
    total: int
    tests: list[Verdict] = field(default_factory=list)
    detail: str = ""
    # The checks on the program's values breached a bound: values over the size/hash bounds (that test failed),
    breach: str = ""  # or past the check worker's deadline or memory (every test failed). Counted in metrics.

    def reward(self, all_or_nothing: bool = False) -> float | None:
        if self.verdict is Verdict.SANDBOX_ERROR:
            return None
        if self.total == 0:
            return 0.0
        if all_or_nothing:
            return float(self.passed == self.total)
        return self.passed / self.total


def _overall(tests: list[Verdict], runs: list[RunResult]) -> Verdict:
    if any(v is Verdict.SANDBOX_ERROR for v in tests):
        return Verdict.SANDBOX_ERROR
    if tests and all(v is Verdict.PASS for v in tests):
        return Verdict.PASS
    for run in runs:  # a program that hit a limit names the failure
        if run.verdict not in (Verdict.OK, Verdict.RUNTIME_ERROR):
            return run.verdict
    return next((v for v in tests if v is not Verdict.PASS), Verdict.FAIL)


class CodeGrader:
    """Runs a completion's code against tests in a ``Sandbox``; see the module doc."""

    def __init__(self, sandbox: Sandbox | None = None, *, limits: Limits | None = None,
                 check_timeout_s: float = CHECK_TIMEOUT_S, check_workers: int = 2):
        self.sandbox = sandbox or Sandbox()
        self.limits = limits
        # The checks run on values the program chose (a set of 37,000 colliding ints, frozensets nested to
        # compare in exponential time): in a worker process each sample's under its own deadline, never here.
        self.check_timeout_s = check_timeout_s
        self.checks = WorkerPool({"grade": "rlvr.rewards.code:grade_asserts"}, size=check_workers,
                                 memory_mb=CHECK_MEMORY_MB, spawn=True, name="code checks")
        self._references: dict[str, list | None] = {}  # reference probes (JSON) -> their values per test

    def _reference_values(self, wanted: list[str]) -> None:
        """Evaluate each row's reference probes (JSON lists of lists of sources) in a sandbox run without
        the candidate, once per distinct list; None where the run failed."""
        todo = [w for w in dict.fromkeys(wanted) if w not in self._references]
        if not todo:
            return
        if len(self._references) > 4096:
            self._references.clear()
        nonce = secrets.token_hex(16)
        jobs = [dict(source=_harness_source(), files={"solution.py": "import math\n"},
                     stdin=nonce + "\n" + json.dumps([{"kind": "probes", "src": srcs} for srcs in json.loads(w)])
                     + "\n", limits=self.limits) for w in todo]
        for w, run in zip(todo, self.sandbox.run_many(jobs)):
            count = len(json.loads(w))
            records = {}
            for line in run.stdout.splitlines() if run.verdict is Verdict.OK else []:
                record = _parse_record(line, nonce, count) if line.startswith(nonce) else None
                if record is not None and isinstance(record.get("values"), list):
                    records.setdefault(record["i"], record["values"])
            self._references[w] = [records.get(i) for i in range(count)]

    def grade(self, code: str, tests: list) -> Grade:
        return self.grade_many([(code, tests)])[0]

    def grade_many(self, items: list[tuple[str, list]]) -> list[Grade]:
        """Grade ``(code, tests)`` pairs, all their sandbox runs fanned out over the pool."""
        jobs, plans = [], []
        for code, tests in items:
            if not tests:
                plans.append(("empty", None, None))
            elif all(isinstance(t, dict) and "input" in t for t in tests):
                start = len(jobs)
                jobs += [dict(source=code, stdin=str(t["input"]), limits=self.limits) for t in tests]
                plans.append(("stdio", start, tests))
            else:
                specs = [split_test(str(t)) for t in tests]
                nonce = secrets.token_hex(16)
                sent = [_sent(s) for s in specs]
                stdin = nonce + "\n" + json.dumps(sent) + "\n"
                wanted = json.dumps([[p for p, ref in zip(s.probes, s.reference) if ref] for s in specs])
                plans.append(("assert", len(jobs), (specs, nonce, wanted)))
                jobs.append(dict(source=_harness_source(), files={"solution.py": code}, stdin=stdin,
                                 limits=self.limits))
        self._reference_values([info[2] for kind, _, info in plans
                                if kind == "assert" and any(any(s.reference) for s in info[0])])
        runs = self.sandbox.run_many(jobs)
        checked = iter(self._checked([(runs[start], *info) for kind, start, info in plans if kind == "assert"]))
        grades = []
        for kind, start, info in plans:
            if kind == "empty":
                grades.append(Grade(Verdict.FAIL, 0, 0, detail="no tests"))
            elif kind == "stdio":
                mine = runs[start:start + len(info)]
                verdicts = [_stdio_verdict(r, t["output"]) for r, t in zip(mine, info)]
                passed = sum(v is Verdict.PASS for v in verdicts)
                grades.append(Grade(_overall(verdicts, mine), passed, len(verdicts), verdicts))
            else:
                grades.append(next(checked))
        return grades

    def _checked(self, asserts: list[tuple[RunResult, list[Spec], str, str]]) -> list[Grade]:
        """Each assert run's grade, computed in the check workers, one sample per call under its own
        deadline: a sample whose checks breach it fails all its tests (`Grade.breach`), the others
        are graded as alone."""
        calls = [((run, specs, nonce, self._references.get(wanted)), {}) for run, specs, nonce, wanted in asserts]
        grades = []
        for (_, specs, _, _), (grade, error) in zip(asserts, self.checks.run("grade", calls, self.check_timeout_s)):
            if error is not None or not isinstance(grade, Grade):
                error = clean_detail(error or "a check worker returned no grade")
                grade = Grade(Verdict.FAIL, 0, len(specs), [Verdict.FAIL] * len(specs), f"grading: {error}", error)
            grades.append(grade)
        return grades


def _sent(spec: Spec) -> dict:
    """What of a test enters the candidate's sandbox: its probes (not the reference ones), its script's
    statements and probes in order, or, for a test that cannot be split, the whole statement."""
    def own(first, end):
        return [p for p, ref in zip(spec.probes[first:end], spec.reference[first:end]) if not ref]
    if spec.forgeable:
        return {"kind": "stmt", "src": spec.source}
    if spec.steps:
        return {"kind": "script", "steps": _sent_steps(spec, spec.steps, own)[0]}
    return {"kind": "probes", "src": own(0, len(spec.probes))}


def _sent_steps(spec: Spec, steps, own) -> tuple[list[dict], int]:
    """A script's steps as the harness reads them, and how many values they send back."""
    out, count = [], 0
    for step in steps:
        if step[0] == "exec":
            out.append({"exec": step[1]})
        elif step[0] == "probes":
            out.append({"probes": own(*step[1:])})
            count += len(out[-1]["probes"])
        elif step[0] == "if":
            (then, n_then), (orelse, n_else) = _sent_steps(spec, step[2], own), _sent_steps(spec, step[3], own)
            out.append({"if": spec.probes[step[1]], "then": then, "else": orelse, "n_then": n_then, "n_else": n_else})
            count += 1 + n_then + n_else
        else:
            body, n = _sent_steps(spec, step[3], own)
            out.append({"with": step[1], "as": step[2], "body": body})
            count += n
    return out, count


def _stdio_verdict(run: RunResult, expected: str) -> Verdict:
    if run.verdict is Verdict.OK:
        return Verdict.PASS if compare_stdout(run.stdout, str(expected)) else Verdict.FAIL
    return run.verdict


def _parse_record(line: str, nonce: str, count: int) -> dict | None:
    """One tagged result line as a record, or None when it is malformed in any way.

    The line comes from the sandbox, so it is hostile input: JSON nested past the recursion
    limit, numbers that overflow, an index out of range or fields of the wrong type must fail
    that sample's tests, never raise in the grader (which would stop the training run)."""
    try:
        record = json.loads(line[len(nonce):])
    except (ValueError, RecursionError, OverflowError):
        return None
    if not isinstance(record, dict):
        return None
    index = record.get("i")
    if type(index) is not int or not -1 <= index < count:
        return None
    if "error" in record and not isinstance(record["error"], str):
        return None
    return record


def _check_passes(record: dict, spec: Spec, reference: list | None) -> bool:
    """The test's check, evaluated here on the probe values the candidate's run reported and the
    reference probes' values from the run without it."""
    values, reference = record.get("values"), list(reference or [])
    if not isinstance(values, list) or len(values) + len(reference) != len(spec.probes):
        return False
    values = list(values)
    values = [reference.pop(0) if ref else values.pop(0) for ref in spec.reference] if reference else values
    try:
        env = {f"_v{i}": deserialize(v) for i, v in enumerate(values)}
        return bool(evaluate_check(spec.check, env))
    except BoundError:
        raise
    except (CheckError, RecursionError, TypeError, ValueError):  # unhashable set items, deep nesting
        return False


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def clean_detail(text: str, limit: int = DETAIL_CHARS) -> str:
    r"""A detail fit to keep and print: at most `limit` characters, control characters made one space.

    >>> clean_detail("Error: \x1b[2Jgone\x00" + "x" * 300)[:20], len(clean_detail("y" * 10_000))
    ('Error:  [2Jgone xxxx', 200)
    """
    return _CONTROL.sub(" ", str(text)[:limit])


def grade_asserts(run: RunResult, specs: list[Spec], nonce: str, references: list | None = None) -> Grade:
    """The grade of one assert run; `references[i]`: test i's reference probe values (None: they failed).
    Runs in a check worker (`CodeGrader.checks`): the run's output is the program's and hostile."""
    if run.verdict is Verdict.SANDBOX_ERROR:
        return Grade(Verdict.SANDBOX_ERROR, 0, len(specs), [Verdict.SANDBOX_ERROR] * len(specs),
                     clean_detail(run.detail))
    results: dict[int, dict] = {}
    for line in run.stdout.splitlines():
        record = _parse_record(line, nonce, len(specs)) if line.startswith(nonce) else None
        if record is not None:
            results.setdefault(record["i"], record)
    verdicts, breach = [], ""
    for i, spec in enumerate(specs):
        record = results.get(i)
        if record is None:  # never reported: the program stopped, exited early or hit a limit
            ok_run = run.verdict in (Verdict.OK, Verdict.RUNTIME_ERROR)
            verdicts.append(Verdict.FAIL if ok_run else run.verdict)
        elif "error" in record:
            verdicts.append(Verdict.RUNTIME_ERROR if not record["error"].startswith("AssertionError")
                            else Verdict.FAIL)
        elif not spec.forgeable:
            reference = references[i] if references and any(spec.reference) else None
            try:
                ok = (reference is not None or not any(spec.reference)) and _check_passes(record, spec, reference)
            except BoundError as err:
                ok, breach = False, f"values over the checks' bounds: {err}"
            verdicts.append(Verdict.PASS if ok else Verdict.FAIL)
        else:
            verdicts.append(Verdict.PASS if record.get("ok") is True else Verdict.FAIL)
    passed = sum(v is Verdict.PASS for v in verdicts)
    detail = clean_detail(results.get(-1, {}).get("error", ""))
    return Grade(_overall(verdicts, [run]), passed, len(specs), verdicts, detail, breach)
