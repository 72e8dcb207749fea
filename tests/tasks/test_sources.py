"""Tasks with sources: Countdown difficulty buckets and arithmetic by digit count."""

from __future__ import annotations

import random

import pytest

from rlvr.cli import main
from rlvr.tasks import make_task
from rlvr.tasks.countdown import is_heldout_key, parse_buckets
from rlvr.tasks.sources import heldout_shares


def test_bucket_specs_and_heldout_shares():
    assert parse_buckets("3:20, 4:21-99") == [(3, 1, 20), (4, 21, 99)]
    for bad in ("3", "1:1-9", "3:9-1", "3:x", "3:1-9,3:1-9"):
        with pytest.raises(ValueError, match=r"^countdown: buckets must be"):
            parse_buckets(bad)
    assert heldout_shares(10, 3) == [4, 3, 3]


def test_countdown_buckets_draw_their_own_operand_counts_and_targets():
    task = make_task("countdown", buckets="3:1-20,4:21-99", heldout_size=30)
    assert task.sources == ("n3_t1-20", "n4_t21-99")
    rng = random.Random(0)
    mixed = task.sample(200, rng)
    assert {ex.meta["source"] for ex in mixed} == set(task.sources)
    for ex in mixed + task.heldout():
        low, high = (1, 20) if ex.meta["source"] == "n3_t1-20" else (21, 99)
        assert len(ex.meta["numbers"]) == (3 if low == 1 else 4) and low <= ex.meta["target"] <= high
    assert not any(is_heldout_key(ex.meta["numbers"], ex.meta["target"]) for ex in mixed)
    hard = task.sample_source("n4_t21-99", 20, rng)
    assert {ex.meta["source"] for ex in hard} == {"n4_t21-99"}
    assert [ex.meta["source"] for ex in task.heldout()] == ["n3_t1-20"] * 15 + ["n4_t21-99"] * 15
    ex = hard[0]
    assert task.is_correct(ex.answer, ex) and not task.is_correct("1+1", ex)


def test_arithmetic_sources_by_digit_count():
    task = make_task("arithmetic", digits="2,3", heldout_size=20)
    assert task.sources == ("d2", "d3")
    rng = random.Random(1)
    for ex in task.sample_source("d3", 50, rng):
        a, b = ex.meta["operands"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and ex.prompt == f"{a}+{b}=" and ex.answer == str(a + b)
    train = {ex.prompt for ex in task.sample(500, rng)}
    held = {ex.prompt for ex in task.heldout()}
    assert len(held) == 20 and not train & held
    assert [task.reward("47+38=", c, answer="85") for c in ("85", " 85\n", "86", "")] == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("override, message", [
    ("task.countdown.buckets=3:9-1", "task: countdown: buckets must be"),
    ("task.arithmetic.digits=2,0", "task: arithmetic: digits must be"),
])
def test_bad_buckets_are_one_line_errors(capsys, override, message):
    args = ["train", "trainer.steps=1", override] + (["task.name=arithmetic"] if "arithmetic" in override else [])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_dump_without_sources_is_a_one_line_error(capsys):
    assert main(["train", "trainer.steps=1", "sampler.name=dump"]) == 2
    err = capsys.readouterr().err.strip()
    assert "sampler.name: dump chooses between a task's sources" in err and len(err.splitlines()) == 1, err
