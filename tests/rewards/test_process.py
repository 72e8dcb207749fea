"""Process rewards on hand vectors: step splitting, the dense clipped and delta refinements, the
min / last / mean / clipped / delta aggregations (the PRM's own test: test_reward_model.py)."""

from __future__ import annotations

import pytest

from rlvr.rewards.process import process_reward, split_steps, step_rewards

SCORES = [0.9, 0.2, 0.7]


def test_split_at_a_separator_or_a_step_tag():
    assert split_steps("2+3=5\n\n5*4=20\n\n\n\n20-1=19") == ["2+3=5", "5*4=20", "20-1=19"]
    assert split_steps("a=1 ки b=2 ки c", tag="ки") == ["a=1", "b=2", "c"]
    assert split_steps("x\ny", separator="\n") == ["x", "y"]
    assert split_steps("   \n\n ") == []


def test_dense_step_rewards_by_hand():
    assert step_rewards(SCORES) == SCORES
    # clipped at η = 0.5: min(0.4, 0), min(−0.3, 0), min(0.2, 0)
    assert step_rewards(SCORES, "clipped", threshold=0.5) == pytest.approx([0.0, -0.3, 0.0])
    # delta: 0.9 − 0.2, 0.2 − 0.7, then the last 0.7; the return from step k is s_k
    delta = step_rewards(SCORES, "delta")
    assert delta == pytest.approx([0.7, -0.5, 0.7])
    assert [sum(delta[k:]) for k in range(3)] == pytest.approx(SCORES)


@pytest.mark.parametrize("how, expected", [("min", 0.2), ("last", 0.7), ("mean", 0.6), ("clipped", -0.3),
                                           ("delta", 0.9)])
def test_aggregations_by_hand(how, expected):
    assert process_reward(SCORES, how, threshold=0.5) == pytest.approx(expected)


def test_no_step_is_not_scorable_and_unknown_names_are_refused():
    assert process_reward([], "min") is None
    with pytest.raises(ValueError, match="unknown process aggregation 'max'"):
        process_reward(SCORES, "max")
    with pytest.raises(ValueError, match="unknown step reward 'sum'"):
        step_rewards(SCORES, "sum")

