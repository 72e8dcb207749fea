"""sudoku4: fill the blanks of a 4×4 Sudoku (the d1 / SPG planning task, sized for a CPU).

Prompt: the 16 cells row by row, `0` for a blank, then `:` (``"1204003...:"``); completion: the
16 digits of the solved grid. Reward (d1's metric): the fraction of the originally blank cells
whose digit in the completion equals the solution's (partial credit); a completion shorter than
16 characters scores the cells it has. ``is_correct`` = every blank right.

Split by solution grid (SPG's fix of d1's leakage: only 288 distinct 4×4 grids exist, so a
random puzzle split shares solutions between train and test): a stable SHA-256 hash of the
solved grid puts one grid in ``HELDOUT_BUCKETS`` into the held-out bucket; ``sample`` never
draws a held-out grid, ``heldout()`` draws only held-out grids, so test solutions are unseen.

Puzzles have a unique solution: cells are blanked in random order, skipping any blank that
would admit a second solution, until ``num_blanks`` (drawn from ``min_blanks..max_blanks``) are
blank or no cell can be removed. Deviations from d1: no ``<answer>`` tags or reasoning, no
few-shot examples (SPG uses 3-shot), procedural instead of a fixed CSV.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random

from rlvr.types import Example

HELDOUT_BUCKETS = 5
_HELDOUT_SEED = "rlvr.sudoku4.heldout"


@functools.cache
def all_grids() -> tuple[str, ...]:
    """The 288 valid 4×4 Sudoku grids as 16-character strings."""
    rows = ["".join(p) for p in itertools.permutations("1234")]
    grids = []
    for r0, r1, r2, r3 in itertools.product(rows, repeat=4):
        g = r0 + r1 + r2 + r3
        cols_ok = all(len({g[r * 4 + c] for r in range(4)}) == 4 for c in range(4))
        boxes_ok = all(len({g[(br + i) * 4 + bc + j] for i in (0, 1) for j in (0, 1)}) == 4
                       for br in (0, 2) for bc in (0, 2))
        if cols_ok and boxes_ok:
            grids.append(g)
    return tuple(grids)


def is_heldout_grid(grid: str) -> bool:
    return int(hashlib.sha256(grid.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def count_solutions(puzzle: str) -> int:
    return sum(all(p == "0" or p == g for p, g in zip(puzzle, grid)) for grid in all_grids())


class Sudoku4:
    """Procedural 4×4 Sudoku. Knobs: ``min_blanks``/``max_blanks`` (4..12), ``heldout_size``."""

    name = "sudoku4"

    def __init__(self, *, min_blanks: int = 6, max_blanks: int = 10, heldout_size: int = 200, seed: int = 0):
        if not 1 <= min_blanks <= max_blanks <= 12:
            raise ValueError(f"sudoku4: need 1 <= min_blanks <= max_blanks <= 12, got {min_blanks}, {max_blanks}")
        self.min_blanks, self.max_blanks, self.heldout_size = min_blanks, max_blanks, heldout_size
        self._rng = random.Random(seed)
        self._train = [g for g in all_grids() if not is_heldout_grid(g)]
        self._test = [g for g in all_grids() if is_heldout_grid(g)]
        self._heldout: list[Example] | None = None

    def _puzzle(self, grid: str, rng: random.Random) -> Example:
        target = rng.randint(self.min_blanks, self.max_blanks)
        cells = list(grid)
        order = list(range(16))
        rng.shuffle(order)
        blanks = 0
        for i in order:
            if blanks == target:
                break
            saved, cells[i] = cells[i], "0"
            if count_solutions("".join(cells)) == 1:
                blanks += 1
            else:
                cells[i] = saved
        puzzle = "".join(cells)
        return Example(prompt=puzzle + ":", answer=grid, meta={"puzzle": puzzle, "solution": grid})

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        """``n`` training puzzles (solutions never in the held-out bucket)."""
        rng = self._rng if rng is None else rng
        return [self._puzzle(rng.choice(self._train), rng) for _ in range(n)]

    def heldout(self) -> list[Example]:
        """``heldout_size`` distinct puzzles on held-out solution grids, from a fixed seed."""
        if self._heldout is None:
            rng = random.Random(f"{_HELDOUT_SEED}/{self.min_blanks}/{self.max_blanks}")
            seen, out = set(), []
            for _ in range(100 * max(self.heldout_size, 1)):
                if len(out) == self.heldout_size:
                    break
                ex = self._puzzle(rng.choice(self._test), rng)
                if ex.prompt not in seen:
                    seen.add(ex.prompt)
                    out.append(ex)
            self._heldout = out
        return [Example(e.prompt, e.answer, dict(e.meta)) for e in self._heldout]

    def reward(self, prompt: str, completion: str, /, **example) -> float:
        """Fraction of blank cells filled with the solution's digit.

        >>> task = Sudoku4()
        >>> p = "1234341221434301:"  # one blank (cell 15), solution ...4321
        >>> [task.reward(p, c) for c in ("1234341221434321", "1234341221434311", "")]
        [1.0, 0.0, 0.0]
        """
        meta = example.get("meta") or {}
        puzzle = meta.get("puzzle") or prompt.rstrip(":")
        solution = meta.get("solution") or example.get("answer") or _solve(puzzle)
        blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
        if not blanks or solution is None:
            return 0.0
        text = completion.strip()
        return sum(i < len(text) and text[i] == solution[i] for i in blanks) / len(blanks)

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.reward(example.prompt, completion, answer=example.answer, meta=example.meta) == 1.0

    def solution(self, example: Example) -> str:
        return example.meta.get("solution") or _solve(example.prompt.rstrip(":"))


def _solve(puzzle: str) -> str | None:
    for grid in all_grids():
        if all(p == "0" or p == g for p, g in zip(puzzle, grid)):
            return grid
    return None
