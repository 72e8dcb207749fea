"""A procedural task whose knobs leave nothing to train on is one line, never an endless draw:
a Countdown bucket whose target range no problem reaches, or a space whose every problem is held
out. Each call is bounded by the test (a thread joined with a timeout)."""

from __future__ import annotations

import random
import threading

import pytest

import rlvr.tasks.countdown as countdown
from rlvr.errors import ConfigError
from rlvr.tasks.countdown import Countdown


def _bounded(fn, seconds: float = 60.0):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except ConfigError as err:
            out["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still drawing after {seconds} s"
    return out


def test_a_bucket_no_problem_reaches_is_refused_when_built():
    # with division no bound on the values is known up front (without it the bucket is refused at once)
    got = _bounded(lambda: Countdown(buckets="2:5000-6000", heldout_size=2, allow_division=True))
    assert "no problem of 2 numbers up to 9 reached a target in 5000-6000" in str(got["error"])
    assert "task.countdown.buckets" in str(got["error"])


def test_a_space_whose_every_problem_is_held_out_is_refused(monkeypatch):
    task = Countdown(heldout_size=2)
    monkeypatch.setattr(countdown, "MAX_DRAWS", 2_000)  # the bound, made small: the loop is what is tested
    monkeypatch.setattr(countdown, "is_heldout_key", lambda *key: True)
    got = _bounded(lambda: task.sample(3, random.Random(0)))
    assert "every problem drawn (2000) is in the held-out bucket" in str(got["error"])


@pytest.mark.parametrize("buckets", ["3:1-20,4:21-99", "2:1-9"])
def test_reachable_buckets_still_sample(buckets):
    task = Countdown(buckets=buckets, heldout_size=4)
    assert len(task.sample(5, random.Random(1))) == 5
