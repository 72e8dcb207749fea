"""Visual tasks: count_shapes is seeded, infinite, held out apart, and its verifier exact;
image_qa reads image rows and refuses bad images in one line naming the row and field."""

from __future__ import annotations

import json
import random

import pytest
from PIL import Image

from rlvr.errors import ConfigError
from rlvr.tasks import make_task
from rlvr.tasks.visual.image_qa import ImageQATask
from rlvr.tasks.visual.shapes import COLOURS, CountShapes, layout_key


def _pixels_of(image, colour):
    return dict((c, n) for n, c in image.getcolors(maxcolors=1 << 16)).get(COLOURS[colour], 0)


def test_count_shapes_is_seeded_and_its_answer_is_the_count_in_the_picture():
    task = CountShapes(heldout_size=20, max_shapes=6)
    a, b = task.sample(10, random.Random(3)), task.sample(10, random.Random(3))
    assert [x.answer for x in a] == [y.answer for y in b]
    assert all(x.meta["images"][0].tobytes() == y.meta["images"][0].tobytes() for x, y in zip(a, b))
    for ex in a:
        colour = ex.prompt.removeprefix("<image>").removesuffix("?")
        side = max(3, (64 // 4) * 5 // 8)
        pixels = _pixels_of(ex.meta["images"][0], colour)
        assert (pixels == 0) == (ex.answer == "0")  # the picture holds the colour iff the count is > 0
        assert pixels <= int(ex.answer) * side * side  # no more of it than that many full squares


def test_count_shapes_heldout_is_disjoint_from_training_draws():
    task = CountShapes(heldout_size=30)
    held = {ex.meta["images"][0].tobytes() + ex.prompt.encode() for ex in task.heldout()}
    assert len(held) == 30
    drawn = task.sample(400, random.Random(0))
    assert not held & {ex.meta["images"][0].tobytes() + ex.prompt.encode() for ex in drawn}
    assert layout_key(((0, "red", "disc", 0, 0),), "red") != layout_key(((0, "red", "disc", 0, 0),), "blue")


def test_count_shapes_difficulty_knob_and_verifier():
    easy, hard = CountShapes(heldout_size=0, max_shapes=1), CountShapes(heldout_size=0, min_shapes=8, max_shapes=12)
    assert {ex.meta["source"] for ex in easy.sample(20, random.Random(0))} == {"n1"}
    assert max(int(ex.answer) for ex in hard.sample(50, random.Random(0))) > 3
    assert easy.reward("<image>red?", " 2\n", answer="2") == 1.0 and easy.reward("p", "3", answer="2") == 0.0
    with pytest.raises(ValueError, match="max_shapes"):
        CountShapes(min_shapes=5, max_shapes=2)


def _qa(tmp_path, rows, **kw):
    (tmp_path / "ok.png").parent.mkdir(exist_ok=True)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "ok.png")
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ImageQATask(path=str(path), heldout_size=1, **kw)


def test_image_qa_rows_become_image_prompts_with_math_and_choice_checking(tmp_path):
    task = _qa(tmp_path, [{"image": "ok.png", "question": "x?", "answer": "12"},
                          {"images": ["ok.png", "ok.png"], "question": "which?", "answer": "blue",
                           "choices": ["red", "blue"]},
                          {"image": "ok.png", "question": "y?", "answer": "3"}])
    examples = [*task.heldout(), *task._train]
    choice = next(ex for ex in examples if "letter" in ex.meta)
    assert choice.prompt == "<image><image>which?\nA. red\nB. blue" and choice.meta["letter"] == "B"
    assert task.is_correct("B", choice) and not task.is_correct("A. red", choice)
    number = next(ex for ex in examples if ex.answer == "12")
    assert task.is_correct("it is 12", number) and not task.is_correct("13", number)
    assert number.meta["images"][0].mode == "RGB"
    assert make_task("image_qa", path=str(tmp_path / "qa.jsonl"), heldout_size=1).heldout()


@pytest.mark.parametrize("make, message", [
    (lambda d: "gone.png", r"qa.jsonl:1: field 'image': image 'gone.png' not found"),
    (lambda d: (d / "bad.png").write_bytes(b"not an image") and "bad.png",
     r"qa.jsonl:1: field 'image': image 'bad.png' is not a readable image"),
    (lambda d: Image.new("RGB", (300, 300)).save(d / "big.png") or "big.png",
     r"qa.jsonl:1: field 'image': image 'big.png' is 300x300 pixels, over the limit of 10000"),
    (lambda d: Image.new("I;16", (8, 8)).save(d / "deep.png") or "deep.png",
     r"qa.jsonl:1: field 'image': image 'deep.png' has mode 'I;16'"),
])
def test_bad_images_are_refused_naming_row_and_field(tmp_path, make, message):
    name = make(tmp_path)
    with pytest.raises(ConfigError, match=message):
        _qa(tmp_path, [{"image": name, "question": "q", "answer": "1"}, {"image": "ok.png", "question": "r",
                                                                           "answer": "2"}], max_pixels=10_000)


def test_too_many_images_and_a_missing_image_field(tmp_path):
    with pytest.raises(ConfigError, match=r"qa.jsonl:1: field 'images' holds 3 images, over the limit of 2"):
        _qa(tmp_path, [{"images": ["ok.png"] * 3, "question": "q", "answer": "1"}], max_images=2)
    with pytest.raises(ConfigError, match=r"qa.jsonl:1: field 'image' \(or 'images'\) missing"):
        _qa(tmp_path, [{"question": "q", "answer": "1"}])
