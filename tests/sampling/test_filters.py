"""The post-generation group filters: TraceRL's pass-rate band on hand vectors, the builder's
choice between it and DAPO's filter, and the config's range checks."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.builder.plans import group_filter
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.sampling.base import PassRateBand, ZeroVariance, in_pass_band

NAN = math.nan


def test_band_keeps_groups_strictly_inside_it():
    # G = 4; pass rates 4/4, 1/4, 2/4, 0/4, 3/4.
    correct = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0], dtype=torch.float)
    rewards = correct.clone()
    keep, m = in_pass_band(rewards, correct, 4, low=0.25, high=1.0)
    # 1.0 is not < 1; 0.25 is not > 0.25 (open band); 0.5 and 0.75 are inside; 0 is below.
    assert keep.tolist() == [False, False, True, False, True]
    assert m["batch/group_pass_rate"] == pytest.approx((1 + 0.25 + 0.5 + 0 + 0.75) / 5)
    keep, _ = in_pass_band(rewards, correct, 4, low=0.0, high=1.0)
    assert keep.tolist() == [False, True, True, False, True]


def test_band_reads_verdicts_not_shaped_rewards():
    # A format credit of 0.1 makes the rewards vary in a group nobody solved: DAPO's filter keeps
    # it, the (0, 1) band drops it.
    correct = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    rewards = torch.tensor([0.1, 0.0, 0.1, 0.0, 1.0, 0.1, 0.0, 0.0])
    assert ZeroVariance(1).keep(rewards, correct, 4).tolist() == [True, True]
    assert PassRateBand(max_rounds=1).keep(rewards, correct, 4).tolist() == [False, True]


def test_band_rate_counts_scorable_completions_only():
    # Group 0: two scorable, one solved -> p = 1/2 (kept by (0.4, 0.6)); the NaN rows do not count
    # as failures (with them p would be 1/4). Group 1: nothing scorable -> no rate, dropped.
    rewards = torch.tensor([1.0, 0.0, NAN, NAN, NAN, NAN, NAN, NAN])
    correct = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    keep, m = in_pass_band(rewards, correct, 4, low=0.4, high=0.6)
    assert keep.tolist() == [True, False]
    assert m["batch/group_pass_rate"] == pytest.approx(0.5)


def test_band_refills_like_dapo():
    f = PassRateBand(max_rounds=2, low=0.2, high=0.8)
    assert f.refill(kept_groups=1, wanted_groups=4, rounds_done=1)
    assert not f.refill(kept_groups=1, wanted_groups=4, rounds_done=2)
    assert not f.refill(kept_groups=4, wanted_groups=4, rounds_done=1)


def test_builder_picks_the_band_when_an_edge_is_set():
    algo = load_config(None, ["algo.pass_rate_low=0.1", "algo.max_sampling_rounds=3"]).algo
    assert group_filter(algo) == PassRateBand(max_rounds=3, low=0.1, high=1.0)
    algo = load_config(None, ["algo.pass_rate_high=0.9", "algo.dynamic_sampling=false"]).algo
    assert group_filter(algo) == PassRateBand(max_rounds=1, low=0.0, high=0.9)
    assert group_filter(load_config(None, []).algo) == ZeroVariance(1)
    assert group_filter(load_config(None, ["algo.dynamic_sampling=false"]).algo) is None


@pytest.mark.parametrize("overrides,field", [
    (["algo.pass_rate_low=0.6", "algo.pass_rate_high=0.4"], "algo.pass_rate_high"),
    (["algo.pass_rate_low=1.5"], "algo.pass_rate_low"),
    (["algo.pass_rate_high=0"], "algo.pass_rate_high"),  # (0, 0) keeps nothing
])
def test_bad_band_is_one_config_error(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, overrides)
