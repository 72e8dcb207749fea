"""Estimators against exact enumeration on a model with L = 3, vocabulary 4 (+ mask)."""

import torch
from _tiny import (
    MASK,
    PROMPT,
    all_sequences,
    context,
    enumerable_model,
    exact_elbo,
    exact_eubo,
    exact_loglik,
    order_logps,
)

from rlvr.algos.dllm_objectives import bgpo_objective
from rlvr.algos.objectives import wd1
from rlvr.algos.preference import vrpo_loss
from rlvr.models.diffusion_policy import DiffusionPolicy
from rlvr.models.likelihood import ar_order, bgpo, elbo_mc, mean_field, spg

SEQS = torch.tensor([[0, 1, 2], [1, 1, 3], [2, 0, 1], [3, 3, 3]])


def _draws(fn, model, ys, seeds, **kw):
    """(S, B) sequence estimates, one independent draw per seed, batched in one call."""
    seeds = list(seeds)
    rows = ys.repeat(len(seeds), 1)
    ctx = context(model, rows)
    ctx.keys = torch.cat([context(model, ys, s).keys for s in seeds])
    if "advantages" in kw:
        kw = {**kw, "advantages": kw["advantages"].repeat(len(seeds))}
    with torch.no_grad():
        return fn(ctx, **kw)[0].sum(-1).view(len(seeds), len(ys))


def test_exact_likelihood_is_a_distribution_and_elbo_is_below_it():
    model = enumerable_model()
    ys = all_sequences(3)
    loglik, elbo = exact_loglik(model, ys), exact_elbo(model, ys)
    assert abs(float(loglik.exp().sum()) - 1.0) < 1e-5  # the random-order sampler's distribution
    assert bool((elbo <= loglik + 1e-6).all())  # Jensen, for every one of the 64 sequences
    assert float((loglik - elbo).max()) > 1e-3  # and not trivially equal


def test_elbo_mc_is_unbiased_for_the_exact_elbo_plain_and_antithetic():
    model = enumerable_model()
    exact, loglik = exact_elbo(model, SEQS), exact_loglik(model, SEQS)
    for antithetic in (False, True):
        draws = _draws(elbo_mc, model, SEQS, range(400), n=1, antithetic=antithetic)
        mean, se = draws.mean(0), draws.std(0) / 400 ** 0.5
        assert bool(((mean - exact).abs() <= 4 * se + 1e-4).all()), (antithetic, mean, exact, se)
        assert bool((mean <= loglik + 4 * se + 1e-4).all())  # ELBO mean <= log-likelihood within 4 SE


def test_eubo_is_an_upper_bound_for_beta_at_least_L_and_the_estimator_converges_to_it():
    # Per-token EUBO_β = Σ_i (1/β) log E[p_i^β] (SPG); Hölder gives log π <= EUBO_β for β >= L. For
    # β < L it is not a bound in general (on this model, violated for some sequences at β = 1).
    model = enumerable_model()
    ys = all_sequences(3)
    loglik = exact_loglik(model, ys)
    assert bool((exact_eubo(model, ys, 3.0) >= loglik - 1e-5).all())
    assert bool((exact_eubo(model, ys, 1.0) < loglik - 1e-4).any())
    eubo = exact_eubo(model, SEQS, 3.0)
    minus = -torch.ones(len(SEQS))
    draws = _draws(spg, model, SEQS, range(40), n=32, beta=3.0, bound="eubo", advantages=minus)
    mean, se = draws.mean(0), draws.std(0) / 40 ** 0.5
    # log of an MC mean is biased low by O(1/n); with n = 32 pairs that is far below 0.02 here.
    assert bool(((mean - eubo).abs() <= 4 * se + 0.02).all()), (mean, eubo)
    assert bool((mean >= exact_loglik(model, SEQS) - 4 * se - 0.02).all())


def test_elbo_mc_variance_falls_with_n_and_with_antithetic_pairs():
    model = enumerable_model()
    ys = SEQS[:3]
    var = {n: _draws(elbo_mc, model, ys, range(300), n=n).var(0).mean().item() for n in (1, 4, 16)}
    assert var[1] > 2.5 * var[4] > 2.5 ** 2 * var[16] * 0.9
    plain = _draws(elbo_mc, model, ys, range(300), n=2).var(0).mean().item()  # 2 forwards
    paired = _draws(elbo_mc, model, ys, range(300), n=1, antithetic=True).var(0).mean().item()  # 2 forwards
    assert paired < plain


def test_ar_order_is_the_exact_left_to_right_factorisation():
    model = enumerable_model()
    logp, _ = ar_order(context(model, SEQS))
    left_to_right = order_logps(model, SEQS)[:, 0]  # permutations() yields the identity first
    assert torch.allclose(logp.sum(-1), left_to_right, atol=1e-5)
    with torch.no_grad():  # and token by token, by hand
        full = model(torch.cat([PROMPT.expand(4, -1), torch.tensor([[MASK, MASK, MASK]]).expand(4, -1)], 1))
    first = full[:, 2].clone()
    first[:, MASK] = float("-inf")
    assert torch.allclose(logp[0, 0], first.log_softmax(-1)[0, 0], atol=1e-5)


def test_bgpo_value_and_gradient_equal_elbo_mc_with_the_same_masks():
    model = enumerable_model()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    grads = []
    for fn in (elbo_mc, bgpo):
        model.zero_grad()
        values, _ = fn(context(model, SEQS, seed=5), n=4)
        loss = -(adv[:, None] * values).sum()
        loss.backward()
        grads.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert abs(grads[0][0] - grads[1][0]) < 1e-4
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5)


def test_bgpo_bound_matches_the_elbo_objective_on_policy():
    # Per-draw ELBO terms x_j(θ); on-policy (old = θ) the linearised bound and −A·exp(mean_j d_j)
    # have the same value (−A) and gradient (−A · mean_j ∇x_j).
    theta = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    feats = torch.randn(4, 2, 3)  # (n draws, B, dim)
    adv = torch.tensor([1.5, -0.7])
    draws = (feats * theta).sum(-1)  # (n, B)
    loss_bound = bgpo_objective(draws, draws.detach(), adv)
    g_bound, = torch.autograd.grad(loss_bound, theta)
    draws = (feats * theta).sum(-1)
    ratio = torch.exp((draws - draws.detach()).mean(0))
    loss_elbo = -(adv * ratio).mean()
    g_elbo, = torch.autograd.grad(loss_elbo, theta)
    assert abs(float((loss_bound - loss_elbo).detach())) < 1e-6
    assert torch.allclose(g_bound, g_elbo, atol=1e-6)


def test_constant_logits_give_closed_forms():
    model = enumerable_model()
    torch.nn.init.zeros_(model.lm_head.weight)  # uniform over the 4 real tokens: ℓ = −log 4
    ys = SEQS
    mf, _ = mean_field(context(model, ys))
    assert torch.allclose(mf, torch.full_like(mf, -torch.log(torch.tensor(4.0))))
    draws = _draws(elbo_mc, model, ys, range(20), n=1)  # (L/m)·m·(−log 4) for every draw
    assert torch.allclose(draws, torch.full_like(draws, -3 * torch.log(torch.tensor(4.0))), atol=1e-5)


def test_spg_uses_the_elbo_for_positive_and_the_upper_bound_for_negative_advantages():
    model = enumerable_model()
    ctx = context(model, SEQS, seed=3)
    with torch.no_grad():
        lower, _ = spg(ctx, advantages=torch.ones(4), bound="mixture")
        mixed, _ = spg(ctx, advantages=-torch.ones(4), bound="mixture")
        upper, _ = spg(ctx, advantages=-torch.ones(4), bound="eubo")
    assert torch.allclose(mixed, 0.5 * lower + 0.5 * upper, atol=1e-5)
    assert not torch.allclose(upper, lower)


def test_policy_masks_are_shared_across_micro_batches_row_orders_and_calls():
    model = enumerable_model()
    prompt, pmask = PROMPT.expand(4, -1), torch.ones(4, 2, dtype=torch.long)
    for name in ("mean_field", "coupled", "elbo_mc", "spg"):
        policy = DiffusionPolicy(model, name, window="full")
        policy.begin_step(11)
        adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
        with torch.no_grad():
            full, _ = policy.token_logprobs(prompt, pmask, SEQS, advantages=adv)
            order = torch.tensor([2, 0, 3, 1])
            part, _ = policy.token_logprobs(prompt[order], pmask[order], SEQS[order], advantages=adv[order])
            assert torch.allclose(part, full[order], atol=1e-6), name
            policy.begin_step(12)
            other, _ = policy.token_logprobs(prompt, pmask, SEQS, advantages=adv)
        if name != "mean_field":  # 2-token prompt: the p = 0.15 prompt mask may draw nothing
            assert not torch.allclose(other, full), name


def test_vrpo_with_shared_masks_has_zero_variance_at_the_reference():
    model = enumerable_model()
    with torch.no_grad():
        chosen = elbo_mc(context(model, SEQS[:2], seed=1), n=1)[0].sum(-1)
        rejected = elbo_mc(context(model, SEQS[2:], seed=1), n=1)[0].sum(-1)
        ref_chosen = elbo_mc(context(model, SEQS[:2], seed=1), n=1)[0].sum(-1)  # same masks (CRN)
        ref_rejected = elbo_mc(context(model, SEQS[2:], seed=1), n=1)[0].sum(-1)
        independent = elbo_mc(context(model, SEQS[:2], seed=2), n=1)[0].sum(-1)
    loss, _ = vrpo_loss(chosen, ref_chosen, rejected, ref_rejected, beta=0.2)
    assert abs(float(loss.detach()) - float(torch.log(torch.tensor(2.0)))) < 1e-6
    noisy, _ = vrpo_loss(chosen, independent, rejected, ref_rejected, beta=0.2)
    assert abs(float(noisy) - 0.6931) > 1e-4


def test_wd1_weights_are_group_softmaxes():
    logp = torch.zeros(4, 2, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0], [-2.0, -2.0]])
    loss, _ = wd1(logp, logp.detach(), adv, torch.ones(4, 2), group_size=2, wd1_psi=1.0)
    loss.sum().backward()
    e = torch.e
    w_pos, w_neg = e / (e + 1), 1 / (e + 1)  # group 1: A = (1, 0)
    assert abs(float(logp.grad[0, 0]) - (-w_pos + w_neg)) < 1e-6
    assert abs(float(logp.grad[1, 0]) - (-w_neg + w_pos)) < 1e-6


def test_every_estimator_returns_the_finite_denoiser_entropy_at_the_positions_it_scores():
    # The mask id's logit is -inf; its 0 · log 0 term must count as 0, not NaN (actor/entropy was
    # NaN for every dLLM run). Checked against a hand computation for mean_field (all masked).
    model = enumerable_model()
    prompt, pmask = PROMPT.expand(4, -1), torch.ones(4, 2, dtype=torch.long)
    with torch.no_grad():
        logits = model(torch.cat([prompt, torch.full((4, 3), MASK)], 1))[:, 2:]
    logits[..., MASK] = float("-inf")
    probs = logits.softmax(-1)[..., :MASK]
    by_hand = -(probs * probs.log()).sum(-1)
    for name in ("mean_field", "coupled", "elbo_mc", "bgpo", "spg", "ar_order", "trace"):
        policy = DiffusionPolicy(model, name, window="full", **({"p_mask_prompt": 0.0} if name == "mean_field" else {}))
        extra = {"trace": torch.tensor([[0, 1, 2]]).expand(4, -1)} if name == "trace" else {}
        values, entropy = policy.token_logprobs(prompt, pmask, SEQS, with_entropy=True, advantages=torch.ones(4),
                                                **extra)
        assert entropy is not None and bool(torch.isfinite(entropy).all()), name
        assert bool((entropy > 0).all()) and bool((entropy <= torch.log(torch.tensor(4.0)) + 1e-5).all()), name
        if name == "mean_field":
            assert torch.allclose(entropy, by_hand, atol=1e-5)
        if name in ("ar_order", "trace"):  # position 0 is predicted with everything masked in both
            assert torch.allclose(entropy[:, 0], by_hand[:, 0], atol=1e-5), name
