import random
import subprocess
import sys

from rlvr.tasks import make_task
from rlvr.tasks.sudoku import all_grids, count_solutions, is_heldout_grid


def test_grids_split_and_puzzles():
    grids = all_grids()
    assert len(grids) == 288 == len(set(grids))
    task = make_task("sudoku4", heldout_size=20)
    train = task.sample(50, random.Random(0))
    held = task.heldout()
    assert len(held) == 20 and all(is_heldout_grid(e.answer) for e in held)
    assert not any(is_heldout_grid(e.answer) for e in train)
    for e in train[:10]:
        puzzle = e.meta["puzzle"]
        assert count_solutions(puzzle) == 1 and 6 <= puzzle.count("0") <= 10
        assert task.reward(e.prompt, e.answer, **e.__dict__) == 1.0 and task.is_correct(e.answer, e)
        assert task.solution(e) == e.answer


def test_reward_is_the_fraction_of_blanks_right():
    task = make_task("sudoku4")
    e = task.sample(1, random.Random(1))[0]
    blanks = [i for i, c in enumerate(e.meta["puzzle"]) if c == "0"]
    wrong_one = list(e.answer)
    wrong_one[blanks[0]] = "1" if e.answer[blanks[0]] != "1" else "2"
    assert abs(task.reward(e.prompt, "".join(wrong_one), **e.__dict__) - (len(blanks) - 1) / len(blanks)) < 1e-9
    assert task.reward(e.prompt, "", **e.__dict__) == 0.0
    assert task.reward(e.prompt, e.answer) == 1.0  # from the prompt alone


def test_tasks_do_not_import_torch():
    code = "import sys, rlvr.tasks.sudoku; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
