"""BGPO's own objective: a hand vector, the recipe's loss against `bgpo_objective`, memory flat in n."""

import math

import pytest
import torch
from _tiny import PROMPT, enumerable_model
from test_memory import _Meter

from rlvr.algos.dllm_objectives import bgpo_objective, bgpo_surrogate
from rlvr.batch import TrainBatch
from rlvr.builder.build import build_advantage, build_loss, build_policy
from rlvr.builder.plans import passes
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.diffusion_lm import DiffusionConfig, tiny_diffusion_lm
from rlvr.models.likelihood import _elbo_draw_value
from rlvr.trainer.logit_stats import old_pass
from rlvr.trainer.step import micro_batch_loss

RECIPE = "recipes/dllm_bgpo_countdown.yaml"
SEQS = torch.tensor([[0, 1, 2], [1, 1, 3], [2, 0, 1], [3, 3, 3]])


def test_bgpo_surrogate_hand_vector():
    draws = torch.tensor([[-1.0, -1.2], [-0.5, -0.9]])  # (B = 2, n = 2)
    old = torch.tensor([[-1.1, -1.0], [-0.8, -0.6]])
    adv = torch.tensor([1.0, -2.0])
    value, metrics = bgpo_surrogate(draws, old, adv, clip_low=0.2, clip_high=0.2)
    # row 0, A = 1: d = (0.1, -0.2), r = 1 + d = (1.1, 0.8), inside [0.8, 1.2]: R = (1.1 + 0.8)/2 = 0.95
    # row 1, A = -2: d = (0.3, -0.3), r = e^d = (1.34986, 0.74082), clipped (1.2, 0.8);
    #   min(rA, clip(r)A) = (min(-2.69972, -2.4), min(-1.48164, -1.6)) = (-2.69972, -1.6): R = -2.14986
    r1 = math.exp(0.3)
    expected = torch.tensor([0.95, (-2 * r1 - 1.6) / 2])
    assert torch.allclose(value, expected, atol=1e-5)
    assert torch.allclose(metrics["clip_frac_low"], torch.tensor([0.0, 0.5]))  # e^-0.3 < 0.8, A < 0
    assert torch.allclose(metrics["ratio"], torch.tensor([0.95, (r1 + math.exp(-0.3)) / 2]), atol=1e-5)
    loss = bgpo_objective(draws.T, old.T, adv, clip_low=0.2, clip_high=0.2)  # (n, B) as the paper indexes
    assert abs(float(loss) - float(-expected.mean())) < 1e-6


def _recipe(*overrides):
    return load_config(RECIPE, list(overrides) or ["estimator.n=3"])


def _batch(ys, adv):
    prompt = PROMPT.expand(ys.shape[0], -1)
    mask = torch.ones_like(ys, dtype=torch.float32)
    return TrainBatch(prompt, torch.ones_like(prompt), ys, mask, advantages=adv[:, None] * mask)


def _perturb(model, seed=1, scale=0.05):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def test_the_recipe_trains_with_bgpo_objective_off_policy_too():
    config = _recipe()
    assert config.algo.objective == "bgpo" and config.estimator.name == "bgpo"
    assert load_config("recipes/dllm_bgpo_sudoku.yaml").algo.objective == "bgpo"
    spec = build_loss(config)
    model = enumerable_model()
    policy = build_policy(config, model)
    policy.begin_step(11)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    batch = _batch(SEQS, adv)
    # the old-policy pass the loop runs before a multi-update step also keeps the per-draw estimates
    advantage = build_advantage(config)
    batch.old_logp, _ = old_pass(policy, batch, advantage, passes(spec, advantage), 4, None, needed=True)
    old_draws = batch.old_draws.clone()
    assert old_draws.shape == (4, 3)
    _perturb(model)  # the second update: the policy has moved, d_j != 0
    loss, _ = micro_batch_loss(policy, batch, spec, num_tokens=float(batch.completion_mask.sum()), num_seqs=4.0)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    # the same draws with plain autograd (all graphs kept), into the paper's scalar formula
    ctx = policy.corruption_context(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, None)
    draws = torch.stack([_elbo_draw_value(ctx, j, 3, False, False)[0] / ctx.lengths for j in range(3)], -1)  # (B, n)
    direct = bgpo_objective(draws.T, old_draws.T, adv, clip_low=config.algo.clip_low or 0.2,
                                clip_high=config.algo.clip_high or 0.2)
    direct.backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert abs(float(loss.detach()) - float(direct.detach())) < 1e-5
    assert torch.allclose(grad, want, atol=1e-5)
    # and it is not the ELBO-ratio objective off-policy: exp(mean d) against the bound
    ratio = torch.exp((draws.detach() - old_draws).mean(-1))
    assert abs(float(loss.detach()) - float(-(adv * ratio.clamp(0.8, 1.2)).mean())) > 1e-5


def test_bgpo_objective_needs_the_bgpo_estimator():
    with pytest.raises(ConfigError, match="algo.objective"):
        _recipe("estimator.name=elbo_mc")


def _update_peak_and_forwards(n: int) -> tuple[int, int]:
    """Peak bytes held for backward and model forwards of one update step with the recipe's loss."""
    config = _recipe(f"estimator.n={n}")
    model = tiny_diffusion_lm(DiffusionConfig(vocab_size=40, mask_token_id=39, eos_token_id=2, pad_token_id=0,
                                              hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0)
    policy = build_policy(config, model)
    gen = torch.Generator().manual_seed(0)
    prompt, ys = torch.randint(3, 39, (4, 6), generator=gen), torch.randint(3, 39, (4, 16), generator=gen)
    mask = torch.ones_like(ys, dtype=torch.float32)
    adv = torch.tensor([1.0, -1, 0.5, -0.5])[:, None] * mask
    batch = TrainBatch(prompt, torch.ones_like(prompt), ys, mask, advantages=adv)
    meter, before = _Meter(), policy.forwards
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        loss, _ = micro_batch_loss(policy, batch, build_loss(config), num_tokens=64.0, num_seqs=4.0)
        loss.backward()
    return meter.peak, policy.forwards - before


def test_the_update_with_bgpo_objective_holds_one_draw_graph_whatever_n():
    got = {n: _update_peak_and_forwards(n) for n in (1, 4, 16)}
    print("bgpo objective: (peak saved bytes, forwards) by n", got)
    assert got[16][0] <= 1.05 * got[1][0]  # flat in n
    # forwards: n without graph, n recomputed in the backward, 2 for the entropy metric
    assert [got[n][1] for n in (1, 4, 16)] == [2 * 1 + 2, 2 * 4 + 2, 2 * 16 + 2]
