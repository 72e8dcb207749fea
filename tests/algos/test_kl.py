"""Hand vectors for the KL estimators (anchors §2.4, §2.11)."""

import math

import pytest
import torch

from rlvr.algos.kl import KL_ESTIMATORS, get_kl_estimator, k1, k2, k3, kl_abs


def test_kl_vectors():
    logp = torch.tensor([[-1.0, -2.0, -0.7]])
    ref = torch.tensor([[-1.5, -1.0, -0.7]])
    # delta = [0.5, -1, 0]; k3 = e^-0.5 + 0.5 - 1 = 0.1065307, e^1 - 1 - 1 = 0.7182818
    torch.testing.assert_close(k1(logp, ref), torch.tensor([[0.5, -1.0, 0.0]]))
    torch.testing.assert_close(kl_abs(logp, ref), torch.tensor([[0.5, 1.0, 0.0]]))
    torch.testing.assert_close(k2(logp, ref), torch.tensor([[0.125, 0.5, 0.0]]))
    torch.testing.assert_close(k3(logp, ref), torch.tensor([[0.1065307, 0.7182818, 0.0]]))


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_every_estimator_accepts_old_logp_and_is_differentiable(name):
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    out = KL_ESTIMATORS[name](logp, ref, old_logp=logp.detach())
    assert out.shape == (1, 2)
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_k3_extreme_is_finite():
    out = k3(torch.tensor([[-100.0]]), torch.tensor([[0.0]]))
    assert torch.isfinite(out).all() and out.item() > 1e8


def test_get_kl_estimator():
    assert get_kl_estimator("k3") is k3
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k9'; valid: .*k1"):
        get_kl_estimator("k9")
    assert math.isfinite(1.0)
