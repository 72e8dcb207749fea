"""Preference losses on hand vectors: DPO, IPO and Bradley–Terry values and gradients, with the
arithmetic in the comments; VRPO is DPO on the same numbers."""

import math

import pytest
import torch

from rlvr.algos.preference import bradley_terry_loss, dpo_loss, vrpo_loss


def _leaves(*values):
    return [torch.tensor(v, requires_grad=True) for v in values]


def test_dpo_loss_and_gradient_by_hand():
    # pair 1: log-ratios chosen −1 − (−2) = 1, rejected −3 − (−2) = −1 -> margin β·2 = 1 at β = 0.5
    # pair 2: chosen −2 − (−2) = 0, rejected −1 − (−2) = 1 -> margin 0.5·(−1) = −0.5
    pc, pr = _leaves([-1.0, -2.0], [-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    loss, m = dpo_loss(pc, rc, pr, rr, beta=0.5)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2  # mean of −log σ(margin)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # d/dπc = −β σ(−margin) / 2 (the mean over 2 pairs); d/dπr = −d/dπc
    sig = [1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(-0.5))]
    assert pc.grad.tolist() == pytest.approx([-0.5 * sig[0] / 2, -0.5 * sig[1] / 2], abs=1e-6)
    assert pr.grad.tolist() == pytest.approx([0.5 * sig[0] / 2, 0.5 * sig[1] / 2], abs=1e-6)
    assert m["accuracy"] == 0.5 and m["margin"] == pytest.approx(0.25)
    assert m["chosen_reward"] == pytest.approx(0.25) and m["rejected_reward"] == pytest.approx(0.0)


def test_the_reference_gets_no_gradient_and_vrpo_is_dpo():
    pc, pr, rc, rr = _leaves([-1.0], [-3.0], [-2.0], [-2.0])
    loss, _ = dpo_loss(pc, rc, pr, rr, beta=0.5)
    loss.backward()
    assert rc.grad is None and rr.grad is None
    v, _ = vrpo_loss(pc.detach(), rc.detach(), pr.detach(), rr.detach(), beta=0.5)
    assert float(v) == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)


def test_ipo_loss_and_gradient_by_hand():
    # log-ratios 1 and −1 over 2 and 4 tokens: h = 1/2 − (−1/4) = 0.75; τ = β = 0.5 -> (0.75 − 1)² = 0.0625
    pc, pr = _leaves([-1.0], [-3.0])
    loss, _ = dpo_loss(pc, torch.tensor([-2.0]), pr, torch.tensor([-2.0]), beta=0.5, loss_type="ipo",
                       chosen_tokens=torch.tensor([2.0]), rejected_tokens=torch.tensor([4.0]))
    assert loss.item() == pytest.approx(0.0625)
    loss.backward()
    assert float(pc.grad) == pytest.approx(2 * (0.75 - 1) / 2)  # −0.25
    assert float(pr.grad) == pytest.approx(2 * (0.75 - 1) * (-1 / 4))  # 0.125
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(pc, pc, pr, pr, loss_type="ipo")
    with pytest.raises(ValueError, match="unknown DPO loss 'hinge'"):
        dpo_loss(pc, pc, pr, pr, loss_type="hinge")


def test_bradley_terry_with_a_margin_by_hand():
    chosen, rejected = _leaves([2.0, 0.0], [1.0, 1.0])
    loss, m = bradley_terry_loss(chosen, rejected, margin=torch.tensor([1.0, 0.0]))
    # pair 1: gap 1 − m 1 = 0 -> log 2; pair 2: gap −1 -> log(1 + e)
    assert loss.item() == pytest.approx((math.log(2) + math.log1p(math.e)) / 2, abs=1e-6)
    loss.backward()
    # d/dr_w = −σ(−(gap − m)) / 2
    assert chosen.grad.tolist() == pytest.approx([-0.5 / 2, -(1 / (1 + math.exp(-1.0))) / 2], abs=1e-6)
    assert rejected.grad.tolist() == pytest.approx([0.25, (1 / (1 + math.exp(-1.0))) / 2], abs=1e-6)
    assert m["accuracy"] == 0.5 and m["gap"] == pytest.approx(0.0)
