"""Hand vectors for format, length and combination rewards."""

from __future__ import annotations

import math

import pytest

from rlvr.rewards import combine
from rlvr.rewards import format as fmt


@pytest.mark.parametrize("completion,strict,count", [
    ("<think>plan</think><answer>4</answer>", 1.0, 1.0),
    ("  <think>a\nb</think>\n\n<answer> 4 </answer>\n", 1.0, 1.0),
    ("<answer>4</answer>", 0.0, 0.5),                       # 2 of 4 tags once: 2/4
    ("<think>a</think>", 0.0, 0.5),
    ("<think>a</think><answer>4</answer> trailing", 0.0, 1.0),
    ("<answer>4</answer><think>a</think>", 0.0, 1.0),       # wrong order
    ("<think><think>a</think><answer>4</answer>", 0.0, 0.75),  # "<think>" twice: 3/4
    ("", 0.0, 0.0),
    ("<think></think><answer>4</answer>", 0.0, 0.5),         # an empty block earns nothing
    ("<think>a</think><answer> \n </answer>", 0.0, 0.5),
    ("</think>a<think></answer>4<answer>", 0.0, 0.0),       # reversed tags earn nothing
    ("<think>a</think></answer>4<answer>", 0.0, 0.5),
])
def test_tag_rewards(completion, strict, count):
    assert fmt.tag_format_reward(completion) == strict
    assert fmt.tag_count_reward(completion) == count


def test_custom_tags_and_extract():
    assert fmt.tag_format_reward("<reasoning>x</reasoning><code>y</code>", ("reasoning", "code")) == 1.0
    assert fmt.extract_tag("<answer>1</answer> and <answer> 2 </answer>") == "2"
    assert fmt.extract_tag("<answer>\n3\n</answer>") == "3"
    assert fmt.extract_tag("<answer>open") is None
    assert fmt.extract_tag("</answer>4<answer>") is None
    assert fmt.extract_tag("<answer>" * 100_000) is None


def test_length_vectors():
    # 1 - |n - 100| / 40: n=90 -> 0.75, n=120 -> 0.5, n=140 -> 0
    assert ([fmt.length_reward(n, target=100, tolerance=40) for n in (100, 90, 120, 140, 0)]
            == [1.0, 0.75, 0.5, 0.0, 0.0])
    # -(n - 10) / 4 past 10, floored at -1
    assert ([fmt.length_penalty(n, max_length=10, buffer=4) for n in (0, 10, 11, 12, 14, 99)]
            == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError):
        fmt.length_reward(1, target=1, tolerance=0)


def test_weighted_sum_vectors():
    comps = {"acc": [1.0, 0.0, 1.0], "fmt": [1.0, 1.0, 0.0]}
    assert combine.weighted_sum(comps, {"acc": 1.0, "fmt": 0.2}) == [1.2, 0.2, 1.0]
    with_nan = {"acc": [1.0, math.nan], "fmt": [0.5, 0.5]}
    out = combine.weighted_sum(with_nan, {"acc": 2.0})
    assert out[0] == 2.5 and math.isnan(out[1])
    assert combine.weighted_sum(with_nan, {"acc": 2.0}, nan_as=0.0) == [2.5, 0.5]
    assert combine.weighted_sum(with_nan, {"acc": 0.0}) == [0.5, 0.5]  # zero weight ignores nan
    with pytest.raises(ValueError, match="unknown rewards"):
        combine.weighted_sum(comps, {"len": 1.0})


def test_group_normalize_vectors():
    # group [1, 0, 0, 1]: mean 0.5, Bessel std sqrt(1/3) (as the GRPO advantage) -> ±sqrt(3)/2
    out = combine.group_normalize([1.0, 0.0, 0.0, 1.0], 4, eps=0.0)
    h = round(math.sqrt(3) / 2, 12)
    assert out == [h, -h, -h, h]
    # constant group -> zeros; nan excluded from the statistics and kept
    out = combine.group_normalize([2.0, 2.0, 2.0, math.nan, 3.0, 5.0], 3, eps=0.0)
    assert out[:3] == [0.0, 0.0, 0.0]
    # second group [nan, 3, 5]: mean 4, Bessel std sqrt(2) -> [nan, -1/sqrt(2), 1/sqrt(2)]
    r = round(1 / math.sqrt(2), 12)
    assert math.isnan(out[3]) and out[4:] == [-r, r]
    assert combine.group_normalize([1.0, math.nan], 2, eps=0.0)[0] == 0.0  # one scorable value: no spread
    assert combine.group_normalize([1.0, 3.0], 2, eps=0.0, std=False) == [-1.0, 1.0]


def test_decoupled_normalisation_keeps_reward_combinations_apart():
    # Two binary rewards, group of 4. Summed first, (1,0) and (0,1) tie; GDPO's point is that
    # per-reward normalisation distinguishes a rare success from a common one.
    acc = [1.0, 0.0, 0.0, 0.0]   # mean .25, Bessel std .5 -> [1.5, -.5, -.5, -.5]
    fmt_ = [1.0, 1.0, 1.0, 0.0]  # mean .75, Bessel std .5 -> [.5, .5, .5, -1.5]
    out = combine.decoupled_normalize({"acc": acc, "fmt": fmt_}, None, 4, eps=0.0, batch_norm=False)
    expected = [2.0, 0.0, 0.0, -2.0]
    assert all(abs(a - b) < 1e-6 for a, b in zip(out, expected))
    summed = combine.group_normalize(combine.weighted_sum({"acc": acc, "fmt": fmt_}), 4, eps=0.0)
    assert summed[1] == summed[2] and summed[1] != summed[0]
    normed = combine.decoupled_normalize({"acc": acc, "fmt": fmt_}, {"acc": 1.0, "fmt": 0.5}, 4, eps=0.0)
    assert abs(sum(normed) / 4) < 1e-9 and abs(sum(v * v for v in normed) / 3 - 1.0) < 1e-6  # Bessel: n - 1
