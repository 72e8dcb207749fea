"""What bounding every reward per sample costs and buys: honest throughput of the math verifier in
the trainer's process and in worker processes, and the time of a 16-completion step with 0, 1, 4
and 8 hostile completions of each class.

    python bench/reward_bounds.py [--n 2048] [--deadline 2] [--workers 2] [--code] [--only math|code|never]

Table 1, answers/s of the math file task's verifier on honest GSM8K-style completions (a mix of
``#### N``, ``\\boxed{N}``, fractions and wrong answers), best of 5 rounds timed in turn: called
bare; through `RewardRunner` in the trainer's process (``reward.workers=0``, each call on a
deadline thread: the path every reward took before worker processes); through `RewardRunner` in
``--workers`` processes. Then the trainer's whole call (`rlvr.trainer.scoring.scored`: rewards and
``is_correct``) as it was (``is_correct`` called bare), with ``reward.workers=0`` and in the workers
(the file task's ``is_correct`` read off its reward call), and ``is_correct`` asked on its own in
the workers (as for a task that does not declare it: the hostile steps below, a sum of two functions).

Table 2, one `rlvr.trainer.scoring.scored` call (rewards and `is_correct`, the trainer's own call)
of 16 completions with a weighted sum of the math verifier and a user function, k of them hostile:
``gil`` (the user function's regex backtracks on it, in C, holding the GIL), ``sympy`` (a power
tower the symbolic check never finishes), ``memory`` (the user function allocates 8 GiB),
``slow`` (the user function sleeps). Step seconds against the deadline and the honest step alone.

Table 3, the pools' cost: processes forked, calls answered, and the proportional memory (PSS) of
each pool's processes after the runs.

Table 4 (``--code``; needs a working sandbox), the code task: honest programs graded per second with
the checks in check workers against the checks in the trainer's process (the path before), timed in
turn (best of 4 rounds, which goes first alternating); then a 16-completion step with k programs
that flood the checks' hash tables (``flood``:
37,000 multiples of 2^61 − 1, a set of them takes 30 s to build unbounded) or forge a result record
holding such a set (``forged``).

Table 5, a reward function that never returns (it sleeps), 128 samples a step, two steps: with
``--workers`` processes, in the trainer's process (``reward.workers=0``), and as an ``async`` function.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rewards"))

from test_code_checks import HONEST as HONEST_CODE  # noqa: E402
from test_code_checks import HOSTILE as HOSTILE_CODE  # noqa: E402
from test_code_checks import TESTS as CODE_TESTS  # noqa: E402
from test_reward_workers import HONEST, HOSTILE, sleepy, sleepy_async, user_check  # noqa: E402  (defined once)

from rlvr.builder.placement import as_verifier  # noqa: E402
from rlvr.rewards import math_pool  # noqa: E402
from rlvr.rewards.code import grade_asserts  # noqa: E402
from rlvr.rewards.forms import TASK_VERIFIER, with_task  # noqa: E402
from rlvr.rewards.runner import RewardRunner, RewardSum  # noqa: E402
from rlvr.tasks.files import CodeFileTask, MathFileTask  # noqa: E402
from rlvr.trainer.scoring import scored  # noqa: E402
from rlvr.types import Example  # noqa: E402

GSM8K_STYLE = [
    "Natalia sold 48/2 = 24 clips in May. Altogether she sold 48+24 = 72 clips.\n#### 72",
    "She earns 12/60 = $0.2 per minute, so for 50 minutes she earns 0.2 x 50 = $10.\nThe answer is \\boxed{10}.",
    "Half of 1,234 is 617, so the final answer is \\boxed{617}",
    "The ratio is \\frac{3}{4} of the whole, 0.75 in decimals.\n#### 3/4",
    "Adding the three boxes: 17 + 23 + 31 = 71.\n#### 71",
    "So each friend gets $\\boxed{\\dfrac{5}{2}}$ pizzas.",
]
ANSWERS = ["72", "10", "617", "0.75", "72", "2.5"]


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pss_mb(pids) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def _children() -> list[int]:
    """Every descendant of this process (the pools' zygotes and workers)."""
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            kids = [int(k) for t in os.listdir(f"/proc/{pid}/task")
                    for k in open(f"/proc/{pid}/task/{t}/children").read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def throughput(task, n: int, workers: int, deadline: float, repeats: int = 5) -> None:
    texts = [GSM8K_STYLE[i % len(GSM8K_STYLE)] for i in range(n)]
    examples = [{"answer": ANSWERS[i % len(ANSWERS)]} for i in range(n)]
    group = [Example("q", ANSWERS[i % len(ANSWERS)], {}) for i in range(n)]
    # as the builder makes the task's verifier: its `is_correct` is read off the reward call
    local = RewardRunner(task.reward, name="task", timeout_s=deadline, verifies=task)
    pooled = RewardRunner(task.reward, name="task", timeout_s=deadline, workers=workers, verifies=task)
    want = [task.reward("q", t, **ex) for t, ex in zip(texts, examples)]
    assert local(["q"] * n, texts, examples).rewards == want == pooled(["q"] * n, texts, examples).rewards

    def bare(prompts, completions, exs):  # no `correct`: `task.is_correct` is called bare, as it was
        return local(prompts, completions, exs)
    before = as_verifier(bare)

    rows = [  # (table, row, call); rows of a table are timed in turn, `repeats` rounds, best kept
        ("reward", "bare `task.reward` loop", lambda: [task.reward("q", t, **ex) for t, ex in zip(texts, examples)]),
        ("reward", "deadline thread per sample (reward.workers=0)", lambda: local(["q"] * n, texts, examples)),
        ("reward", f"worker processes (reward.workers={workers})", lambda: pooled(["q"] * n, texts, examples)),
        ("scored", "before: rewards on deadline threads, is_correct bare", lambda: scored(before, task, group, texts)),
        ("scored", "reward.workers=0: is_correct read off the rewards", lambda: scored(local, task, group, texts)),
        ("scored", f"reward.workers={workers}: the same, in the workers", lambda: scored(pooled, task, group, texts)),
        ("is_correct", f"asked on its own in the workers (reward.workers={workers})",
         lambda: pooled.correct(task, group, texts)),
    ]
    for _, _, call in rows:  # warm: zygotes forked, sympy imported
        call()
    best = [float("inf")] * len(rows)
    for _ in range(repeats):
        for i, (_, _, call) in enumerate(rows):
            best[i] = min(best[i], _seconds(call))
    before_of = {"reward": 1, "scored": 3}  # the path every reward took before worker processes
    print(f"\n| math verifier, {n} honest answers | answers/s | vs before |")
    print("|---|---|---|")
    for i, (table, name, _) in enumerate(rows):
        ratio = f"{best[before_of[table]] / best[i]:.2f}x" if i >= before_of.get(table, len(rows)) else ""
        print(f"| {table}: {name} | {n / best[i]:,.0f} | {ratio} |")


def hostile_steps(task, deadline: float, workers: int) -> None:
    reward = RewardSum(with_task([TASK_VERIFIER, user_check], task), [1.0, 1.0], timeout_s=deadline,
                       workers=workers, memory_mb=512)
    print(f"\n| 16 completions, deadline {deadline:g} s | hostile | step s | honest alone s | over the deadline s "
          "| hostile scored 0 | counted |")
    print("|---|---|---|---|---|---|---|")
    for kind in sorted(HOSTILE):
        completion, metric = HOSTILE[kind]
        for count in (0, 1, 4, 8):
            honest = [HONEST[i % len(HONEST)] for i in range(16 - count)]
            group = [Example("q", "72", {}) for _ in range(16)]
            scored(reward, task, group[:len(honest)], honest)
            start = time.monotonic()
            scored(reward, task, group[:len(honest)], honest)
            alone = time.monotonic() - start
            texts = honest[:8] + [completion] * count + honest[8:]
            start = time.monotonic()
            out = scored(reward, task, group, texts)
            step = time.monotonic() - start
            bad = range(min(8, len(honest)), min(8, len(honest)) + count)
            zero = all(out.rewards[i].item() == 0.0 and out.correct[i].item() == 0.0 for i in bad)
            print(f"| {kind} | {count} | {step:.2f} | {alone:.2f} | {max(0.0, step - alone - deadline):.2f} | "
                  f"{'yes' if zero else 'NO'} | {int(out.metrics.get(metric, 0))} |")
    costs(reward)


def costs(reward) -> None:
    print("\n| pool | workers forked | calls answered | breaches | busy s | PSS of all pools' processes MB |")
    print("|---|---|---|---|---|---|")
    pss = _pss_mb(_children())
    pools = [(f"reward {r.name}", r.pool.stats) for r in reward.runners] + [("math", math_pool.pool_stats())]
    for name, s in pools:
        print(f"| {name} | {s.forks} | {s.calls} | {s.timeouts + s.memory + s.crashes} | {s.busy_s:.2f} | "
              f"{pss:.0f} |")


class _Inline:
    """The checks in the trainer's process, as they ran before check workers."""

    def run(self, key, calls, timeout_s):
        return [(grade_asserts(*args, **kwargs), None) for args, kwargs in calls]


def code_steps(n: int, deadline: float, repeats: int = 4) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.jsonl"
        rows.write_text(json.dumps({"prompt": "write f", "tests": CODE_TESTS}) + "\n")
        task = CodeFileTask(path=str(rows))
        grader, pooled = task.grader, task.grader.checks
        items = [(HONEST_CODE[i % len(HONEST_CODE)], CODE_TESTS) for i in range(n)]
        want = [g.tests for g in grader.grade_many(items)]
        best = {"in check workers": float("inf"), "in the trainer's process (before)": float("inf")}
        for r in range(repeats):  # in turn, the first of each round alternating (the first runs slower here)
            for name, checks in list(zip(best, (pooled, _Inline())))[::1 if r % 2 else -1]:
                grader.checks = checks
                start = time.perf_counter()
                assert [g.tests for g in grader.grade_many(items)] == want
                best[name] = min(best[name], time.perf_counter() - start)
        grader.checks = pooled
        before = best["in the trainer's process (before)"]
        print(f"\n| code task, {n} honest programs x {len(CODE_TESTS)} asserts | programs/s | vs before |")
        print("|---|---|---|")
        for name, seconds in best.items():
            print(f"| checks {name} | {n / seconds:.1f} | {before / seconds:.2f}x |")
        reward = RewardSum(with_task([TASK_VERIFIER], task), [1.0], timeout_s=30.0, workers=2)
        print("\n| 16 programs | hostile | step s | honest alone s | hostile scored 0 | counted |")
        print("|---|---|---|---|---|---|")
        for kind in ("flood", "forged"):
            for count in (1, 4, 8):
                honest = [f"```python\n{HONEST_CODE[i % len(HONEST_CODE)]}```" for i in range(16 - count)]
                texts = honest[:8] + [f"```python\n{HOSTILE_CODE[kind]}```"] * count + honest[8:]
                group = [Example("write f", "", {"tests": CODE_TESTS}) for _ in texts]
                task._cache.clear()
                start = time.monotonic()
                scored(reward, task, group[:len(honest)], honest)
                alone = time.monotonic() - start
                task._cache.clear()
                start = time.monotonic()
                out = scored(reward, task, group, texts)
                step = time.monotonic() - start
                zero = all(out.rewards[i].item() == 0.0 for i in range(min(8, len(honest)), 8 + count))
                print(f"| {kind} | {count} | {step:.2f} | {alone:.2f} | {'yes' if zero else 'NO'} | "
                      f"{round(out.metrics['user/check_breaches'] * 16)} |")
        grader.sandbox.close()


def never_returning(deadline: float, workers: int) -> None:
    print(f"\n| a reward that never returns, 128 samples, deadline {deadline:g} s | step 1 s | step 2 s | timeouts |")
    print("|---|---|---|---|")
    for name, fn, w in ((f"reward.workers={workers}", sleepy, workers), ("reward.workers=0", sleepy, 0),
                        ("async", sleepy_async, 0)):
        runner = RewardRunner(fn, name="s", timeout_s=deadline, workers=w)
        steps = []
        for _ in range(2):
            start = time.monotonic()
            out = runner(["q"] * 128, [str(i) for i in range(128)], [{}] * 128)
            steps.append(time.monotonic() - start)
        print(f"| {name} | {steps[0]:.2f} | {steps[1]:.2f} | {int(out.metrics['s/timeouts'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="honest answers per throughput run")
    parser.add_argument("--deadline", type=float, default=2.0, help="reward.timeout_s")
    parser.add_argument("--workers", type=int, default=2, help="reward.workers")
    parser.add_argument("--code", action="store_true", help="also the code task's tables (needs a sandbox)")
    parser.add_argument("--code-n", type=int, default=48, help="honest programs per code throughput round")
    parser.add_argument("--only", choices=["math", "code", "never"], help="one part only")
    args = parser.parse_args()
    if args.only == "code" or (args.code and args.only is None):
        code_steps(args.code_n, args.deadline)
    if args.only in (None, "never"):
        never_returning(args.deadline, args.workers)
    if args.only not in (None, "math"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.jsonl"
        rows.write_text(json.dumps({"question": "q", "answer": "72"}) + "\n")
        task = MathFileTask(path=str(rows), math_timeout_s=args.deadline)
        throughput(task, args.n, args.workers, args.deadline)
        hostile_steps(task, args.deadline, args.workers)


if __name__ == "__main__":
    main()
