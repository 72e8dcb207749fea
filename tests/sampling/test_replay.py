"""Rollout replay: a share of each batch is drawn from recent groups, trained as a stale batch."""

from __future__ import annotations

import torch

from rlvr.builder.components import build_components
from rlvr.config import load_config
from rlvr.sampling.replay import ReplayBuffer
from rlvr.trainer.collect import produce
from rlvr.trainer.sync import rl_step

FAST = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=6", "task.heldout_size=4",
        "trainer.threads=1", "algo.dynamic_sampling=false"]


def test_buffer_slots_draws_and_state():
    b = ReplayBuffer(capacity=3, fraction=0.5, seed=0)
    assert b.slots(4) == 0  # empty: nothing to replay yet
    b.add(0, ["a", "b"])
    b.add(1, ["c", "d"])  # capacity 3: "a" falls out
    assert list(b.groups) == [(0, "b"), (1, "c"), (1, "d")] and b.slots(4) == 2 and b.slots(5) == 2
    twin = ReplayBuffer(capacity=3, fraction=0.5, seed=9)
    twin.load_state_dict(b.state_dict())
    assert b.draw(2) == twin.draw(2) and len(set(b.draw(3))) == 3


def test_replayed_groups_join_the_batch_as_stale_rows():
    c = build_components(load_config(None, [*FAST, "rollout.replay_fraction=0.5"]))
    first = produce(c.rollout, 1)
    assert first.staleness == 0 and "batch/replayed_groups" not in first.got.metrics
    rl_step(c, 1, first)
    second = produce(c.rollout, 2)
    got = second.got
    assert got.metrics["batch/replayed_groups"] == 2.0 and len(got.group) == 16
    assert second.staleness == 1 and got.oldest_version == 0
    # the last 8 rows are two of step 1's groups, completions and behaviour log-probs as sampled
    old = first.got.rollouts
    width = old.completion_ids.shape[1]
    replayed = got.rollouts.completion_ids[8:, :width]
    groups = [old.completion_ids[g:g + 4] for g in range(0, 16, 4)]
    assert all(any(torch.equal(replayed[i:i + 4], grp) for grp in groups) for i in (0, 4))
    assert got.metrics["batch/generated_tokens"] < first.got.metrics["batch/generated_tokens"]
    metrics, _ = rl_step(c, 2, second)  # the stale path: an old-policy pass and π_prox / π_behav weights
    assert "async/behaviour_kl_k3" in metrics
