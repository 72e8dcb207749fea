"""The math verifier on the labelled corpus: false passes, false rejections, agreement with math-verify.

    python bench/math_corpus.py [--corpus tests/rewards/math_corpus.jsonl] [--rows]

Each corpus row is a completion, a reference answer, the verdict a careful grader gives
(``expected``) and a category (``kind``). rlvr's verdict is ``math_reward(strict=row["strict"])``;
math-verify's is ``verify(parse("$reference$"), parse(completion))`` with its default extraction
(LaTeX and plain expressions) and six-place float rounding. Prints one table row per category
(rows, rlvr's false passes and false rejections, math-verify's, and agreement), the totals, and
with ``--rows`` every row where rlvr and math-verify disagree.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from pathlib import Path

from rlvr.rewards.math import math_reward

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "rewards" / "math_corpus.jsonl"


def math_verify_verdict(completion: str, reference: str) -> bool:
    from math_verify import parse, verify

    logging.disable(logging.CRITICAL)  # math-verify logs every failed parse
    try:
        return bool(verify(parse(f"${reference}$"), parse(completion)))
    except Exception:  # noqa: BLE001 - any failure inside math-verify is "not shown equal"
        return False


def verdicts(rows: list[dict]) -> list[tuple[bool, bool]]:
    """(rlvr, math-verify) per row."""
    return [(math_reward("q", r["completion"], answer=r["reference"], strict=r.get("strict", False)) == 1.0,
             math_verify_verdict(r["completion"], r["reference"])) for r in rows]


def table(rows: list[dict], got: list[tuple[bool, bool]]) -> list[str]:
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    for row, (ours, theirs) in zip(rows, got):
        counts, expected = by_kind[row["kind"]], row["expected"]
        counts[0] += 1
        counts[1] += ours and not expected
        counts[2] += expected and not ours
        counts[3] += theirs and not expected
        counts[4] += expected and not theirs
        counts[5] += ours == theirs
    lines = ["| kind | rows | rlvr false passes | rlvr false rejections | math-verify false passes "
             "| math-verify false rejections | agreement |", "|---|---|---|---|---|---|---|"]
    total = [0] * 6
    for kind, c in by_kind.items():
        lines.append(f"| {kind} | {c[0]} | {c[1]} | {c[2]} | {c[3]} | {c[4]} | {c[5]} of {c[0]} |")
        total = [a + b for a, b in zip(total, c)]
    lines.append(f"| **all** | {total[0]} | {total[1]} | {total[2]} | {total[3]} | {total[4]} "
                 f"| {total[5]} of {total[0]} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--rows", action="store_true", help="also print every row where the two verdicts differ")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    got = verdicts(rows)
    print("\n".join(table(rows, got)))
    if args.rows:
        for row, (ours, theirs) in zip(rows, got):
            if ours != theirs or ours != row["expected"]:
                print(f"{row['kind']}: expected={row['expected']} rlvr={ours} math-verify={theirs} "
                      f"ref={row['reference']!r} completion=...{row['completion'][-70:]!r}")


if __name__ == "__main__":
    main()
