"""Rollout engines (and a verifier) across data-parallel learner ranks.

`RankEngine`: each rank samples its share of every batch's rows over a plain copy of the weights
(the rows' seeds are the ones a single process gives them, so the union of the ranks' samples is
the single process's batch) and gathers the others'. An engine with weights of its own (vLLM) is
rank 0's alone (`LeadEngine`): it samples each batch whole and broadcasts it, and takes the
gathered weights; so are Ray rollout workers (`trainer.rollout_workers` under
`trainer.ray_learners`), and Ray reward workers score each batch whole on rank 0 (`LeadReward`),
as the one Ray process does.
"""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts, concat_rollouts
from rlvr.models.lora import merged_weights
from rlvr.runtime.distributed import Shard
from rlvr.runtime.fsdp import load_trained


class RankEngine:
    """A rollout engine over a plain copy of the weights (`model`), which samples this rank's
    share of every batch's rows and gathers the others': each rank returns the whole batch.

    `push_weights(named, version)` loads the learner's (sharded) weights into the copy."""

    def __init__(self, engine, model: torch.nn.Module, shard: Shard, pad_id: int):
        self.engine, self.model, self.shard, self.pad_id = engine, model, shard, pad_id
        self.version = 0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature, **kwargs) -> Rollouts:
        rows = self.shard.rows(len(seeds))
        mine = None
        if rows.stop > rows.start:
            t = temperature[rows] if isinstance(temperature, torch.Tensor) else temperature
            mine = self.engine(prompt_ids[rows], prompt_mask[rows], seeds[rows], temperature=t, **kwargs)
        parts = [p for p in self.shard.gather(mine) if p is not None]
        return concat_rollouts(parts, self.pad_id)

    def push_weights(self, named, version: int) -> None:
        """The trained weights of `named` (the learner's own parameters, sharded) into the copy:
        under LoRA only the adapters."""
        load_trained(self.model, named)
        self.version = version


class LeadEngine:
    """A rollout engine that holds its own weights (vLLM), on rank 0 only: it samples every
    batch whole, with the seeds a single process gives its rows, and broadcasts the rollouts, so
    every rank holds the single process's batch. `push_weights` gathers the trained weights into
    every rank's plain copy `model` (what checkpoints save) and rank 0 pushes them on to its
    engine, merged under LoRA, as a single process does. `engine` is None on the other ranks."""

    def __init__(self, engine, model: torch.nn.Module, shard: Shard):
        self.engine, self.model, self.shard = engine, model, shard
        self.version = 0

    def __call__(self, prompt_ids, prompt_mask, seeds, *, temperature, **kwargs) -> Rollouts:
        rollouts = None
        if self.engine is not None:
            rollouts = self.engine(prompt_ids, prompt_mask, seeds, temperature=temperature, **kwargs)
        return self.shard.broadcast(rollouts)

    def push_weights(self, named, version: int) -> None:
        load_trained(self.model, named)
        if self.engine is not None:
            self.engine.push_weights(merged_weights(self.model), version)
        self.version = version

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class LeadReward:
    """A verifier on rank 0 only (Ray reward workers, `trainer.reward_workers` under
    `trainer.ray_learners`): it scores every batch whole and broadcasts the scores, so every rank
    holds the single process's. `reward` is None on the other ranks."""

    def __init__(self, reward, shard: Shard):
        self.reward, self.shard = reward, shard

    def __call__(self, prompts, texts, examples):
        return self.shard.broadcast(self.reward(prompts, texts, examples) if self.reward is not None else None)

    def on_step_begin(self, step: int, steps: int) -> None:
        if self.reward is not None:
            self.reward.on_step_begin(step, steps)

    def judged(self, task, group, texts, examples):
        """Rewards and correctness from rank 0, under its verifier's per-sample deadlines."""
        return self.shard.broadcast(self.reward.judged(task, group, texts, examples) if self.reward is not None
                                    else None)

    def correct(self, task, group, texts):
        return self.shard.broadcast(self.reward.correct(task, group, texts) if self.reward is not None else None)
