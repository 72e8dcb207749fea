"""ERILS on a masked-diffusion model: external rows are length-controlled to the window, scored
by the policy's own likelihood estimator, and carry the gradient of the external term; the
combinations without the inputs they need are refused."""

import pytest
import torch

from rlvr.algos.aggregate import AGGREGATIONS
from rlvr.algos.hybrid import sft
from rlvr.algos.objectives import ppo_clip
from rlvr.batch import TrainBatch
from rlvr.codec import encode_prompts
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.models.diffusion_lm import load_diffusion_lm
from rlvr.models.diffusion_policy import DiffusionPolicy
from rlvr.trainer.expert import Canvas, canvas_part, extend, external_advantages
from rlvr.trainer.step import LossSpec, micro_batch_loss

GEN = 8
ONPOLICY = ["3 5 2>13:", "1 2>3:", "9 9 9>729:", "4 4>16:"]
EXTERNAL = [("7 2>14:", "7*2"), ("8 1 3>12:", "8+1+3"), ("6 6 6>216:", "6*6*6*6*6/6")]


class _Ex:
    def __init__(self, prompt):
        self.prompt = prompt


@pytest.fixture(scope="module")
def setup():
    return load_diffusion_lm(None, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _onpolicy(tok, policy):
    """Sampler-shaped on-policy rows (the whole window, EOS-padded) with zero advantages: their
    objective contributes no gradient, so any gradient comes from the external rows."""
    ids, mask = encode_prompts(tok, ONPOLICY)
    body = torch.randint(3, 10, (len(ONPOLICY), GEN), generator=torch.Generator().manual_seed(0))
    completion = torch.where(torch.arange(GEN) < 5, body, torch.full_like(body, tok.eos_token_id))
    ones = torch.ones(len(ONPOLICY), GEN)
    zeros = torch.zeros_like(ones)
    batch = TrainBatch(ids, mask, completion, ones, advantages=zeros, rollout_logp=zeros.clone())
    batch.old_logp = policy.batch_logprobs(batch)[0].detach()
    return batch


def _grad(policy, batch, spec):
    policy.model.zero_grad()
    loss, _ = micro_batch_loss(policy, batch, spec, num_tokens=float(batch.completion_mask.sum()),
                               num_seqs=float(len(batch)))
    loss.backward()
    return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])


def test_external_rows_fit_the_window_or_are_dropped(setup):
    _, tok = setup
    part, kept = canvas_part(tok, [_Ex(p) for p, _ in EXTERNAL], [s for _, s in EXTERNAL], Canvas(GEN, "eos"))
    assert kept == [True, True, False]  # "6*6*6*6*6/6" + EOS is 12 tokens, over the 8-token window
    assert part.completion_ids.shape == (2, GEN)
    lengths = [len(tok(text, add_special_tokens=False).input_ids) for text in ("7*2", "8+1+3")]
    for row, n in zip(part.completion_ids, lengths):
        assert (row[n:] == tok.eos_token_id).all() and (row[:n] != tok.eos_token_id).all()
    assert part.completion_mask.sum(-1).tolist() == [n + 1.0 for n in lengths]  # solution + its first EOS
    full, _ = canvas_part(tok, [_Ex(p) for p, _ in EXTERNAL], [s for _, s in EXTERNAL], Canvas(GEN, "full"))
    assert full.completion_mask.sum().item() == 2 * GEN  # `full` scores the EOS padding as the SFT trained it


@pytest.mark.parametrize("estimator, options", [("mean_field", {"p_mask_prompt": 0.15}), ("elbo_mc", {"n": 2})])
def test_external_rows_get_the_gradient_of_their_likelihood_under_the_estimator(setup, estimator, options):
    model, tok = setup
    policy = DiffusionPolicy(model, estimator, window="full", **options)
    policy.begin_step(7)
    batch = _onpolicy(tok, policy)
    part, _ = canvas_part(tok, [_Ex(p) for p, _ in EXTERNAL[:2]], [s for _, s in EXTERNAL[:2]], Canvas(GEN, "full"))
    mu = 0.5
    merged = extend(batch, part, onpolicy_rewards=torch.tensor([0.0, 1.0, 0.0, 0.0]), expert_rewards=torch.ones(2),
                    mu=mu, keep_onpolicy=False, token_units=False, pad_id=tok.pad_token_id,
                    logprobs=lambda kind, rows, stats: {"logp": policy.batch_logprobs(rows)[0].detach()},
                    advantage="source", group_size=2)
    assert merged.expert.tolist() == [False] * 4 + [True] * 2
    assert merged.advantages[4:].abs().sum() == 0  # an oracle's rewards do not vary: source advantage 0
    spec = LossSpec(objective=ppo_clip, aggregation=AGGREGATIONS["seq_mean_token_mean"], kl_estimator=None,
                    entropy_coef=0.0, expert=sft)
    got = _grad(policy, merged, spec)
    assert got.norm() > 0
    # the same gradient as μ · mean over the external rows of −(token mean of the estimator's
    # log-likelihood), computed on those rows alone (same masks: keyed by the rows' own tokens)
    model.zero_grad()
    logp, _ = policy.batch_logprobs(part)
    (mu * (-logp).mean(-1).mean()).backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert (got - want).norm() / want.norm() < 1e-4


def test_source_advantages_ignore_the_on_policy_rewards_and_batch_ones_do_not():
    onpolicy, external = torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0])
    source = external_advantages("source", external, onpolicy, group_size=2)
    # external rows alone: mean 2/3, std sqrt(1/3) -> (1/3)/sqrt(1/3), -(2/3)/sqrt(1/3)
    s = (1 / 3) ** 0.5
    assert torch.allclose(source, torch.tensor([1 / 3 / s, -2 / 3 / s, 1 / 3 / s]), atol=1e-5)
    assert torch.allclose(external_advantages("source", external, torch.ones(4), group_size=2), source)
    batch = external_advantages("batch", external, onpolicy, group_size=2)
    assert not torch.allclose(batch, source)  # joint: standardised against the 7 rewards together
    with pytest.raises(ValueError, match="expert.advantage"):
        external_advantages("joint", external, onpolicy, group_size=2)


@pytest.mark.parametrize("name", ["trace", "bgpo"])
def test_external_rows_with_an_estimator_they_cannot_feed_are_refused(name):
    with pytest.raises(ConfigError, match=r"^expert\.per_step: .*estimator\.name=" + name):
        load_config("recipes/dllm_erils_countdown.yaml", [f"estimator.name={name}", "estimator.p_mask_prompt=null"])


@pytest.mark.parametrize("task", ["countdown", "sudoku"])
def test_erils_recipes_add_length_controlled_external_rows_to_a_diffusion_run(task):
    c = load_config(f"recipes/dllm_erils_{task}.yaml")
    assert (c.model.kind, c.expert.advantage, c.expert.objective) == ("diffusion", "source", "sft")
    assert c.expert.per_step > 0
