"""Procedural tasks, picked by name: ``make_task("countdown", num_count=4)``.

A task yields ``Example``s (``sample(n, rng)`` for training, ``heldout()`` for evaluation) and
scores completions with ``reward(prompt, completion, **example)``. No torch here.
"""

from __future__ import annotations

from rlvr.agents.envs.calculator import Calculator
from rlvr.agents.envs.guess import GuessNumber
from rlvr.agents.envs.lookup import Lookup
from rlvr.tasks.arithmetic import Arithmetic
from rlvr.tasks.countdown import Countdown
from rlvr.tasks.countdown_python import CountdownPython
from rlvr.tasks.files import CodeFileTask, MathFileTask
from rlvr.tasks.sudoku import Sudoku4
from rlvr.tasks.visual.image_qa import ImageQATask
from rlvr.tasks.visual.shapes import CountShapes

TASKS = {"countdown": Countdown, "math_file": MathFileTask, "code_file": CodeFileTask, "sudoku4": Sudoku4,
         "agent_calculator": Calculator, "agent_guess": GuessNumber,
         "agent_lookup": Lookup, "agent_countdown_python": CountdownPython, "arithmetic": Arithmetic,
         "count_shapes": CountShapes, "image_qa": ImageQATask}


def make_task(name: str, **kwargs):
    """Build the task registered as ``name`` with its keyword knobs."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)


__all__ = ["TASKS", "CodeFileTask", "Countdown", "MathFileTask", "Sudoku4", "make_task"]
