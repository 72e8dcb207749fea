"""Countdown knobs: show_work (step lists) and ordered (prompt order = solution order)."""

import random

from rlvr.tasks.countdown import Countdown, leaves, parse
from rlvr.tasks.countdown_steps import score_steps, steps_from_expr


def test_step_list_vectors():
    # 3 5 2 -> 13: 5*2 = 10, 10+3 = 13.
    cases = {"5*2=10,10+3=13": 1.0, " 5*2=10,10+3=13 ": 1.0, "5*2=10,3+10=13": 1.0,
             "5*2=10,10+3=14": 0.1,  # false arithmetic
             "5*2=10,10+2=12": 0.1,  # 2 used twice
             "5*2=10": 0.1,  # too few steps
             "3+5=8,8*2=16": 0.1,  # true steps, wrong target
             "5x2=10": 0.0, "": 0.0, "5*2=10,,": 0.0, "5/1=5,5+8=13": 0.0}
    for text, want in cases.items():
        assert score_steps(text, [3, 5, 2], 13, allow_division=False) == want, text
    assert score_steps("6/2=3,3+5=8", [6, 2, 5], 8, allow_division=True) == 1.0


def test_negative_intermediates_are_written_and_checked():
    expr = ("*", ("-", 2, 5), 3)  # (2-5)*3 = -9 -> not a valid positive target, but the steps verify
    assert steps_from_expr(expr) == "2-5=-3,-3*3=-9"
    assert score_steps("2-5=-3,-3*3=-9", [2, 5, 3], -9, allow_division=False) == 1.0


def test_show_work_solutions_verify_and_match_the_expression():
    task = Countdown(show_work=True)
    for ex in task.sample(500, random.Random(1)):
        sol = task.solution(ex)
        assert task.reward(ex.prompt, sol, answer=ex.answer, meta=ex.meta) == 1.0
        assert sol.count(",") == 1  # two steps for three numbers


def test_ordered_prompts_list_numbers_in_solution_order():
    task = Countdown(ordered=True)
    for ex in task.sample(500, random.Random(2)):
        assert leaves(parse(ex.answer)) == ex.meta["numbers"]
    held = Countdown(ordered=True).heldout()
    assert len(held) == 200 and all(leaves(parse(e.answer)) == e.meta["numbers"] for e in held)
