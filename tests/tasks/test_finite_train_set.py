"""`task.train_size`: a fixed set of training prompts drawn once, then drawn from, so prompts recur."""

import copy
import pickle
import random

from rlvr.builder.build import build_task
from rlvr.config import load_config
from rlvr.tasks.finite import FiniteTrainSet


def test_train_size_draws_every_step_from_one_fixed_set():
    task = build_task(load_config(None, ["task.train_size=5", "task.heldout_size=4"]))
    assert isinstance(task, FiniteTrainSet) and len(task.examples) == 5
    rng = random.Random(0)
    drawn = {ex.prompt for _ in range(20) for ex in task.sample(8, rng)}
    assert drawn == {ex.prompt for ex in task.examples}  # 160 draws from 5: every one, nothing else
    assert {ex.prompt for ex in task.heldout()} == {ex.prompt for ex in task.task.heldout()}  # the task's own
    again = build_task(load_config(None, ["task.train_size=5", "task.heldout_size=4"]))
    assert [ex.prompt for ex in again.examples] == [ex.prompt for ex in task.examples]  # seeded


def test_a_finite_train_set_copies_and_pickles():
    task = build_task(load_config(None, ["task.train_size=3", "task.heldout_size=4"]))
    for twin in (copy.deepcopy(task), pickle.loads(pickle.dumps(task))):
        assert [ex.prompt for ex in twin.examples] == [ex.prompt for ex in task.examples]


def test_train_size_zero_is_the_task_itself():
    assert not isinstance(build_task(load_config(None, ["task.heldout_size=4"])), FiniteTrainSet)
