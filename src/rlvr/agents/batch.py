"""Trajectories -> the trainer's tensors: `Rollouts` whose completion is everything after the
first observation (actions and observations), with `completion_mask` the loss mask (1 exactly on
sampled ids), plus the per-turn tensors the turn-level advantages read, and `agent/` metrics.

The causal policy attends to every completion position (its attention mask is 1 on the whole
completion; `rlvr.models.policy.sequence_inputs`), so observation tokens condition later actions
while their mask 0 keeps them out of the objective, the KL, the entropy and every aggregation
denominator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from rlvr.agents.env import FinishReason
from rlvr.agents.rollout import Trajectory
from rlvr.batch import Rollouts, left_pad


@dataclass
class TurnTensors:
    """Per-turn data, K = most turns in the batch. Padding turns have valid False."""

    turn_index: torch.Tensor   # (B, Tc) long: turn of each completion token, -1 on padding
    rewards: torch.Tensor      # (B, K) float: the environment's reward for each turn
    states: torch.Tensor       # (B, K) long: stable id of the state each action was taken in (-1 padding)
    valid: torch.Tensor        # (B, K) bool

    def select(self, rows: torch.Tensor) -> TurnTensors:
        return TurnTensors(self.turn_index[rows], self.rewards[rows], self.states[rows], self.valid[rows])

    @staticmethod
    def concat(parts: list[TurnTensors]) -> TurnTensors:
        """Stack batches of different widths (token width padded with -1, turns with invalid)."""
        width = max(p.turn_index.shape[1] for p in parts)
        k = max(p.rewards.shape[1] for p in parts)

        def pad(x, n, value):
            return torch.cat([x, torch.full((x.shape[0], n - x.shape[1]), value, dtype=x.dtype)], dim=1)

        return TurnTensors(torch.cat([pad(p.turn_index, width, -1) for p in parts]),
                           torch.cat([pad(p.rewards, k, 0.0) for p in parts]),
                           torch.cat([pad(p.states, k, -1) for p in parts]),
                           torch.cat([pad(p.valid, k, False) for p in parts]))


def to_rollouts(trajs: list[Trajectory], pad_id: int, *, train_drifted: bool = False) -> Rollouts:
    prompt_ids, prompt_mask = left_pad([t.ids[:t.prompt_len] for t in trajs], pad_id)
    width = max(1, max(len(t.ids) - t.prompt_len for t in trajs))

    def rows(get, value):
        return [get(t) + [value] * (width - (len(t.ids) - t.prompt_len)) for t in trajs]

    mask = torch.tensor(rows(lambda t: t.mask[t.prompt_len:], 0), dtype=torch.float32)
    if not train_drifted:
        mask = mask * torch.tensor([[0.0 if t.drifted else 1.0] for t in trajs])
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=torch.tensor(rows(lambda t: t.ids[t.prompt_len:], pad_id), dtype=torch.long),
        completion_mask=mask,
        logprobs=torch.tensor(rows(lambda t: t.logprobs[t.prompt_len:], 0.0), dtype=torch.float32),
        truncated=torch.tensor([t.finish not in (FinishReason.DONE, FinishReason.ENV_ERROR) for t in trajs]),
    )


def turn_tensors(trajs: list[Trajectory]) -> TurnTensors:
    width = max(1, max(len(t.ids) - t.prompt_len for t in trajs))
    k = max(1, max(len(t.turns) for t in trajs))
    index = torch.full((len(trajs), width), -1, dtype=torch.long)
    rewards = torch.zeros(len(trajs), k)
    states = torch.full((len(trajs), k), -1, dtype=torch.long)
    for b, t in enumerate(trajs):
        tail = t.turn_index[t.prompt_len:]
        index[b, :len(tail)] = torch.tensor(tail, dtype=torch.long)
        for j, turn in enumerate(t.turns):
            rewards[b, j] = turn.reward
            states[b, j] = state_id(turn.state_key)
    return TurnTensors(index, rewards, states, states >= 0)


def action_texts(t: Trajectory, tokenizer) -> list[str]:
    """The text of each action of `t`, one per turn (observations left out)."""
    return [tokenizer.decode(t.ids[turn.start:turn.end], skip_special_tokens=True) for turn in t.turns]


def add_turn_rewards(turns: TurnTensors, dense: list[list[float]], *, weight: float = 1.0) -> TurnTensors:
    """`turns` with weight · dense[b][k] added to the reward of row b's turn k (K_b values a row, its
    valid turns); the environment's rewards stay, the process rewards come on top."""
    extra = torch.zeros_like(turns.rewards)
    for b, row in enumerate(dense):
        if len(row) != int(turns.valid[b].sum()):
            raise ValueError(f"row {b}: {len(row)} process rewards for {int(turns.valid[b].sum())} turns")
        extra[b, :len(row)] = torch.tensor(row, dtype=extra.dtype)
    return TurnTensors(turns.turn_index, turns.rewards + weight * extra, turns.states, turns.valid)


def state_id(key) -> int:
    """A stable non-negative integer id of a state key (the same across batches and rounds)."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "big")


def agent_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    n = max(len(trajs), 1)
    counts: dict[str, int] = {}
    for t in trajs:
        for key, v in t.counts.items():
            counts[key] = counts.get(key, 0) + v
    out = {f"agent/{key}": counts.get(key, 0) / n
           for key in ("tool_calls", "tool_errors", "tool_timeouts", "malformed", "env_errors", "env_timeouts")}
    out["agent/drifted"] = sum(t.drifted for t in trajs) / n  # a share, as its neighbours are
    out["agent/turns_mean"] = sum(len(t.turns) for t in trajs) / n
    out["agent/success"] = sum(t.success for t in trajs) / n
    out["agent/action_tokens_mean"] = sum(sum(t.mask) for t in trajs) / n
    out["agent/obs_tokens_mean"] = sum(len(t.ids) - t.prompt_len - sum(t.mask) for t in trajs) / n
    for reason in FinishReason.ALL:
        out[f"agent/finish_{reason}"] = sum(t.finish == reason for t in trajs) / n
    return out


def transcript(t: Trajectory, tokenizer) -> str:
    """The completion as text, specials kept, for samples.jsonl."""
    return tokenizer.decode(t.ids[t.prompt_len:], skip_special_tokens=False)
