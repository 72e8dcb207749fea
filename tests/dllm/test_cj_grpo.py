"""CJ-GRPO: the ascending step schedule and EOS early rejection as vectors, the sampler under them, the
trace estimator replaying such rollouts exactly, and the per-step mean aggregation by hand."""

import math

import pytest
import torch

from rlvr.algos.aggregate import get_aggregation, seq_mean_token_mean, step_mean
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.engines.torch_diffusion import (
    ascending_schedule,
    block_schedule,
    commit_step,
    eoser_scale,
    generate_diffusion,
)
from rlvr.errors import ConfigError
from rlvr.models.diffusion_lm import load_diffusion_lm
from rlvr.models.diffusion_policy import DiffusionPolicy

RECIPE = "recipes/dllm_cj_grpo_countdown.yaml"


@pytest.fixture(scope="module")
def setup():
    model, tok = load_diffusion_lm(None, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    ids, mask = encode_prompts(tok, ["3 5 2>13:", "1 2>3:", "9 9 9>729:", "4 4>16:"])
    return model, tok, ids, mask


def test_ascending_step_sizes_double_and_the_last_step_takes_the_rest():
    assert ascending_schedule(16, 4) == [1, 2, 4, 9]  # the Countdown recipe's single block
    assert ascending_schedule(8, 3) == [1, 2, 5]  # the Sudoku recipe's 8-token blocks
    assert ascending_schedule(24, 4) == [1, 2, 4, 17]
    assert ascending_schedule(5, 1) == [5]
    assert block_schedule("even", 8, 3) == [3, 3, 2] and block_schedule("ascending", 8, 3) == [1, 2, 5]
    with pytest.raises(ValueError, match="at most 3 steps, not 4"):
        ascending_schedule(8, 4)
    with pytest.raises(ValueError, match="step_schedule"):
        block_schedule("descending", 8, 3)


def test_eoser_factor_rises_from_gamma_to_one():
    # ascending, k = 4: t = (2^(s+1) - 1) / 16 = 1/16, 3/16, 7/16, 15/16; factor 0.01 + 0.99 t
    ascending = [eoser_scale(0.01, s, 4, "ascending") for s in range(4)]
    assert ascending == pytest.approx([0.0718750, 0.1956250, 0.4431250, 0.9381250])
    even = [eoser_scale(0.4, s, 3, "even") for s in range(3)]  # t = s / (k - 1) = 0, 1/2, 1
    assert even == pytest.approx([0.4, 0.7, 1.0])
    assert eoser_scale(None, 0, 4, "ascending") == 1.0 and eoser_scale(0.5, 0, 1, "even") == 1.0


def _step(eos_scale: float):
    """One greedy commit of 2 of a block's 3 positions; vocabulary 0-2, EOS = 3, mask = 4."""
    probs = torch.tensor([[[0.05, 0.05, 0.0, 0.9, 0.0],  # EOS at 0.9: the most confident candidate
                           [0.6, 0.2, 0.2, 0.0, 0.0],  # token 0 at 0.6
                           [0.1, 0.5, 0.2, 0.2, 0.0]]], dtype=torch.float64)  # token 1 at 0.5
    block = torch.full((1, 3), 4)
    ids, commit, logp, _ = commit_step(probs.log(), block, torch.tensor([0]), torch.tensor([0]), temperature=0.0,
                                       remasking="low_confidence", threshold=None, quota=2, suppress_eos=False,
                                       mask_id=4, eos_id=3, eos_scale=eos_scale)
    return ids[0].tolist(), commit[0].tolist(), logp[0]


def test_eoser_defers_a_confident_eos_early_and_not_late():
    assert _step(1.0)[:2] == ([3, 0, 4], [True, True, False])  # plain: EOS is committed first
    # step 0 of 4 ascending: EOS score 0.9 x 0.071875 = 0.0647 < 0.5: the two content tokens go first
    early = _step(eoser_scale(0.01, 0, 4, "ascending"))
    assert early[:2] == ([4, 0, 1], [False, True, True])
    # step 3: 0.9 x 0.938125 = 0.844 > 0.6: EOS is committed again
    assert _step(eoser_scale(0.01, 3, 4, "ascending"))[:2] == ([3, 0, 4], [True, True, False])
    # the committed tokens' behaviour log-probs are the model's, whatever the ranking
    assert early[2][1:].tolist() == pytest.approx([math.log(0.6), math.log(0.5)])


def _gen(setup, **kw):
    model, tok, ids, mask = setup
    return generate_diffusion(model, ids, mask, torch.tensor([1, 2, 3, 4]), mask_id=tok.mask_token_id,
                              eos_id=tok.eos_token_id, window="full", step_schedule="ascending", **kw)


def test_sampler_commits_the_ascending_counts_per_step(setup):
    one_block = _gen(setup, gen_length=16, steps=4, block_length=16, eoser_gamma=0.01)
    assert one_block.forwards == 4
    for row in one_block.trace:
        assert torch.bincount(row, minlength=4).tolist() == [1, 2, 4, 9]
    two_blocks = _gen(setup, gen_length=16, steps=6, block_length=8)
    assert two_blocks.forwards == 6
    for row in two_blocks.trace:
        assert torch.bincount(row, minlength=6).tolist() == [1, 2, 5, 1, 2, 5]


def test_trace_estimator_replays_ascending_eoser_rollouts_exactly(setup):
    model, tok, ids, mask = setup
    out = _gen(setup, gen_length=8, steps=3, block_length=8, eoser_gamma=0.01)
    with torch.no_grad():
        logp, _ = DiffusionPolicy(model, "trace", window="full").token_logprobs(ids, mask, out.completion_ids,
                                                                                trace=out.trace)
    assert torch.allclose(logp, out.logprobs, atol=1e-5)  # optimisation trajectory = rollout trajectory


def test_step_mean_hand_vector():
    loss = torch.tensor([[1.0, 2.0, 4.0, 8.0], [2.0, 4.0, 6.0, 10.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    trace = torch.tensor([[0, 1, 1, 2], [-1, 0, 1, 2]])  # -1: inpainted, never sampled
    # row 0: step means 1, (2 + 4)/2 = 3, 8 -> 4; row 1: step 0: 4, step 1: 6 (step 2 is padding) -> 5
    value = step_mean(loss, mask, trace=trace, num_seqs=2)
    assert float(value) == pytest.approx(4.5)
    assert float(seq_mean_token_mean(loss, mask, num_seqs=2)) == pytest.approx((15 / 4 + 12 / 3) / 2)
    halves = sum(float(step_mean(loss[i:i + 1], mask[i:i + 1], trace=trace[i:i + 1], num_seqs=2)) for i in (0, 1))
    assert halves == pytest.approx(4.5)  # micro-batches add up to the step's value
    assert get_aggregation("step_mean") is step_mean
    with pytest.raises(ValueError, match="commit steps"):
        step_mean(loss, mask, num_seqs=2)


def test_step_mean_is_cj_grpos_batch_step_mean_when_steps_commit_alike():
    loss = torch.tensor([[0.5, -1.0, 3.0, 2.0], [1.5, 0.0, -2.0, 4.0], [2.0, 2.0, 1.0, -1.0]], requires_grad=True)
    trace = torch.tensor([[0, 1, 1, 2], [2, 1, 0, 1], [1, 0, 2, 1]])  # 1, 2, 1 tokens per step in every row
    mask = torch.ones_like(loss)
    ours = step_mean(loss, mask, trace=trace, num_seqs=3)
    # the released code: Σ_s (1/S) Σ_{i, t committed at s} ℓ / |U_s| over the whole batch
    theirs = sum((loss * (trace == s)).sum() / (trace == s).sum() / 3 for s in range(3))
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()))
    (g_ours,) = torch.autograd.grad(ours, loss)
    assert torch.allclose(g_ours, torch.where(trace == 1, 1 / 18, 1 / 9))  # 1/(N S |U_is|)


@pytest.mark.parametrize("override, field", [
    (["rollout.threshold=0.9"], "rollout.threshold"),
    (["rollout.diffusion_steps=5"], "rollout.diffusion_steps"),
    (["rollout.remasking=margin"], "rollout.eoser_gamma"),
    (["rollout.eoser_gamma=0"], "rollout.eoser_gamma"),
    (["rollout.step_schedule=fastest"], "rollout.step_schedule"),
])
def test_bad_schedule_settings_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(RECIPE, override)


def test_recipe_uses_the_scheduler_and_the_step_mean():
    c = load_config(RECIPE)
    assert (c.rollout.step_schedule, c.rollout.eoser_gamma, c.algo.aggregation, c.estimator.name) == (
        "ascending", 0.01, "step_mean", "trace")
