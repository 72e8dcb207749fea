"""Hand vectors for the KL estimators."""

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


# --- variants -----------------------------------------------------------------------------------

from rlvr.algos.kl import (  # noqa: E402
    adaptive_kl_coef,
    forward_kl,
    js,
    k1_st,
    k3_iw,
    k3_st,
)


def _value_and_grad(fn, logp, ref, **kw):
    x = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    out = fn(x, torch.tensor(ref, dtype=torch.float64), **kw)
    out.sum().backward()
    return out.detach(), x.grad


def test_straight_through_estimators():
    # delta = [0.5, -1]: k2 gradient = delta
    v, g = _value_and_grad(k1_st, [-1.0, -2.0], [-1.5, -1.0])
    torch.testing.assert_close(v, torch.tensor([0.5, -1.0], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([0.5, -1.0], dtype=torch.float64))
    v, g = _value_and_grad(k3_st, [-1.0, -2.0], [-1.5, -1.0])
    torch.testing.assert_close(v, torch.tensor([0.1065307, 0.7182818], dtype=torch.float64))
    torch.testing.assert_close(g, torch.tensor([0.5, -1.0], dtype=torch.float64))


def test_k3_iw_vector():
    # rho = e^(−1 − (−1.2)) = e^.2 = 1.221403; k3 = .1065307 -> .1301168; grad rho*delta = .6107014
    v, g = _value_and_grad(k3_iw, [-1.0], [-1.5], old_logp=torch.tensor([-1.2], dtype=torch.float64))
    assert abs(v.item() - 0.1301168) < 1e-6 and abs(g.item() - 0.6107014) < 1e-6
    v, g = _value_and_grad(k3_iw, [-1.0], [-1.5])  # old_logp None: on-policy, k3 value, k2 grad
    assert abs(v.item() - 0.1065307) < 1e-6 and abs(g.item() - 0.5) < 1e-6


def test_mass_covering_vectors():
    # r = e^-delta; forward: r log r - r + 1, grad 1 - r; js: (r log r - (1+r) log((1+r)/2))/2,
    # grad log(2/(1+r))/2. delta = .5: r = .6065307; delta = -1: r = e
    v, g = _value_and_grad(forward_kl, [-1.0, -2.0], [-1.5, -1.0])
    torch.testing.assert_close(v, torch.tensor([0.090204, 1.0], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(g, torch.tensor([0.3934693, -1.7182818], dtype=torch.float64), atol=1e-6, rtol=0)
    v, g = _value_and_grad(js, [-1.0, -2.0], [-1.5, -1.0])
    torch.testing.assert_close(v, torch.tensor([0.0243388, 0.2062607], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(g, torch.tensor([0.1095351, -0.3100573], dtype=torch.float64), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_equal_logprobs_give_zero(name):
    x = torch.tensor([[-0.3, -2.0]])
    assert torch.all(KL_ESTIMATORS[name](x, x, old_logp=x) == 0)


def test_adaptive_kl_coef():
    # e = clip(.2/.1 - 1, -.2, .2) = .2; .1 * (1 + .2 * 256/10000) = .100512
    assert abs(adaptive_kl_coef(0.1, 0.2, 256, kl_target=0.1, kl_horizon=10000) - 0.100512) < 1e-12
    assert abs(adaptive_kl_coef(0.1, 0.0, 256, kl_target=0.1) - 0.099488) < 1e-12  # e = -.2
    assert abs(adaptive_kl_coef(0.1, 0.11, 256, kl_target=0.1) - 0.100256) < 1e-12  # e = .1
    with pytest.raises(ValueError):
        adaptive_kl_coef(0.1, 0.1, 1, kl_target=0.0)
