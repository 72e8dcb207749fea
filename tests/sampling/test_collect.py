"""The rollout phase through the sampler seams: micro-groups give the completions of one pass,
every generated group reaches the sampler (dropped ones too), and budgets of several groups per
prompt come back as whole groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr.builder.components import build_components
from rlvr.config import load_config
from rlvr.sampling.base import Request
from rlvr.trainer.collect import collect

FAST = ["rollout.prompts_per_step=2", "rollout.max_new_tokens=6", "trainer.steps=1", "task.heldout_size=4",
        "trainer.threads=1", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "model.path="]


class Recording:
    """Wraps a sampler and keeps every feedback record it is given."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def propose(self, step, n_prompts, budget):
        return self.inner.propose(step, n_prompts, budget)

    def observe(self, step, feedback):
        self.seen += feedback
        self.inner.observe(step, feedback)

    def metrics(self):
        return {}

    def state_dict(self):
        return {}


def _collected(*overrides):
    c = build_components(load_config(None, [*FAST, *overrides]))
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, sampler=Recording(c.rollout.sampler)))
    return c, collect(c.rollout, 1)


def test_micro_groups_give_the_completions_of_one_pass():
    # G = 8 as 4 passes of 2 completions per prompt: per-row seeds make every completion the same
    one, whole = _collected("rollout.group_size=8", "algo.dynamic_sampling=false")
    four, parts = _collected("rollout.group_size=8", "rollout.micro_group_size=2", "algo.dynamic_sampling=false")
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs", "truncated"):
        assert torch.equal(getattr(whole.rollouts, name), getattr(parts.rollouts, name)), name
    assert torch.equal(whole.rewards, parts.rewards) and whole.texts == parts.texts
    assert one.rollout.sampler.seen == four.rollout.sampler.seen  # whole groups only reach the sampler
    assert [f.n_rollouts for f in four.rollout.sampler.seen] == [8, 8]


def test_micro_group_size_must_divide_the_group():
    from rlvr.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^rollout\.micro_group_size: must be 0 \(one pass\) or divide"):
        load_config(None, ["rollout.group_size=8", "rollout.micro_group_size=3"])


def test_every_generated_group_reaches_the_sampler_with_its_kept_flag():
    # a fresh model scores 0 almost everywhere: under the DAPO filter most groups are dropped,
    # and each of the 3 rounds' 2 groups is still reported, with its rewards and tokens
    c, got = _collected("rollout.group_size=4", "algo.max_sampling_rounds=3")
    seen = c.rollout.sampler.seen
    rounds = int(got.metrics["batch/sampling_rounds"])
    assert len(seen) == 2 * rounds
    kept = sum(f.kept for f in seen)
    assert got.metrics["batch/kept_group_rate"] == pytest.approx(kept / len(seen))
    for f in seen:
        varied = len(set(f.rewards)) > 1
        assert f.kept == varied and f.step == 1 and f.policy_version == 0
        assert f.gen_tokens > 0 and len(f.truncated) == 4


class TwoGroupsForTheFirst:
    """Proposes the first draw twice over (2G completions) and nothing for the second slot."""

    def __init__(self, inner, group_size):
        self.inner, self.group_size = inner, group_size

    def propose(self, step, n_prompts, budget):
        first = self.inner.propose(step, n_prompts, budget)[0]
        return [Request(first.example, budget, first.source)]

    def observe(self, step, feedback):
        self.feedback = feedback

    def metrics(self):
        return {}

    def state_dict(self):
        return {}


def test_a_budget_of_several_groups_trains_as_whole_groups_of_one_prompt():
    c = build_components(load_config(None, [*FAST, "rollout.group_size=4", "algo.dynamic_sampling=false"]))
    sampler = TwoGroupsForTheFirst(c.rollout.sampler, 4)
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, sampler=sampler))
    got = collect(c.rollout, 1)
    assert len(got.group) == 8 and len({ex.prompt for ex in got.group}) == 1
    (f,) = c.rollout.sampler.feedback
    assert f.n_rollouts == 8 and f.rewards == tuple(got.rewards.tolist())
