"""TextArena single-player games through the gymnasium-style adapter: the shim's contract on a
stand-in with TextArena's API (always), and a real game when textarena is installed."""

import pytest

from rlvr.agents.env import GymAdapter, StepResult
from rlvr.agents.envs.arena import TextArenaGym, arena_env


class _Arena:
    """TextArena's API: reset(num_players, seed); get_observation drains messages (sender, text, type);
    step -> (done, info); close -> (rewards, game_info)."""

    def reset(self, num_players, seed=None):
        assert num_players == 1
        self.target, self.pending = seed % 10, [(-1, "guess 0-9", 1)]

    def get_observation(self):
        out, self.pending = self.pending, []
        return 0, out

    def step(self, action):
        guess = int(action.strip("[]"))
        self.pending += [(0, action, 2)]
        self.won = guess == self.target
        if not self.won:
            self.pending += [(-1, "higher" if guess < self.target else "lower", 3)]
        return self.won, {}

    def close(self):
        return {0: 1}, {0: {"reason": "won"}}


def test_shim_drops_the_action_echo_and_pays_at_the_end():
    env = GymAdapter(TextArenaGym(env=_Arena()))
    assert env.reset(7) == "guess 0-9"
    step = env.step("[3]")
    assert isinstance(step, StepResult) and step == ("higher", 0.0, False, {})
    obs, reward, done, info = env.step("[7]")
    assert (obs, reward, done) == ("", 1.0, True) and info["success"] and info["reason"] == "won"


def _bisect(env, low, high):
    env.reset(3)
    rewards = []
    for _ in range(10):
        guess = (low + high) // 2
        obs, reward, done, info = env.step(f"[{guess}]")
        rewards.append(reward)
        if done:
            return len(rewards), reward, info
        low, high = (guess + 1, high) if "higher" in obs else (low, guess - 1)
    return len(rewards), rewards[-1], {}


def test_textarena_guess_the_number_runs_offline():
    pytest.importorskip("textarena")
    env = arena_env("GuessTheNumber-v0-raw")
    first = env.reset(3)
    assert "between 1 and 20" in first and "[5]" in first
    guesses, reward, info = _bisect(env, 1, 20)
    assert reward == 1.0 and info["success"] and guesses <= 5
    assert _bisect(arena_env("GuessTheNumber-v0-raw"), 1, 20)[0] == guesses  # seeded
