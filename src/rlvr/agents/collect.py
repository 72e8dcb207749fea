"""What the trainer calls for agent tasks: roll out a batch of episodes, score it, evaluate."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from rlvr.agents.batch import (
    TurnTensors,
    action_texts,
    add_turn_rewards,
    agent_metrics,
    to_rollouts,
    transcript,
    turn_tensors,
)
from rlvr.agents.env import FinishReason
from rlvr.agents.render import make_renderer
from rlvr.agents.rollout import Limits, Trajectory, run_episodes, scripted_episode
from rlvr.batch import Rollouts
from rlvr.errors import ConfigError
from rlvr.rewards.process import step_rewards
from rlvr.types import Example


@dataclass
class AgentBatch:
    trajectories: list[Trajectory]
    rollouts: Rollouts
    texts: list[str]
    rewards: torch.Tensor  # (B,)
    correct: torch.Tensor  # (B,)
    turns: TurnTensors
    metrics: dict[str, float]


def _limits(task) -> Limits:
    return Limits(task.settings.max_turns, task.settings.max_total_tokens, task.settings.env_timeout_s)


def renderer_for(task, tokenizer):
    return make_renderer(tokenizer, task.make_env().registry.schemas() if task.settings.tools else None)


def rollout_batch(engine, tokenizer, task, examples: list[Example], seeds: torch.Tensor, *,
                  temperature: float | torch.Tensor) -> AgentBatch:
    """One episode per example through `engine` (any RolloutEngine)."""
    trajs = task.rollout_episodes(engine, tokenizer, examples, seeds, temperature=temperature)
    check_some_ran(trajs)
    return AgentBatch(trajs, to_rollouts(trajs, tokenizer.pad_token_id, train_drifted=task.settings.train_drifted),
                      [transcript(t, tokenizer) for t in trajs], torch.tensor([t.reward for t in trajs]),
                      torch.tensor([float(t.success) for t in trajs]), turn_tensors(trajs), agent_metrics(trajs))


def stepped_episodes(task, engine, tokenizer, examples: list[Example], seeds: torch.Tensor, temperature):
    """The episodes of `examples`, the task's environments stepped by `run_episodes` (`AgentTask`'s own
    rollout; a task that runs its own episodes overrides `rollout_episodes`)."""
    envs = [task.make_env() for _ in examples]
    return run_episodes(engine, renderer_for(task, tokenizer), envs, [ex.meta["episode"] for ex in examples],
                        seeds, temperature=temperature, limits=_limits(task), pad_id=tokenizer.pad_token_id,
                        eos_id=tokenizer.eos_token_id, prompts=[ex.prompt for ex in examples])


def check_some_ran(trajs: list[Trajectory]) -> None:
    """Every episode of a batch ending in `env_error` is a broken environment, not a hard task:
    training on it would log zeros and exit 0. One line with the first error instead."""
    if trajs and all(t.finish == FinishReason.ENV_ERROR for t in trajs):
        raise ConfigError(f"environment: failed on all {len(trajs)} episodes of this step; first error: "
                          f"{trajs[0].error or 'unknown'}; fix its reset/step (or raise task.<name>.env_timeout_s "
                          f"if it is only slow)")


@dataclass(frozen=True)
class TurnProcessReward:
    """Dense per-turn rewards from a process reward model (each action a step): turn k of an episode gets
    weight · step_rewards(s)_k, s_k the model's score of the prompt and the episode's first k actions, and
    `how` = ``raw`` | ``clipped`` | ``delta`` (`rlvr.rewards.process.step_rewards`), on top of the
    environment's turn rewards that the turn-level advantages (`gigpo`, `turn_return`) read."""

    model: object  # a `ProcessRewardModel`: prefix_scores(prompts, steps) -> per-row step scores
    how: str = "raw"
    threshold: float = 0.0
    weight: float = 1.0

    def __call__(self, got: AgentBatch, tokenizer, prompts: list[str]) -> AgentBatch:
        steps = [action_texts(t, tokenizer) for t in got.trajectories]
        scores = self.model.prefix_scores(prompts, steps)
        dense = [step_rewards(s, self.how, threshold=self.threshold) for s in scores]
        flat = [v for row in dense for v in row]
        metrics = {**got.metrics, "agent/process_reward_mean": sum(flat) / len(flat) if flat else 0.0}
        return dataclasses.replace(got, turns=add_turn_rewards(got.turns, dense, weight=self.weight), metrics=metrics)


def correctness(engine, tokenizer, task, rows: list[Example], *, temperature: float, first_seed: int | None,
                batch_size: int = 256) -> list[bool]:
    """Whether each row's episode succeeds (the evaluation counterpart of `rollout_batch`)."""
    return [t.success for t in episodes(engine, tokenizer, task, rows, temperature=temperature,
                                        first_seed=first_seed, batch_size=batch_size)]


def episodes(engine, tokenizer, task, rows: list[Example], *, temperature: float, first_seed: int | None,
             batch_size: int = 256) -> list[Trajectory]:
    """One episode per row, seeds first_seed + index (0 if None), in chunks of `batch_size`."""
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        seeds = torch.zeros(len(chunk), dtype=torch.long)
        if first_seed is not None:
            seeds += torch.arange(start, start + len(chunk)) + first_seed
        out.extend(rollout_batch(engine, tokenizer, task, chunk, seeds, temperature=temperature).trajectories)
    return out


def success_and_turns(trajs: list[Trajectory]) -> tuple[float, float]:
    """(share of episodes that succeed, mean actions taken by the successful ones; nan if none)."""
    wins = [len(t.turns) for t in trajs if t.success]
    return len(wins) / max(len(trajs), 1), sum(wins) / len(wins) if wins else float("nan")


def demonstrations(task, tokenizer, examples: list[Example], rng: random.Random) -> list[Trajectory]:
    """Scripted episodes of `examples` (the task's demonstrator), token-exact like sampled ones."""
    renderer = renderer_for(task, tokenizer)
    trajs = []
    for ex in examples:
        env = task.make_env()
        env.reset(ex.meta["episode"])
        policy = task.demo_policy(env, rng)
        trajs.append(scripted_episode(env, renderer, ex.meta["episode"], policy, limits=_limits(task)))
    return trajs
