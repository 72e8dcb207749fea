"""Ecosystem environments offline: a reasoning-gym dataset by name and a Gymnasium text environment
train for steps on a tiny model; their scorers and limits are the packages' own."""

import random

import pytest

from rlvr import Trainer

TINY = {"trainer.steps": 2, "rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 6,
        "model.max_seq_len": 160, "trainer.eval_every": 0}


def test_reasoning_gym_task_scores_with_its_own_scorer_and_trains(tmp_path):
    pytest.importorskip("reasoning_gym")
    from rlvr.tasks.reasoning_gym import ReasoningGymTask

    task = ReasoningGymTask("chain_sum", heldout_size=8, level=0)
    assert task.config["min_terms"] == task.config["max_terms"] == 2  # level 0: two terms
    held = {ex.prompt for ex in task.heldout()}
    train = task.sample(16, random.Random(0))
    assert len(held) == 8 and not held & {ex.prompt for ex in train}
    ex = train[0]
    assert task.reward(ex.prompt, f"so <answer>{ex.answer}</answer>", **ex.meta) == 1.0
    assert task.reward(ex.prompt, "<answer>nope</answer>", meta=ex.meta) == 0.0
    assert task.sample(3, random.Random(5))[0].prompt == task.sample(3, random.Random(5))[0].prompt  # seeded
    assert ReasoningGymTask("chain_sum", level=3).config["max_terms"] > 2
    final = Trainer("", train_dataset=task, overrides={**TINY, "trainer.out_dir": str(tmp_path)}).train()
    assert final["reward/scorable_frac"] == 1.0 and 0.0 <= final["reward/mean"] <= 1.0


def test_reasoning_gym_bad_knob_is_one_line():
    pytest.importorskip("reasoning_gym")
    from rlvr.errors import ConfigError
    from rlvr.tasks.reasoning_gym import ReasoningGymTask

    with pytest.raises(ConfigError, match="chain_sum"):
        ReasoningGymTask("chain_sum", min_terms=5, max_terms=2)


class _Letter:
    """A gymnasium text game: name the hidden letter; 'higher'/'lower' hints."""

    def __init__(self):
        import gymnasium
        self.observation_space = gymnasium.spaces.Text(64, charset="abcdefghijklmnopqrstuvwxyz ")
        self.action_space = gymnasium.spaces.Text(64)
        self.letter = "a"

    def reset(self, *, seed=None, options=None):
        self.letter = random.Random(seed).choice("abcdefgh")
        return "guess a letter a to h", {}

    def step(self, action):
        guess = str(action).strip()[:1]
        if guess == self.letter:
            return "yes", 1.0, True, False, {"success": True}
        return ("higher" if guess < self.letter else "lower"), 0.0, False, False, {}


def test_gymnasium_text_env_trains_and_its_time_limit_ends_episodes(tmp_path):
    gymnasium = pytest.importorskip("gymnasium")
    from rlvr.agents.envs.gym_text import GymTextTask

    class Letter(_Letter, gymnasium.Env):
        pass

    gymnasium.register(id="rlvr-test/Letter-v0", entry_point=Letter, max_episode_steps=2, disable_env_checker=True)
    task = GymTextTask("rlvr-test/Letter-v0", max_turns=4, max_total_tokens=120, heldout_size=0)
    env = task.make_env()
    env.reset(3)
    first, second = env.step("z"), env.step("z")
    assert not first.done and second.done  # TimeLimit: truncated at step 2 ends the episode
    final = Trainer("", train_dataset=task, overrides={**TINY, "trainer.out_dir": str(tmp_path)}).train()
    assert final["agent/turns_mean"] <= 2.0 and final["agent/finish_env_error"] == 0.0
    with pytest.raises(Exception, match="NoSuch"):
        GymTextTask("rlvr-test/NoSuch-v0")
