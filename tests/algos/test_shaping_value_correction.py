"""DAPO shaping, value loss, entropy and rollout-mismatch correction: hand vectors."""

import math

import pytest
import torch

from rlvr.algos.correction import importance_correction, mismatch_metrics
from rlvr.algos.entropy import token_entropy
from rlvr.algos.shaping import overlong_penalty, zero_variance_groups
from rlvr.algos.value import value_loss


def test_overlong_penalty_anchor_vector():
    # L_max 20, L_c 4: soft limit 16; 17 -> -1/4, 18 -> -2/4, 20 -> -1; beyond stays -1
    out = overlong_penalty(torch.tensor([10, 16, 17, 18, 20, 25]), max_length=20, overlong_buffer=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    out = overlong_penalty(torch.tensor([18]), max_length=20, overlong_buffer=4, overlong_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([-0.25]))
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_length=4, overlong_buffer=0)


def test_zero_variance_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, math.nan, 0.5, math.nan])
    # groups [1,1] [0,1] [0,0] [1,nan] [.5,nan]: the last two have one scorable reward
    torch.testing.assert_close(zero_variance_groups(r, 2), torch.tensor([True, False, True, True, True]))
    assert not zero_variance_groups(torch.tensor([1.0, 1.0]), 1).any()  # singletons are kept


def test_value_loss_vectors():
    # V=1, old=.5, R=2, clip .2: V_clip=.7; max((1-2)^2, (.7-2)^2)/2 = .845 (clipped binds)
    # V=.2, old=0, R=0, clip .2: max(.04, .04)/2 = .02; V=.4, old=0, R=0: V_clip=.2 -> max(.16,.04)/2
    v = torch.tensor([[1.0, 0.2, 0.4, 7.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.0, float("nan")]])
    ret = torch.tensor([[2.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = value_loss(v, old, ret, mask, value_clip=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.845, 0.02, 0.08, 0.0]]))
    torch.testing.assert_close(m["value_clip_frac"], torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    loss.sum().backward()
    assert v.grad[0, 0] == 0 and torch.isfinite(v.grad).all()  # clipped branch: no gradient
    loss, _ = value_loss(v, old, ret, mask, value_clip=None)
    torch.testing.assert_close(loss, torch.tensor([[0.5, 0.02, 0.08, 0.0]]))


def test_token_entropy():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(token_entropy(logits), torch.tensor([math.log(4), 0.0]))
    z = torch.randn(2, 3, 5, dtype=torch.float64)
    p = z.softmax(-1)
    torch.testing.assert_close(token_entropy(z), -(p * p.log()).sum(-1))
    assert token_entropy(z.to(torch.bfloat16)).dtype == torch.float32


def test_importance_correction_token_and_sequence():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, 0.0]])
    roll = torch.tensor([[-1.0 - math.log(3), -1.0 + math.log(2), -1.0], [-1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # token weights old/roll: [3, .5, 1] | [1, 1, pad]
    hp = dict(correction_level="token", correction_mode="truncate", correction_cap=2.0)
    w, m = importance_correction(old, roll, mask, **hp)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [1.0, 1.0, 0.0]]))
    assert abs(m["correction_clip_frac"] - 1 / 5) < 1e-7
    w, _ = importance_correction(old, roll, mask, correction_mode="mask", correction_cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 1.0], [1.0, 1.0, 0.0]]))
    # sequence weights: 3 * .5 * 1 = 1.5 | 1 (the padding token's 5.0 is ignored)
    w, _ = importance_correction(old, roll, mask, correction_level="sequence", correction_cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 1.5], [1.0, 1.0, 0.0]]))
    hp = dict(correction_level="sequence", correction_cap=1.2, correction_mode="mask")
    w, _ = importance_correction(old, roll, mask, **hp)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="correction_level"):
        importance_correction(old, roll, mask, correction_level="tok")
    with pytest.raises(ValueError, match="correction_mode"):
        importance_correction(old, roll, mask, correction_mode="clip")


def test_mismatch_metrics():
    # log(old/roll) = [log 3, -log 2, 0, 0, 0]; k1 = mean(roll - old) = -(log3 - log2)/5
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, 0.0]])
    roll = torch.tensor([[-1.0 - math.log(3), -1.0 + math.log(2), -1.0], [-1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    m = mismatch_metrics(old, roll, mask)
    assert abs(m["mismatch_k1"] + (math.log(3) - math.log(2)) / 5) < 1e-6
    k3 = (3 - 1 - math.log(3)) + (0.5 - 1 + math.log(2))  # r - 1 - log r, r = old/roll
    assert abs(m["mismatch_k3"] - k3 / 5) < 1e-6
    assert abs(m["mismatch_max_abs"] - math.log(3)) < 1e-6
    assert mismatch_metrics(old, old, mask) == {"mismatch_k1": 0.0, "mismatch_k3": 0.0, "mismatch_max_abs": 0.0}
