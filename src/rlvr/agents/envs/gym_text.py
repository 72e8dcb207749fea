"""Gymnasium text environments as an agent task: `GymTextTask("MyGame-v0", max_turns=4)`.

Any environment registered with gymnasium (the optional `envs` extra, imported here only) whose
observations and actions are text trains through `gymnasium.make(env_id, **make_kwargs)`, wrapped
by `GymAdapter`: `reset(seed=)` gives the first observation, `step(text)` the gymnasium>=0.26
5-tuple, `terminated or truncated` ends the episode (a `TimeLimit`'s `max_episode_steps` included),
the summed rewards are the episode's return, `info["success"]` its success when the environment
sets it (else return > 0). The problem key (for the held-out split) is the first observation. Its
steps run one environment at a time, as `GymAdapter` does for third-party code.
"""

from __future__ import annotations

from rlvr.agents.env import GymAdapter
from rlvr.agents.task import AgentTask
from rlvr.agents.tools import ToolRegistry


class GymTextEnv(GymAdapter):
    """A gymnasium environment with what `AgentTask` reads: `key`, `answer`, an (empty) tool registry."""

    def __init__(self, env):
        super().__init__(env)
        self.registry, self.answer, self.key = ToolRegistry.of(), "", ""

    def reset(self, seed: int) -> str:
        first = super().reset(seed)
        self.key = first
        return first


class GymTextTask(AgentTask):
    """Episodes of the gymnasium environment `env_id` (see the module docstring)."""

    def __init__(self, env_id: str, *, make_kwargs: dict | None = None, **settings):
        super().__init__(**settings)
        try:
            import gymnasium
        except ImportError:
            raise ImportError("Gymnasium environments need the envs extra: pip install -e '.[envs]'") from None
        self.env_id, self.make_kwargs, self._gym = env_id, dict(make_kwargs or {}), gymnasium
        self.make_env().env.close()  # an unknown id is refused now, in gymnasium's words

    def make_env(self) -> GymTextEnv:
        return GymTextEnv(self._gym.make(self.env_id, **self.make_kwargs))
