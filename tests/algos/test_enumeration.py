"""Exact-expectation gradient tests on a tiny categorical policy (no sampling).

A 3-token vocabulary, completions of length 1 or 2, logits as the parameters. An expectation
over the policy is a sum over every outcome weighted by its probability; the weight is detached,
so grad(sum_y sg[p(y)] * loss(y)) = E_y[grad loss(y)]: exactly what training follows on average
when y is sampled and loss(y) is differentiated. We compare that against the gradient of the
quantity each estimator claims to target, computed exactly.
"""

import itertools

import pytest
import torch

from rlvr.algos.advantages import AdvantageInputs, dr_grpo, maxrl, rloo
from rlvr.algos.aggregate import token_sum
from rlvr.algos.kl import (
    forward_kl,
    forward_kl_on_reference_samples,
    js,
    js_on_reference_samples,
    k1,
    k1_st,
    k2,
    k3,
    k3_iw,
    k3_st,
)
from rlvr.algos.objectives import reinforce

DT = torch.float64
V = 3


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=DT).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(V, generator=g, dtype=DT), -1)
    return theta, ref


def _grad(scalar, theta):
    (g,) = torch.autograd.grad(scalar, theta, retain_graph=True)
    return g


def _reverse_kl(logp, ref):
    return (logp.exp() * (logp - ref)).sum()


def _forward_kl(logp, ref):
    return (ref.exp() * (ref - logp)).sum()


def _js(logp, ref):
    p, q = logp.exp(), ref.exp()
    m = 0.5 * (p + q)
    return 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()


def _expect(fn, logp, ref, weights=None, **kw):
    """sum_y sg[w(y)] * fn(logp(y), ref(y)); w = the policy's probabilities by default."""
    w = logp.exp().detach() if weights is None else weights
    return (w * fn(logp, ref, **kw)).sum()


# --- length 1: which estimator in the loss gives which gradient ------------------------------

def test_k1_in_the_loss_has_zero_expected_gradient():
    theta, ref = _params()
    logp = torch.log_softmax(theta, -1)
    torch.testing.assert_close(_grad(_expect(k1, logp, ref), theta), torch.zeros(V, dtype=DT))


@pytest.mark.parametrize("fn", [k2, k1_st, k3_st, k3_iw], ids=lambda f: f.__name__)
def test_reverse_kl_gradient_in_the_loss(fn):
    theta, ref = _params(1)
    logp = torch.log_softmax(theta, -1)
    target = _grad(_reverse_kl(logp, ref), theta)
    torch.testing.assert_close(_grad(_expect(fn, logp, ref), theta), target)


@pytest.mark.parametrize("fn", [k1, k3, k1_st, k3_st, k3_iw], ids=lambda f: f.__name__)
def test_unbiased_reverse_kl_values(fn):
    theta, ref = _params(2)
    logp = torch.log_softmax(theta, -1)
    torch.testing.assert_close(_expect(fn, logp, ref), _reverse_kl(logp, ref))


def test_k3_in_the_loss_is_the_forward_kl_gradient():
    theta, ref = _params(3)
    logp = torch.log_softmax(theta, -1)
    target = _grad(_forward_kl(logp, ref), theta)
    torch.testing.assert_close(_grad(_expect(k3, logp, ref), theta), target)
    assert not torch.allclose(target, _grad(_reverse_kl(logp, ref), theta), atol=1e-3)


def test_k1_in_the_reward_is_the_reverse_kl_gradient():
    # REINFORCE with reward -beta * k1 (detached): E[-R grad logp] = beta * grad KL(pi || ref)
    theta, ref = _params(4)
    logp = torch.log_softmax(theta, -1)
    beta = 0.3
    reward = -beta * k1(logp, ref).detach()
    loss, _ = reinforce(logp[None], logp.detach()[None], reward[None], torch.ones(1, V))
    expected = (logp.exp().detach() * loss[0]).sum()
    torch.testing.assert_close(_grad(expected, theta), beta * _grad(_reverse_kl(logp, ref), theta))


def test_k3_iw_off_policy_value_and_gradient():
    # samples from pi_old; E_old[rho k3] = KL(pi || ref) and its gradient is the true one
    theta, ref = _params(5)
    logp = torch.log_softmax(theta, -1)
    old = torch.log_softmax(theta.detach() + torch.tensor([0.4, -0.3, 0.1], dtype=DT), -1)
    value = _expect(k3_iw, logp, ref, weights=old.exp(), old_logp=old)
    torch.testing.assert_close(value, _reverse_kl(logp, ref))
    torch.testing.assert_close(_grad(value, theta), _grad(_reverse_kl(logp, ref), theta))


@pytest.mark.parametrize("fn,div", [(forward_kl, _forward_kl), (js, _js)], ids=["forward_kl", "js"])
def test_mass_covering_on_policy_samples(fn, div):
    theta, ref = _params(6)
    logp = torch.log_softmax(theta, -1)
    value = _expect(fn, logp, ref)
    torch.testing.assert_close(value, div(logp, ref))
    torch.testing.assert_close(_grad(value, theta), _grad(div(logp, ref), theta))


@pytest.mark.parametrize(
    "fn,div", [(forward_kl_on_reference_samples, _forward_kl), (js_on_reference_samples, _js)], ids=["fkl", "js"]
)
def test_mass_covering_on_reference_samples(fn, div):
    theta, ref = _params(7)
    logp = torch.log_softmax(theta, -1)
    value = (ref.exp() * fn(logp, ref)).sum()  # samples from the initial policy
    torch.testing.assert_close(value, div(logp, ref))
    torch.testing.assert_close(_grad(value, theta), _grad(div(logp, ref), theta))


# --- length 1: group advantages are (scaled) policy gradients --------------------------------

def _group_surrogate(estimator, reward, theta, G):
    """E over all V^G groups of this estimator's REINFORCE loss, aggregated as (1/G) sum_i."""
    logp = torch.log_softmax(theta, -1)
    tuples = torch.tensor(list(itertools.product(range(V), repeat=G)))  # (V^G, G)
    prob = logp.exp().detach()[tuples].prod(-1)  # (V^G,)
    rows = tuples.reshape(-1)
    inp = AdvantageInputs(rewards=reward[rows], group_size=G, response_mask=torch.ones(rows.numel(), 1, dtype=DT))
    adv, _ = estimator(inp)
    loss, _ = reinforce(logp[rows][:, None], logp.detach()[rows][:, None], adv, inp.response_mask)
    weighted = loss * prob.repeat_interleave(G)[:, None] / G
    return token_sum(weighted, inp.response_mask)


def test_rloo_and_dr_grpo_surrogates_follow_the_policy_gradient():
    theta, _ = _params(8)
    reward = torch.tensor([1.0, 0.0, 0.5], dtype=DT)
    true = _grad((torch.softmax(theta, -1) * reward).sum(), theta)  # grad E[R]
    G = 3
    torch.testing.assert_close(-_grad(_group_surrogate(rloo, reward, theta, G), theta), true)
    # the group mean includes the sample itself: the gradient shrinks by (G - 1) / G
    torch.testing.assert_close(-_grad(_group_surrogate(dr_grpo, reward, theta, G), theta), true * (G - 1) / G)


@pytest.mark.parametrize("N", [1, 2, 3, 4])
def test_maxrl_is_unbiased_for_the_truncated_log_likelihood(N):
    # J_N = -sum_{k=1}^{N} (1 - p)^k / k interpolates RL (N = 1: p - 1) and log p (N -> inf)
    theta, _ = _params(9)
    reward = torch.tensor([1.0, 0.0, 0.0], dtype=DT)  # outcome 0 is the success
    p = torch.softmax(theta, -1)[0]
    j_n = -sum((1 - p) ** k / k for k in range(1, N + 1))
    got = -_grad(_group_surrogate(maxrl, reward, theta, N), theta)
    torch.testing.assert_close(got, _grad(j_n, theta))
    if N == 1:
        torch.testing.assert_close(got, _grad(p, theta))  # plain RL


def test_maxrl_needs_the_all_fail_term():
    # zeroing all-fail groups (as GRPO would) biases the estimator: shown, not shipped
    theta, _ = _params(9)
    reward = torch.tensor([1.0, 0.0, 0.0], dtype=DT)

    def maxrl_zero_all_fail(inp):
        adv, m = maxrl(inp)
        all_fail = inp.rewards.view(-1, inp.group_size).amax(-1) == 0
        return adv * (~all_fail).repeat_interleave(inp.group_size)[:, None], m

    p = torch.softmax(theta, -1)[0]
    target = _grad(-sum((1 - p) ** k / k for k in range(1, 4)), theta)
    biased = -_grad(_group_surrogate(maxrl_zero_all_fail, reward, theta, 3), theta)
    assert not torch.allclose(biased, target, atol=1e-4)


# --- length 2: per-token placement versus the sequence-level divergence ----------------------

def _seq_setup(seed=10):
    g = torch.Generator().manual_seed(seed)
    t1 = torch.randn(V, generator=g, dtype=DT).requires_grad_(True)
    t2 = torch.randn(V, V, generator=g, dtype=DT).requires_grad_(True)
    r1 = torch.log_softmax(torch.randn(V, generator=g, dtype=DT), -1)
    r2 = torch.log_softmax(torch.randn(V, V, generator=g, dtype=DT), -1)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=2)))  # (9, 2)
    a, b = seqs[:, 0], seqs[:, 1]
    l1, l2 = torch.log_softmax(t1, -1), torch.log_softmax(t2, -1)
    logp = torch.stack([l1[a], l2[a, b]], -1)  # (9, 2) token log-probs
    ref = torch.stack([r1[a], r2[a, b]], -1)
    prob = logp.sum(-1).exp()  # (9,) sequence probabilities
    return (t1, t2), logp, ref, prob, (l1, l2, r1, r2)


def _grads(scalar, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(scalar, params, retain_graph=True)])


def test_sequence_kl_in_the_reward_is_exact():
    params, logp, ref, prob, _ = _seq_setup()
    kl_seq = (prob * (logp - ref).sum(-1)).sum()
    beta = 0.5
    reward = -beta * k1(logp, ref).sum(-1, keepdim=True).detach()  # -beta * sum_t k1, per sequence
    loss, _ = reinforce(logp, logp.detach(), reward.expand(-1, 2), torch.ones(9, 2, dtype=DT))
    expected = (prob.detach()[:, None] * loss).sum()
    torch.testing.assert_close(_grads(expected, params), beta * _grads(kl_seq, params))


def test_reinforce_surrogate_is_the_sequence_policy_gradient():
    params, logp, _, prob, _ = _seq_setup(11)
    reward = torch.tensor([1.0, 0.0, 0.2, 0.0, 0.7, 0.0, 0.0, 1.0, 0.4], dtype=DT)
    loss, _ = reinforce(logp, logp.detach(), reward[:, None].expand(-1, 2), torch.ones(9, 2, dtype=DT))
    expected = (prob.detach()[:, None] * loss).sum()
    torch.testing.assert_close(-_grads(expected, params), _grads((prob * reward).sum(), params))


def test_per_token_kl_in_the_loss_holds_the_prefix_fixed():
    # k2 / k3 in the loss follow the per-token conditional KLs with the prefix distribution
    # detached, which is NOT the gradient of the sequence-level KL.
    params, logp, ref, prob, (l1, l2, r1, r2) = _seq_setup(12)
    p1 = l1.exp()
    rev_cond = _reverse_kl(l1, r1) + (p1.detach() * (l2.exp() * (l2 - r2)).sum(-1)).sum()
    fwd_cond = _forward_kl(l1, r1) + (p1.detach() * (r2.exp() * (r2 - l2)).sum(-1)).sum()
    rev_seq = (prob * (logp - ref).sum(-1)).sum()
    w = prob.detach()[:, None]
    g_k2 = _grads((w * k2(logp, ref)).sum(), params)
    g_k3 = _grads((w * k3(logp, ref)).sum(), params)
    torch.testing.assert_close(g_k2, _grads(rev_cond, params))
    torch.testing.assert_close(g_k3, _grads(fwd_cond, params))
    assert not torch.allclose(g_k2, _grads(rev_seq, params), atol=1e-4)
