"""The symbolic math checks' pool: a sympy bomb costs its own check's deadline, its worker is killed
and replaced, checks asked at the same time from other threads are answered by the other workers,
and a worker over its memory budget fails only its check."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.rewards import math as m
from rlvr.rewards import math_pool
from rlvr.rewards.workers import WorkerPool

BOMB = "9^{9^{9^{9}}}"  # sympy evaluates the power tower exactly: it never finishes


@pytest.fixture
def pool():
    math_pool.configure(workers=2, memory_mb=1024)
    assert m.math_equal("\\sqrt{8}", "2\\sqrt{2}", timeout_s=60)  # started and warm
    yield math_pool
    math_pool.configure(workers=2, memory_mb=1024)


def test_a_bomb_costs_one_check_and_the_others_go_on(pool):
    before = dict(m.STATS)
    answers, times = {}, {}

    def ask(name, pred, gold, timeout_s):
        start = time.monotonic()
        answers[name] = m.math_equal(pred, gold, timeout_s=timeout_s)
        times[name] = time.monotonic() - start

    bomb = threading.Thread(target=ask, args=("bomb", BOMB, "5", 8.0))
    bomb.start()
    time.sleep(0.2)  # the bomb holds one worker
    ask("honest", "x^2 + 2x + 1", "(x+1)^2", 30.0)
    bomb.join()
    assert answers == {"bomb": False, "honest": True}
    assert times["honest"] < 4.0 < 8.0 < times["bomb"] < 12.0, times  # answered beside the bomb, not after it
    assert m.STATS["timeouts"] == before["timeouts"] + 1
    assert m.STATS["worker_restarts"] == before["worker_restarts"] + 1
    assert m.math_equal("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", timeout_s=30.0)  # a fresh worker


def test_the_pool_is_sized_by_config_and_reports_its_cost(pool):
    math_pool.configure(workers=3, memory_mb=512)
    assert math_pool._POOL.size == 3 and math_pool._POOL.memory_mb == 512
    assert m.math_equal("2x", "x+x", timeout_s=60)
    stats = math_pool.pool_stats()
    assert stats.calls == 1 and stats.forks == 1 and stats.busy_s > 0


def _allocate(mb):
    return len(bytearray(mb << 20))


def test_a_worker_over_its_memory_budget_fails_only_its_call():
    pool = WorkerPool({"alloc": _allocate}, size=1, memory_mb=200)
    out = pool.run("alloc", [((1000,), {}), ((10,), {}), ((1000,), {}), ((20,), {})], 10.0)
    assert [v for v, _ in out] == [None, 10 << 20, None, 20 << 20]
    assert out[0][1].startswith("RewardMemory") and pool.stats.memory == 2
    pool.close()
