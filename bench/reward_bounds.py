"""What bounding every reward per sample costs and buys: honest throughput of the math verifier in
the trainer's process and in worker processes, and the time of a 16-completion step with 0, 1, 4
and 8 hostile completions of each class.

    python bench/reward_bounds.py [--n 2048] [--deadline 2] [--workers 2]

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

from test_reward_workers import HONEST, HOSTILE, user_check  # noqa: E402  (the hostile classes, defined once)

from rlvr.rewards import math_pool  # noqa: E402
from rlvr.rewards.forms import TASK_VERIFIER, with_task  # noqa: E402
from rlvr.rewards.runner import RewardRunner, RewardSum  # noqa: E402
from rlvr.tasks.files import MathFileTask  # noqa: E402
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

    def before(prompts, completions, exs):  # no `correct`: `scored` calls `task.is_correct` bare, as it did
        return local(prompts, completions, exs)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048, help="honest answers per throughput run")
    parser.add_argument("--deadline", type=float, default=2.0, help="reward.timeout_s")
    parser.add_argument("--workers", type=int, default=2, help="reward.workers")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.jsonl"
        rows.write_text(json.dumps({"question": "q", "answer": "72"}) + "\n")
        task = MathFileTask(path=str(rows), math_timeout_s=args.deadline)
        throughput(task, args.n, args.workers, args.deadline)
        hostile_steps(task, args.deadline, args.workers)


if __name__ == "__main__":
    main()
