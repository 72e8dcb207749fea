"""count_shapes: how many shapes of one colour does a rendered picture hold?

A `size`² RGB picture on a white ground holds `min_shapes`..`max_shapes` filled shapes (squares
or discs) in the first `colours` of red, green and blue, one per cell of a 4×4 grid with a
jitter; the prompt asks for one colour (``"<image>red?"``), the answer is the count as digits.
Difficulty knobs: `max_shapes` (more shapes, larger counts) and `colours` (1: count every shape;
2-3: find the asked colour among the others too). Seeded and infinite: a layout is a pure function of its RNG draws.
Held-out split: a stable hash of the layout puts one layout in ``HELDOUT_BUCKETS`` in the held-out
bucket, which `sample` never draws, so the two sets are disjoint. Reward 1.0 for the exact count
(surrounding whitespace ignored), else 0.0.
"""

from __future__ import annotations

import hashlib
import random

from PIL import Image, ImageDraw

from rlvr.types import Example

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (40, 60, 220)}
HELDOUT_BUCKETS = 8
_HELDOUT_SEED = "rlvr.count_shapes.heldout"
GRID = 4
IMAGE = "<image>"


def render(layout: tuple[tuple[int, str, str, int, int], ...], size: int) -> Image.Image:
    """The picture of `layout`: (cell, colour, kind, shift x, shift y) per shape; kind `square` or `disc`."""
    im = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(im)
    cell = size // GRID
    side = max(3, cell * 5 // 8)
    for index, colour, kind, shift_x, shift_y in layout:
        x0, y0 = (index % GRID) * cell + shift_x, (index // GRID) * cell + shift_y
        box = (x0, y0, x0 + side - 1, y0 + side - 1)
        (draw.rectangle if kind == "square" else draw.ellipse)(box, fill=COLOURS[colour])
    return im


def layout_key(layout, colour: str) -> str:
    return hashlib.sha256(repr((layout, colour)).encode()).hexdigest()


def is_heldout(layout, colour: str) -> bool:
    return int(layout_key(layout, colour), 16) % HELDOUT_BUCKETS == 0


class CountShapes:
    """Count the shapes of one colour. Knobs: `min_shapes`, `max_shapes` (difficulty), `size` (pixels)."""

    name = "count_shapes"

    def __init__(self, *, min_shapes: int = 1, max_shapes: int = 6, colours: int = 3, size: int = 64,
                 heldout_size: int = 200, seed: int = 0):
        if not 1 <= min_shapes <= max_shapes <= GRID * GRID:
            raise ValueError(f"count_shapes: need 1 <= min_shapes <= max_shapes <= {GRID * GRID}; "
                             f"got min_shapes={min_shapes}, max_shapes={max_shapes}")
        if not 1 <= colours <= len(COLOURS):
            raise ValueError(f"count_shapes: colours must be 1..{len(COLOURS)}; got {colours}")
        if size < 4 * GRID:
            raise ValueError(f"count_shapes: size must be at least {4 * GRID} pixels; got {size}")
        self.min_shapes, self.max_shapes, self.size = min_shapes, max_shapes, size
        self.palette = list(COLOURS)[:colours]  # red, green, blue in that order
        self.heldout_size = heldout_size
        self._rng = random.Random(seed)
        self._heldout = self._heldout_set()

    def _draw(self, rng: random.Random):
        n = rng.randint(self.min_shapes, self.max_shapes)
        cell = self.size // GRID
        slack = cell - max(3, cell * 5 // 8)
        cells = sorted(rng.sample(range(GRID * GRID), n))
        layout = tuple((c, rng.choice(self.palette), rng.choice(("square", "disc")), rng.randint(0, slack),
                        rng.randint(0, slack)) for c in cells)
        return layout, rng.choice(self.palette)

    def example(self, layout, colour: str) -> Example:
        count = sum(1 for shape in layout if shape[1] == colour)
        return Example(prompt=f"{IMAGE}{colour}?", answer=str(count),
                       meta={"images": [render(layout, self.size)], "source": f"n{len(layout)}"})

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        rng = self._rng if rng is None else rng
        out = []
        while len(out) < n:
            layout, colour = self._draw(rng)
            if not is_heldout(layout, colour):
                out.append(self.example(layout, colour))
        return out

    def _heldout_set(self) -> list[Example]:
        rng, seen, out = random.Random(_HELDOUT_SEED), set(), []
        for _ in range(1000 * max(self.heldout_size, 1)):
            if len(out) == self.heldout_size:
                break
            layout, colour = self._draw(rng)
            key = layout_key(layout, colour)
            if key not in seen and is_heldout(layout, colour):
                seen.add(key)
                out.append(self.example(layout, colour))
        return out

    def heldout(self) -> list[Example]:
        return list(self._heldout)

    def reward(self, prompt: str, completion: str, /, **example) -> float:
        """1.0 for the exact count, else 0.0.

        >>> CountShapes(heldout_size=0).reward("<image>red?", " 3 ", answer="3")
        1.0
        """
        return 1.0 if completion.strip() == str(example.get("answer")) else 0.0

    def solution(self, example: Example) -> str:
        """The reference completion (the supervised warm start's target)."""
        return example.answer

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.reward(example.prompt, completion, answer=example.answer) == 1.0
