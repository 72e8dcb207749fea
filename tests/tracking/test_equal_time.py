"""bench/_sweep.py's equal-training-time table on hand-made runs: the budget is the fastest recipe's
mean training seconds, and a slower recipe is read at the last evaluation it reached within it."""

import importlib.util
from pathlib import Path

from rlvr.tracking.runs import Group, Run


def _sweep():
    spec = importlib.util.spec_from_file_location("sweep", Path(__file__).resolve().parents[2] / "bench/_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(step_s: float, accuracies: dict[int, float]) -> Run:
    """Four steps of `step_s` seconds each, evaluations at the given steps."""
    lines = [{"step": s, "time/step_s": step_s} for s in range(1, 5)]
    lines += [{"step": s, "eval/heldout_accuracy": a} for s, a in accuracies.items()]
    return Run(path=Path("r"), config={}, manifest={}, metrics=sorted(lines, key=lambda m: m["step"]))


def test_slow_recipe_is_read_where_the_fast_one_ends():
    sweep = _sweep()
    fast = [_run(1.0, {0: 0.2, 2: 0.3, 4: 0.4}), _run(1.0, {0: 0.2, 2: 0.3, 4: 0.6})]
    slow = [_run(2.0, {0: 0.2, 2: 0.5, 4: 0.6}), _run(2.0, {0: 0.2, 2: 0.5, 4: 0.8})]
    assert sweep.train_seconds(slow[0]) == [(1, 2.0), (2, 4.0), (3, 6.0), (4, 8.0)]
    assert sweep.accuracy_within(slow[0], 4.0) == (2, 0.5)  # step 4 came at 8 s, past the budget
    assert sweep.accuracy_within(slow[0], 1.0) == (0, 0.2)  # not even step 2: the start
    assert sweep.accuracy_within(fast[1], 4.0) == (4, 0.6)
    lines = sweep.equal_time_table([Group("fast", fast), Group("slow", slow)]).splitlines()
    assert "steps reached in 4 s" in lines[0]
    # gains 0.2 / 0.4 in 4 s: 3 and 6 per minute, mean 4.5, half-width t(0.975, 1) · sd / √2 = 12.706 · 1.5
    assert lines[2] == "| fast | 4 ± 0 | 0.300 ± 1.271 | 4.500 ± 19.059 | 4/4 | 0.500 ± 1.271 |"
    # gains 0.4 / 0.6 in 8 s: 3 and 4.5 per minute; at 4 s both seeds are at their step-2 evaluation
    assert lines[3] == "| slow | 8 ± 0 | 0.500 ± 1.271 | 3.750 ± 9.530 | 2/2 | 0.500 ± 0.000 |"
