"""How long each guard takes to stop hostile or hung work: the verifier's length bound, the reward
runner's deadline (sync and async), the symbolic math pool's kill, the agent tool's deadline.

    python bench/guards.py [--repeats 5]

Prints one row per guard: the limit it enforces, the median and worst wall time (ms) of one guarded
call over ``--repeats`` (after one warm-up call), and the time the guard is meant to stay under.
The tests check what each guard does (the verdict, the call abandoned or killed); only this script
times them.

- `countdown length bound`: `Countdown.reward` of three hostile completions ("(" * 10^6, a
  10^6-digit number, "9*" * 10^6 + "9") and of 10^6 spaces + "3+5*2", all four per call.
- `reward timeout (sync)` / `(async)`: `RewardRunner(timeout_s=0.2)` over 3 rows, one hanging.
- `math symbolic timeout`: a sympy bomb (``9^{9^{9^{9}}}``) in the symbolic pool, `timeout_s=0.5`: kill included.
- `agent tool timeout`: `ToolRegistry(timeout_s=0.2).call` of a tool that hangs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable

from rlvr.agents.tools import ToolCall, ToolRegistry
from rlvr.rewards import math as m
from rlvr.rewards.runner import RewardRunner
from rlvr.tasks.countdown import MAX_COMPLETION_CHARS, Countdown
from rlvr.types import Example

RELEASE = threading.Event()  # set at exit: every abandoned hanging call then returns


def _timed(fn: Callable[[], None]) -> Callable[[], float]:
    def call() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return call


def _countdown() -> Callable[[], float]:
    task, ex = Countdown(), Example("3 5 2>13:", "3+5*2", {"numbers": [3, 5, 2], "target": 13})
    hostile = ("(" * 10**6, "9" * 10**6, "9*" * 10**6 + "9")

    def call() -> None:
        assert [task.reward(ex.prompt, h, meta=ex.meta) for h in hostile] == [0.0, 0.0, 0.0]
        assert task.reward(ex.prompt, " " * 10**6 + "3+5*2", meta=ex.meta) == 1.0
    return _timed(call)


def _reward_sync() -> Callable[[], float]:
    def hang(prompt, completion, **ex):
        if completion == "hang":
            RELEASE.wait(60)
        return 1.0
    runner = RewardRunner(hang, name="hang", timeout_s=0.2)
    return _timed(lambda: _check_runner(runner))


def _reward_async() -> Callable[[], float]:
    async def hang(prompt, completion, **ex):
        await asyncio.sleep(60 if completion == "hang" else 0)
        return 1.0
    runner = RewardRunner(hang, name="hang", timeout_s=0.2)
    return _timed(lambda: _check_runner(runner))


def _check_runner(runner: RewardRunner) -> None:
    out = runner(["q"] * 3, ["ok", "hang", "ok"], [{}, {}, {}])
    assert out.metrics["hang/timeouts"] == 1.0 and out.rewards[2] == 1.0


def _math() -> Callable[[], float]:
    def call() -> float:
        assert m.math_equal("x^2", "x \\cdot x", timeout_s=30.0)  # (re)starts a worker, outside the timed part
        start = time.perf_counter()
        assert m.math_equal("9^{9^{9^{9}}}", "5", timeout_s=0.5) is False  # a sympy bomb: killed at the deadline
        return time.perf_counter() - start
    return call


def _tool() -> Callable[[], float]:
    def hang(x: str) -> str:
        """Hangs."""
        RELEASE.wait(60)
        return x
    tools = ToolRegistry.of(hang, timeout_s=0.2)
    return _timed(lambda: _assert_eq(tools.call(ToolCall("hang", {"x": "1"})).error, "timeout"))


def _assert_eq(got, want) -> None:
    assert got == want, (got, want)


GUARDS = [  # (name, limit, budget ms, make the timed call)
    ("countdown length bound", f"{MAX_COMPLETION_CHARS} chars", 1000, _countdown),
    ("reward timeout (sync)", "0.2 s", 2000, _reward_sync),
    ("reward timeout (async)", "0.2 s", 2000, _reward_async),
    ("math symbolic timeout", "0.5 s", 2000, _math),
    ("agent tool timeout", "0.2 s", 2000, _tool),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per guard (after one warm-up)")
    args = parser.parse_args()
    print("| guard | limit | median ms | max ms | budget ms | within |")
    print("|---|---|---|---|---|---|")
    try:
        for name, limit, budget, make in GUARDS:
            call = make()
            call()
            ms = [call() * 1e3 for _ in range(args.repeats)]
            print(f"| {name} | {limit} | {statistics.median(ms):.1f} | {max(ms):.1f} | {budget} | "
                  f"{'yes' if max(ms) < budget else 'NO'} |")
    finally:
        RELEASE.set()


if __name__ == "__main__":
    main()
