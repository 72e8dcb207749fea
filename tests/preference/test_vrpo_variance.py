"""VRPO's sampling (stratified timesteps, one mask each, masks shared by policy and reference)
against a plain ELBO estimate (independent t and masks for each) at the same forwards, on the
packaged Countdown dLLM warm start with the policy a few DPO steps away from the reference:
bench/vrpo_variance.py's estimators on a fixed small case."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "vrpo_variance.py"


def _bench():
    return SimpleNamespace(**runpy.run_path(str(BENCH)))  # its functions, without running main()


@pytest.fixture(scope="module")
def measured():
    bench = _bench()
    torch.manual_seed(0)
    policy, reference, batch = bench.setup(pairs=4, shift_steps=3)
    return bench.measure(policy, reference, batch, n=2, seeds=40)


@pytest.mark.slow  # 40 seeds × 3 estimators of a 4-layer model: ~30 s on one thread
def test_policy_differs_from_reference_so_the_case_is_not_trivial(measured):
    # at policy = reference VRPO's margin would be exactly 0 under every seed
    assert float(measured["vrpo"]["margin"].var()) > 0


@pytest.mark.slow  # 40 seeds × 3 estimators of a 4-layer model: ~30 s on one thread
def test_vrpo_margin_and_loss_vary_less_than_the_plain_elbo_estimate(measured):
    plain, vrpo = measured["plain"], measured["vrpo"]
    assert float(vrpo["margin"].var()) < 0.5 * float(plain["margin"].var())
    assert float(vrpo["loss"].var()) < 0.5 * float(plain["loss"].var())


@pytest.mark.slow  # 40 seeds × 3 estimators of a 4-layer model: ~30 s on one thread
def test_every_estimator_estimates_the_same_margin(measured):
    # all three are unbiased for the same ELBO margin: their means agree within 3 standard errors
    means = {k: v["margin"] for k, v in measured.items()}
    for kind in ("shared", "vrpo"):
        a, b = means["plain"], means[kind]
        se = (a.var() / len(a) + b.var() / len(b)).sqrt()
        assert abs(float(a.mean() - b.mean())) < 3 * float(se)


def test_iid_elbo_at_a_fixed_seed_is_reproducible_and_seed_dependent():
    bench = _bench()
    policy, _, batch = bench.setup(pairs=2, shift_steps=0)
    with torch.no_grad():
        a = bench.iid_elbo(policy, batch, n=2, mask_seed=5)
        b = bench.iid_elbo(policy, batch, n=2, mask_seed=5)
        c = bench.iid_elbo(policy, batch, n=2, mask_seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool((a < 0).all())  # an ELBO of log-probabilities is negative
