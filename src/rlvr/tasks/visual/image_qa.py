"""image_qa: questions about images from a JSONL file (geo3k / ChartQA style), for vision-language models.

Each row: `image` (a path) or `images` (a list of paths), relative to the file's folder; the
question (`question`); the answer (`answer`); optional `choices` (a list: a multiple-choice row,
the answer one of the choices or its letter). A row's prompt is one `<image>` per image, then
the question, then the choices as `A. ...` lines. Scoring: a multiple-choice row is right when
the completion's first standalone letter (A, B, ...) is the answer's; any other row by the math
checker of `math_file` (`rewards.math`: the boxed / tagged / last answer, symbolic equality).
Every image is opened and checked when the task is built (`images.load_image`), before training.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlvr.errors import ConfigError
from rlvr.tasks.files import MathFileTask
from rlvr.tasks.visual.images import load_image
from rlvr.types import Example

IMAGE = "<image>"
LETTERS = "ABCDEFGHIJ"
_LETTER = re.compile(r"\b([A-J])\b")


def choice_letter(completion: str) -> str | None:
    """The first standalone capital letter A-J of `completion`, or None.

    >>> choice_letter("The answer is (B).")
    'B'
    >>> choice_letter("none") is None
    True
    """
    found = _LETTER.search(completion)
    return found.group(1) if found else None


class ImageQATask(MathFileTask):
    """Rows with images; knobs as `math_file` plus `max_pixels` and `max_images` (per row)."""

    name = "image_qa"

    def __init__(self, *, path: str, max_pixels: int = 4096 * 4096, max_images: int = 4, **kwargs):
        self.base = Path(path).parent
        self.max_pixels, self.max_images = max_pixels, max_images
        kwargs.setdefault("strict", False)  # short answers ("12") are the norm in image QA
        super().__init__(path=path, **kwargs)

    def _images(self, row: dict, where: str) -> list:
        field = "images" if "images" in row else "image"
        if field not in row:
            raise ConfigError(f"{where}: field 'image' (or 'images') missing; an image_qa row needs its image path")
        paths = row[field] if field == "images" else [row[field]]
        if not isinstance(paths, list) or not paths:
            raise ConfigError(f"{where}: field 'images' must be a non-empty list of paths")
        if len(paths) > self.max_images:
            raise ConfigError(f"{where}: field {field!r} holds {len(paths)} images, over the limit of "
                              f"{self.max_images} (task.image_qa.max_images)")
        return [load_image(p, base=self.base, where=where, field=field, max_pixels=self.max_pixels) for p in paths]

    def _row_to_example(self, row: dict, where: str) -> Example:
        images = self._images(row, where)
        text = self._prompt(row, where)
        answer = str(self._field(row, self.answer_key, where, (str, int, float), f"task.{self.name}.answer_key"))
        meta = {"source": where, "images": images}
        choices = row.get("choices")
        if choices is not None:
            if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
                raise ConfigError(f"{where}: field 'choices' must be a list of 2 to {len(LETTERS)} options")
            options = [str(c) for c in choices]
            letter = answer.strip() if answer.strip() in LETTERS[:len(options)] else None
            if letter is None and answer not in options:
                raise ConfigError(f"{where}: field 'answer' {answer!r} is neither a choice nor its letter")
            meta["letter"] = letter or LETTERS[options.index(answer)]
            text = text + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(options))
        return Example(IMAGE * len(images) + self.format_prompt(text), answer, meta)

    def reward(self, prompt: str, completion: str, /, answer: str | None = None, **example) -> float | None:
        letter = (example.get("meta") or {}).get("letter") or example.get("letter")
        if letter is not None:
            return 1.0 if choice_letter(completion) == letter else 0.0
        return super().reward(prompt, completion, answer=answer)
