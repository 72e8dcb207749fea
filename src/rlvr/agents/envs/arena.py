"""TextArena single-player games as rlvr environments, through the gymnasium-style adapter.

TextArena (an optional package, imported only here) has its own API: `reset(num_players, seed)`,
`get_observation() -> (player_id, observation)`, `step(action) -> (done, info)` and, at the end,
`close() -> (rewards, game_info)`. `TextArenaGym` puts that in the gymnasium>=0.26 form
(`reset(seed=) -> (obs, info)`, `step(action) -> (obs, reward, terminated, truncated, info)`) so
`GymAdapter` makes it an `Environment`:

    env = arena_env("GuessTheNumber-v0-raw")   # a `-raw` id: the messages, not a re-rendered history
    first = env.reset(3)
    obs, reward, done, info = env.step("[10]")

The observation of a step is the game's messages since the last action, less the echo of the
action itself (the rollout keeps the action's own tokens). The reward is TextArena's for the
player at the end (1 for a win; its partial credit for a loss), 0 before.
"""

from __future__ import annotations

from rlvr.agents.env import GymAdapter


class TextArenaGym:
    """One single-player TextArena game in gymnasium>=0.26 form (`env`: an already made one)."""

    def __init__(self, name: str = "GuessTheNumber-v0-raw", *, env=None):
        if env is None:
            try:
                import textarena
            except ImportError:
                raise ImportError("TextArena environments need the textarena package: pip install textarena") from None
            env = textarena.make(name)
        self.env, self.name = env, name

    def _text(self, player: int, observation) -> str:
        if isinstance(observation, str):  # a wrapped (non-raw) game renders its own text
            return observation
        return "\n".join(str(message) for sender, message, *_ in observation if sender != player)

    def reset(self, seed=None):
        self.env.reset(num_players=1, seed=seed)
        player, observation = self.env.get_observation()
        return self._text(player, observation), {}

    def step(self, action: str):
        player = 0
        done, info = self.env.step(action)
        _, observation = self.env.get_observation()
        reward, info = 0.0, dict(info or {})
        if done:
            rewards, game_info = self.env.close()
            reward = float(rewards.get(player, 0.0)) if rewards else 0.0
            info.update(game_info.get(player, {}) if game_info else {})
            info["success"] = reward >= 1.0
        return self._text(player, observation), reward, bool(done), False, info


def arena_env(name: str = "GuessTheNumber-v0-raw") -> GymAdapter:
    """A TextArena single-player game as an rlvr `Environment`."""
    return GymAdapter(TextArenaGym(name))
