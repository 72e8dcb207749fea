"""Preference pairs: read from a data file (the TRL columns `prompt`, `chosen`, `rejected`), or made from
a task's verifier.

`verifier_pairs(task, examples, rng)`: for each problem, `chosen` is the task's own solution and
`rejected` a completion the verifier scores strictly lower: a random arithmetic expression over
the problem's numbers (Countdown-style tasks; a well-formed wrong answer, the verifier's 0.1), else
another problem's solution; with ``rejected="near_miss"``, the solution with one operator changed
(the pair then differs in one token). A pair whose chosen completion the verifier does not score
highest is dropped, so every pair is ranked by the true reward.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.tasks.files import load_rows

__all__ = ["Pair", "load_pairs", "verifier_pairs"]


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    margin: float | None = None  # a Bradley–Terry margin of this pair (None: the config's)


def load_pairs(path: str | Path) -> list[Pair]:
    """Pairs from a data file (JSONL, JSON, Parquet or a saved HF dataset, as `task.path` reads),
    one row per pair with string `prompt`, `chosen`, `rejected` (and an optional number `margin`)."""
    out = []
    for row, where in load_rows(path, field="preference.data"):
        missing = [k for k in ("prompt", "chosen", "rejected") if not isinstance(row.get(k), str)]
        if missing:
            raise ConfigError(f"preference.data: {where} lacks string field(s) {', '.join(missing)}; "
                              f"each row is {{\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}}")
        margin = row.get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                                   or not math.isfinite(margin)):
            raise ConfigError(f"preference.data: {where} has margin {margin!r}; a margin is a finite number "
                              f"(or leave it out for preference.margin)")
        out.append(Pair(row["prompt"], row["chosen"], row["rejected"], None if margin is None else float(margin)))
    if not out:
        raise ConfigError(f"preference.data: '{path}' holds no pairs")
    return out


def _wrong_expression(numbers: list[int], rng: random.Random) -> str:
    order = list(numbers)
    rng.shuffle(order)
    text = str(order[0])
    for n in order[1:]:
        text += rng.choice("+-*") + str(n)
    return text


def _near_miss(solution: str, rng: random.Random) -> str:
    """`solution` with one of its operators replaced by another (unchanged if it has none).

    >>> _near_miss("5*9+3", random.Random(0)) in {"5+9+3", "5-9+3", "5*9-3", "5*9*3"}
    True
    """
    spots = [i for i, c in enumerate(solution) if c in "+-*"]
    if not spots:
        return solution
    i = rng.choice(spots)
    return solution[:i] + rng.choice([o for o in "+-*" if o != solution[i]]) + solution[i + 1:]


def verifier_pairs(task, examples, rng: random.Random, *, tries: int = 8, rejected: str = "random") -> list[Pair]:
    """One pair per example the verifier can rank (see the module doc); `rejected`: ``random`` or
    ``near_miss``."""
    solutions = [task.solution(ex) for ex in examples]
    out = []
    for ex, chosen in zip(examples, solutions):
        fields = {"answer": ex.answer, "meta": ex.meta}
        best = task.reward(ex.prompt, chosen, **fields)
        numbers = (ex.meta or {}).get("numbers")
        for _ in range(tries):
            if rejected == "near_miss":
                wrong = _near_miss(chosen, rng)
            elif numbers:
                wrong = _wrong_expression(numbers, rng)
            else:
                wrong = solutions[rng.randrange(len(solutions))] if len(solutions) > 1 else ""
            if task.reward(ex.prompt, wrong, **fields) < best:
                out.append(Pair(ex.prompt, chosen, wrong))
                break
    return out
