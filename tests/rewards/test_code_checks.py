"""The checks of a code task run on values the program chose, so they run in check workers, each
sample's under its own deadline: a step of 16 completions with 1, 4 or 8 that flood the grader's
hash tables (or stall its checks) among honest ones scores the hostile ones 0 and counts them, the
honest ones exactly as alone, also while another batch is scored beside it (scoring ahead)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest

from rlvr.rewards.code import CodeGrader, Grade, clean_detail, grade_asserts
from rlvr.rewards.forms import TASK_VERIFIER, with_task
from rlvr.rewards.runner import RewardSum
from rlvr.rewards.sandbox import Limits, Sandbox, Verdict, detect_isolation
from rlvr.rewards.workers import WorkerPool
from rlvr.tasks.files import CodeFileTask
from rlvr.trainer.scoring import scored
from rlvr.types import Example

BASE_UID = 63400
TESTS = ["assert set(f(1)) == {1, 2}", "assert f(2) == [2, 4]", "assert len(f(3)) == 2"]
HONEST = ["def f(x):\n    return [x, 2 * x]\n",  # 3 of 3
          "def f(x):\n    return [x]\n",  # 0 of 3
          "def f(x):\n    return [x, x + 2]\n",  # 2 of 3 (f(2) == [2, 4] too)
          "def f(x):\n    return [x, 2 * x] if x != 3 else []\n",  # 2 of 3
          "def f(x):\n    raise ValueError(x)\n"]
M61 = (1 << 61) - 1  # every multiple hashes to 0
HOSTILE = {
    # an honest-looking function whose result makes `set(result)` in the check quadratic (about 30 s unbounded)
    "flood": f"def f(x):\n    return [{M61} * i for i in range(1, 37_000)]\n",
    # a forged result record for test 0 (the harness's `report`, found by walking up one frame)
    "forged": "import sys\nsys._getframe(1).f_locals['report'](0, values=[{'__set__': "
              f"[{M61} * i for i in range(1, 37_000)]}}])\n"
              "def f(x):\n    return []\n",
    # a run whose checks stall their worker (see `_stalling_checks`): past the checks' deadline
    "stall": "print('STALL')\ndef f(x):\n    return []\n",
}
CHECK_DEADLINE = 2.0


def _stalling_checks(run, specs, nonce, references=None) -> Grade:
    """The check workers' grading, except that a run printing STALL holds its worker like a check that
    never ends (no value within the bounds costs that; the deadline is what stops one that would)."""
    if "STALL" in run.stdout:
        time.sleep(60)
    return grade_asserts(run, specs, nonce, references)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("bwrap") is None or detect_isolation(base_uid=BASE_UID) != "bwrap":
        pytest.skip("needs root and a working bubblewrap (CI has both)")
    path = tmp_path_factory.mktemp("code") / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "write f", "tests": TESTS}) + "\n")
    task = CodeFileTask(path=str(path), isolation="bwrap")
    task.grader.sandbox.close()
    task.grader = CodeGrader(Sandbox(workers=2, limits=Limits(wall_s=10.0, memory_mb=256), isolation="bwrap",
                                     base_uid=BASE_UID), check_timeout_s=CHECK_DEADLINE)
    task.grader.checks = WorkerPool({"grade": _stalling_checks}, size=2, memory_mb=512, name="code checks")
    yield task
    task.grader.sandbox.close()
    task.grader.checks.close()


def _fence(code: str) -> str:
    return f"Here:\n```python\n{code}```\n"


def _score(task, texts):
    task._cache.clear()  # graded afresh: cached grades would make "as alone" hold trivially
    reward = RewardSum(with_task([TASK_VERIFIER], task), [1.0], timeout_s=30.0, workers=2)
    group = [Example("write f", "", {"tests": TESTS, "source": "rows.jsonl:1"}) for _ in texts]
    return scored(reward, task, group, texts)


@pytest.fixture(scope="module")
def alone(task):
    return {code: float(_score(task, [_fence(code)]).rewards[0]) for code in HONEST}


def test_alone_scores_are_the_fractions_passed(alone):
    assert list(alone.values()) == pytest.approx([1.0, 0.0, 2 / 3, 2 / 3, 0.0])


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("count", [1, 4, 8])
def test_a_step_with_grader_stalling_completions_trains_on(task, alone, kind, count):
    honest = [HONEST[i % len(HONEST)] for i in range(16 - count)]
    codes = honest[:8] + [HOSTILE[kind]] * count + honest[8:]
    start = time.monotonic()
    out = _score(task, [_fence(c) for c in codes])
    elapsed = time.monotonic() - start
    for code, r in zip(codes, out.rewards.tolist()):
        assert r == (0.0 if code == HOSTILE[kind] else alone[code]), (code, r)
    assert out.metrics["user/check_breaches"] == pytest.approx(count / 16)  # counted (a mean over the step)
    assert out.metrics["user/errors"] == 0.0
    if kind == "stall":  # the stalled samples ran out their deadlines side by side
        assert CHECK_DEADLINE <= elapsed < 3 * CHECK_DEADLINE + 10, elapsed


def test_scoring_ahead_beside_a_flooding_batch_keeps_honest_verdicts(task, alone):
    """Scoring ahead (η ≥ 1): a batch is scored in a thread of its own while the trainer goes on; a
    flooding batch there must not hold the GIL from the honest batch's sandbox readers here."""
    hostile = [_fence(HOSTILE["flood"])] * 8 + [_fence(HOSTILE["forged"])] * 8
    honest = [HONEST[i % len(HONEST)] for i in range(16)]
    behind = {}
    thread = threading.Thread(target=lambda: behind.setdefault("out", _score(task, hostile)))
    thread.start()
    here = _score(task, [_fence(c) for c in honest])
    thread.join()
    assert here.rewards.tolist() == [alone[c] for c in honest]
    assert behind["out"].rewards.tolist() == [0.0] * 16
    assert behind["out"].metrics["user/check_breaches"] == 1.0


def test_grade_details_are_capped_and_printable(task):
    """A forged record for index -1 (the harness's "solution failed to load") with a long text of
    control characters: the cached grade keeps 200 printable characters of it."""
    forger = ("import sys\nsys._getframe(1).f_locals['report'](-1, error='\\x1b[2J\\x00' * 50_000)\n"
              "def f(x):\n    return []\n")
    grade = task.grader.grade(forger, TESTS)
    assert len(grade.detail) <= 200 and grade.detail.isprintable(), grade.detail[:40]
    assert clean_detail("a\tb\x1b[0m\x00c") == "a b [0m c"
    assert grade.tests == [Verdict.FAIL] * 3
