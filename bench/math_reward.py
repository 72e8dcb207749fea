"""The math reward's cost: honest GSM8K-style throughput, and hostile completions' wall time.

    python bench/math_reward.py [--n 4000] [--repeats 9] [--hostile-chars 1000000] [--limit-s 60]
    python bench/math_reward.py --against OLD_MATH.py   # e.g. git show REV:src/rlvr/rewards/math.py > OLD_MATH.py

Honest rows: seeded GSM8K-style completions (a few lines of working, then the final answer as
``#### X``, "The answer is X.", ``\\boxed{X}`` or ``<answer>X</answer>``; integers, thousands
separators, decimals, ``\\frac``, dollars), each scored against a GSM8K reference
(``"...#### X"``) with ``math_reward(strict=False)``; every one must score 1.0. The table gives the
best answers/s of ``--repeats`` passes after one warm-up pass (the best, not the median: on a shared
host the slow passes measure the neighbours; the symbolic worker is never asked: every answer is a
plain number). ``--against FILE`` loads another ``math.py`` (one that needs only the standard
library and ``rlvr``) and alternates its passes with this tree's in the same process, so both see
the same load; it prints both rates and their ratio.

Hostile rows: one completion per shape, ``--hostile-chars`` long, scored in a child process (so a
shape that holds the GIL for minutes is cut off at ``--limit-s`` and printed as ``> limit``):

- `sci-exponent`: ``\\boxed{1e<many digits>}`` (scientific notation handed to a Fraction);
- `digit-run`: ``\\boxed{<digits>x}`` (a long digit run before a decimal pattern fails);
- `open-tags`: ``<answer>`` repeated, never closed;
- `answer-newlines`: "answer:" followed by newlines only;
- `nested-boxes`: ``\\boxed{`` repeated, never closed.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlvr.rewards.math import math_reward

SHAPES = {
    "sci-exponent": lambda n: "\\boxed{1e" + "9" * min(n - 9, 8) + "}",
    "digit-run": lambda n: "\\boxed{" + "1" * (n - 9) + "x}",
    "open-tags": lambda n: "<answer>" * (n // 8),
    "answer-newlines": lambda n: "answer:" + "\n" * (n - 7),
    "nested-boxes": lambda n: "\\boxed{" * (n // 7),
}


def honest_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(completion, GSM8K reference) pairs whose final answer is right."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 500), rng.randint(2, 90)
        kind = i % 6
        if kind == 0:
            value, shown = a * b, str(a * b)
        elif kind == 1:
            value = a * b * 37
            shown = f"{value:,}"
        elif kind == 2:
            value, shown = f"{a}.{b:02d}", f"{a}.{b:02d}"
        elif kind == 3:
            value, shown = f"\\frac{{{a}}}{{{b}}}", f"\\frac{{{a}}}{{{b}}}"
        elif kind == 4:
            value, shown = a + b, f"\\${a + b}"
        else:
            value, shown = a - b, str(a - b)
        work = (f"Natalia sold {a} clips in April and {b} in May.\nFirst, {a} * {b} = {a * b}.\n"
                f"Then {a} + {b} = {a + b}, so we combine the steps.\n")
        ending = (f"#### {shown}", f"The answer is {shown}.", f"So the total is $\\boxed{{{shown}}}$.",
                  f"<answer>{shown}</answer>")[i % 4]
        rows.append((work + ending, f"{work}#### {value}"))
    return rows


def throughput(rows: list[tuple[str, str]], repeats: int, rewards: list[Callable]) -> list[float]:
    """Best answers/s of each reward function, their passes alternated."""
    for reward in rewards:
        scores = [reward("q", c, answer=g) for c, g in rows]
        if scores != [1.0] * len(rows):
            bad = next(r for r, s in zip(rows, scores) if s != 1.0)
            raise SystemExit(f"an honest row scored 0: {bad!r}")
    rates = [[] for _ in rewards]
    for _ in range(repeats):
        for reward, rate in zip(rewards, rates):
            start = time.perf_counter()
            for c, g in rows:
                reward("q", c, answer=g)
            rate.append(len(rows) / (time.perf_counter() - start))
    return [max(rate) for rate in rates]


def _load(path: Path) -> Callable:
    spec = importlib.util.spec_from_file_location("math_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.math_reward


def _child(shape: str, chars: int) -> None:
    text = SHAPES[shape](chars)
    math_reward("q", "\\boxed{x+1}", answer="1+x")  # the symbolic worker started: its start-up is not timed
    start = time.perf_counter()
    score = math_reward("q", text, answer="#### 72")
    print(f"{time.perf_counter() - start:.4f} {score}")


def hostile(shape: str, chars: int, limit_s: float) -> str:
    cmd = [sys.executable, __file__, "--child", shape, "--hostile-chars", str(chars)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, check=True).stdout.split()
    except subprocess.TimeoutExpired:
        return f"> {limit_s:.0f} s (killed)"
    return f"{float(out[0]) * 1000:.1f} ms (reward {out[1]})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--hostile-chars", type=int, default=1_000_000)
    ap.add_argument("--limit-s", type=float, default=60.0)
    ap.add_argument("--against", type=Path, help="another math.py to time on the same rows, passes alternated")
    ap.add_argument("--child", choices=sorted(SHAPES))
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.hostile_chars)
    rewards = [math_reward] + ([_load(args.against)] if args.against else [])
    rates = throughput(honest_rows(args.n), args.repeats, rewards)
    print("| completions | what | result |\n|---|---|---|")
    print(f"| {args.n} honest GSM8K-style | answers/s (best of {args.repeats}) | {rates[0]:,.0f} |")
    if args.against:
        print(f"| the same, `{args.against.name}` | answers/s (best of {args.repeats}, passes alternated) "
              f"| {rates[1]:,.0f} (this tree: {rates[0] / rates[1]:.2f}×) |")
    for shape in SHAPES:
        print(f"| 1 hostile `{shape}`, {args.hostile_chars:,} chars | wall time of one reward call | "
              f"{hostile(shape, args.hostile_chars, args.limit_s)} |")


if __name__ == "__main__":
    main()
