import pytest
import torch

from rlvr.codec import encode_prompts
from rlvr.engines.torch_diffusion import generate_diffusion, transfer_schedule
from rlvr.models.diffusion_lm import load_diffusion_lm
from rlvr.models.diffusion_policy import DiffusionPolicy

PROMPTS = ["3 5 2>13:", "1 2>3:", "9 9 9>729:", "4 4>16:"]


@pytest.fixture(scope="module")
def setup():
    model, tok = load_diffusion_lm(None, seed=0, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    ids, mask = encode_prompts(tok, PROMPTS)
    return model, tok, ids, mask


def _gen(setup, seeds, rows=slice(None), **kw):
    model, tok, ids, mask = setup
    settings = dict(gen_length=8, steps=4, block_length=4, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id)
    return generate_diffusion(model, ids[rows], mask[rows], torch.tensor(seeds), **{**settings, **kw})


@pytest.mark.parametrize("kw", [{}, {"remasking": "random"}, {"remasking": "entropy"}, {"remasking": "margin"},
                                {"threshold": 0.05, "steps": 0}])
def test_seeded_per_sample_whatever_the_batch(setup, kw):
    full = _gen(setup, [1, 2, 3, 4], **kw)
    again = _gen(setup, [1, 2, 3, 4], **kw)
    assert torch.equal(full.completion_ids, again.completion_ids) and torch.equal(full.trace, again.trace)
    alone = _gen(setup, [3], rows=slice(2, 3), **kw)
    assert torch.equal(alone.completion_ids[0], full.completion_ids[2])
    assert torch.equal(alone.trace[0], full.trace[2])
    other = _gen(setup, [5, 6, 7, 8], **kw)
    assert not torch.equal(other.completion_ids, full.completion_ids)


def test_trace_follows_the_schedule_and_blocks(setup):
    _, tok, ids, _ = setup
    out = _gen(setup, [1, 2, 3, 4], gen_length=12, steps=6, block_length=4)
    assert torch.equal(out.prompt_ids, ids)
    assert not bool((out.completion_ids == tok.mask_token_id).any())
    assert transfer_schedule(4, 2) == [2, 2] and transfer_schedule(5, 3) == [2, 2, 1]
    for row in out.trace:
        counts = torch.bincount(row, minlength=6).tolist()
        assert counts == [2] * 6  # 4 tokens over 2 steps per block
        blocks = row.view(3, 4)
        assert bool((blocks[1].min() > blocks[0].max()) and (blocks[2].min() > blocks[1].max()))
    assert out.forwards == 6


def test_threshold_commits_at_least_one_per_step(setup):
    out = _gen(setup, [1, 2, 3, 4], threshold=0.99, steps=0)
    for row in out.trace:
        assert sorted(row.tolist()) == list(range(8))  # nothing reaches 0.99 on a random model: 1/step


class _EosLover(torch.nn.Module):
    """Wraps a model and raises the EOS logit everywhere (the EOS trap, on purpose)."""

    def __init__(self, model, eos):
        super().__init__()
        self.model, self.eos = model, eos

    def forward(self, *args):
        logits = self.model(*args).clone()
        logits[..., self.eos] += 3.0
        return logits


def test_eos_suppression_commits_eos_last(setup):
    model, tok, ids, mask = setup
    eager = (_EosLover(model, tok.eos_token_id), tok, ids, mask)
    plain = _gen(eager, [1, 2, 3, 4], temperature=0.0, gen_length=8, steps=8, block_length=8)
    fixed = _gen(eager, [1, 2, 3, 4], temperature=0.0, gen_length=8, steps=8, block_length=8, suppress_eos=True)
    eos = tok.eos_token_id
    assert bool((plain.completion_ids == eos).any())
    for ids_row, trace_row in zip(fixed.completion_ids, fixed.trace):
        is_eos = ids_row == eos
        if is_eos.any() and (~is_eos).any():
            assert trace_row[is_eos].min() > trace_row[~is_eos].max()


def test_trace_and_ar_order_estimators_replay_the_sampler_exactly(setup):
    model, tok, ids, mask = setup
    policy = DiffusionPolicy(model, "trace", window="full")
    out = generate_diffusion(model, ids, mask, torch.tensor([1, 2, 3, 4]), gen_length=8, steps=8, block_length=4,
                             mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, window="full")
    with torch.no_grad():
        logp, _ = policy.token_logprobs(ids, mask, out.completion_ids, trace=out.trace)
    assert torch.allclose(logp, out.logprobs, atol=1e-5)
    # JustGRPO rollouts (block 1, N = L) are left to right, and ar_order gives their log-probs.
    ar = generate_diffusion(model, ids, mask, torch.tensor([1, 2, 3, 4]), gen_length=6, steps=6, block_length=1,
                            mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, window="full")
    assert bool((ar.trace == torch.arange(6)).all())
    with torch.no_grad():
        ar_logp, _ = DiffusionPolicy(model, "ar_order", window="full").token_logprobs(ids, mask, ar.completion_ids)
    assert torch.allclose(ar_logp, ar.logprobs, atol=1e-5)


def test_window_mask_stops_at_the_first_eos(setup):
    _, tok, _, _ = setup
    from rlvr.models.likelihood import window_mask
    eos = tok.eos_token_id
    ids = torch.tensor([[5, eos, 7, eos], [5, 6, 7, 8]])
    assert window_mask(ids, eos).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert window_mask(ids, eos, "full").tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("kw", [{}, {"threshold": 0.05, "steps": 0}])
def test_per_row_temperatures(setup, kw):
    """A (B,) temperature: rows at T sample exactly as with the scalar T, rows at 0 as greedy."""
    seeds = [1, 2, 3, 4]
    sampled, greedy = _gen(setup, seeds, temperature=0.7, **kw), _gen(setup, seeds, temperature=0.0, **kw)
    mixed = _gen(setup, seeds, temperature=torch.tensor([0.7, 0.0, 0.7, 0.0]), **kw)
    for row, ref in ((0, sampled), (1, greedy), (2, sampled), (3, greedy)):
        assert torch.equal(mixed.completion_ids[row], ref.completion_ids[row])
        assert torch.equal(mixed.trace[row], ref.trace[row])
        assert torch.equal(mixed.logprobs[row], ref.logprobs[row])
    assert not torch.equal(sampled.completion_ids, greedy.completion_ids)  # the two settings differ here
