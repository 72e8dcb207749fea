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


def test_reward_and_accuracy_cover_every_generated_completion_and_the_kept_groups_reward_is_beside(monkeypatch):
    """Dynamic sampling trains on the groups whose rewards vary: the bar's reward is over all the
    completions generated (as TRL's), the kept groups' reward beside it."""
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    shown = progress.Progress(total=2, echo=lambda line: None)
    seen = []
    monkeypatch.setattr(shown.bar, "set_postfix", lambda values, refresh: seen.append(values))
    for step in (1, 2):
        shown.update(step, {"reward/mean": 0.5, "reward/accuracy": 0.5, "reward/generated_mean": 0.25 * step,
                            "reward/generated_accuracy": 0.125, "batch/kept_group_rate": 0.5})
    shown.close()
    assert seen == [{"reward": "0.250", "kept": "0.500", "acc": "0.125"},
                    {"reward": "0.500", "kept": "0.500", "acc": "0.125"}]
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    lines = []
    plain = progress.Progress(total=2, echo=lines.append, every=2)
    for step in (1, 2):
        plain.update(step, {"reward/mean": 0.5, "reward/accuracy": 0.5, "reward/generated_mean": 0.25 * step,
                            "reward/generated_accuracy": 0.125, "batch/kept_group_rate": 0.5})
    assert lines == ["step 2/2 reward=0.375 kept=0.500 acc=0.125 (reward, kept, acc: mean of steps 1-2)"]
