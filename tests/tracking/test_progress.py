"""The progress display: the bar shows each step's own reward; a plain line the mean since the last
line, saying over which steps."""

from __future__ import annotations

from rlvr.tracking import progress


def _steps(shown, n=4):
    for step in range(1, n + 1):
        shown.update(step, {"reward/mean": float(step % 2), "reward/accuracy": 0.0, "perf/rollout_tokens_per_s": 10.0})


def test_plain_lines_say_they_are_means_and_over_which_steps():
    lines = []
    shown = progress.Progress(total=4, echo=lines.append, every=2)
    _steps(shown)
    assert lines == ["step 2/4 reward=0.500 acc=0.000 tok/s=10 (reward, acc, tok/s: mean of steps 1-2)",
                     "step 4/4 reward=0.500 acc=0.000 tok/s=10 (reward, acc, tok/s: mean of steps 3-4)"]


def test_the_bar_shows_the_steps_own_reward(monkeypatch):
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    shown = progress.Progress(total=4, echo=lambda line: None, every=25)
    seen = []
    monkeypatch.setattr(shown.bar, "set_postfix", lambda values, refresh: seen.append(values["reward"]))
    _steps(shown)
    shown.close()
    assert seen == ["1.000", "0.000", "1.000", "0.000"]  # a running mean would read 1.000, 0.500, 0.667, 0.500
