"""ERILS's pure parts: length control to the diffusion window and per-source advantages, on
hand-computed vectors."""

import math

import torch

from rlvr.algos.erils import canvas_rows, per_source_advantages


def test_canvas_rows_pad_with_eos_to_the_window_and_drop_what_does_not_fit():
    ids, fits = canvas_rows([[5, 6], [7, 8, 9], [7, 8, 9, 10]], gen_length=4, eos_id=2)
    assert ids.tolist() == [[5, 6, 2, 2], [7, 8, 9, 2], [2, 2, 2, 2]]
    assert fits.tolist() == [True, True, False]  # 3 tokens + EOS fill the window exactly; 4 + EOS do not


def test_canvas_rows_of_no_completions_keep_the_window_shape():
    ids, fits = canvas_rows([], gen_length=3, eos_id=2)
    assert ids.shape == (0, 3) and fits.shape == (0,)


def test_each_source_is_standardised_against_its_own_rows():
    # one prompt: 4 on-policy rows (source 0), 3 oracle rows (source 1, all correct)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.zeros(7, dtype=torch.long)
    sources = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    adv = per_source_advantages(rewards, groups, sources, eps=0.0)
    # on-policy: mean 1/4, Bessel std sqrt((0.75² + 3·0.25²)/3) = 1/2 -> 1.5, -0.5 ×3; oracle: no spread -> 0
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0]))
    joint = per_source_advantages(rewards, groups, torch.zeros(7, dtype=torch.long), eps=0.0)
    # joint: mean 4/7, std sqrt(2/7): the oracle's 1s get (3/7)/sqrt(2/7), every wrong row -(4/7)/sqrt(2/7)
    hi, lo = (3 / 7) / math.sqrt(2 / 7), -(4 / 7) / math.sqrt(2 / 7)
    assert torch.allclose(joint, torch.tensor([hi, lo, lo, lo, hi, hi, hi]))


def test_a_varying_external_source_gets_its_own_spread():
    rewards = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0])
    adv = per_source_advantages(rewards, torch.zeros(5, dtype=torch.long), torch.tensor([0, 0, 1, 1, 1]), eps=0.0)
    # on-policy mean 1/2, std 1/sqrt(2); external mean 1/2, std sqrt((0 + 0.25 + 0.25)/2) = 1/2
    s = 1 / math.sqrt(2)
    assert torch.allclose(adv, torch.tensor([-0.5 / s, 0.5 / s, 0.0, 1.0, -1.0]))


def test_groups_split_a_source_and_nan_or_singletons_give_zero():
    rewards = torch.tensor([float("nan"), 1.0, 0.0, 1.0])
    adv = per_source_advantages(rewards, torch.tensor([0, 0, 0, 1]), torch.zeros(4, dtype=torch.long), eps=0.0)
    s = 1 / math.sqrt(2)  # group 0's scorable rewards {1, 0}; group 1 has one row
    assert torch.allclose(adv, torch.tensor([0.0, 0.5 / s, -0.5 / s, 0.0]))
