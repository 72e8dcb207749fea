import torch

from rlvr.codec import encode_prompts
from rlvr.engines.torch_ar import generate, top_p_filter
from rlvr.models.policy import CausalPolicy
from rlvr.noise import uniform_noise

PROMPTS = ["3 5 2>13:", "1 2 3>6:", "9 9 9>729:", "4 4>16:"]


def _generate(model, tokenizer, prompts, seeds, **kw):
    ids, mask = encode_prompts(tokenizer, prompts)
    return generate(model, ids, mask, torch.tensor(seeds), max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                    pad_id=tokenizer.pad_token_id, **kw)


def test_same_seed_same_completion_whatever_the_batch(tiny_model, tokenizer):
    full = _generate(tiny_model, tokenizer, PROMPTS, [11, 12, 13, 14])
    again = _generate(tiny_model, tokenizer, PROMPTS, [11, 12, 13, 14])
    assert torch.equal(full.completion_ids, again.completion_ids)
    # The third prompt alone, with its seed, gives the same tokens as inside the batch.
    alone = _generate(tiny_model, tokenizer, PROMPTS[2:3], [13])
    n = int(alone.lengths[0])
    assert torch.equal(alone.completion_ids[0, :n], full.completion_ids[2, :n])
    other = _generate(tiny_model, tokenizer, PROMPTS, [21, 22, 23, 24])
    assert not torch.equal(other.completion_ids, full.completion_ids)


def test_behaviour_logprobs_match_the_trainer(tiny_model, tokenizer):
    out = _generate(tiny_model, tokenizer, PROMPTS, [1, 2, 3, 4], temperature=0.7)
    policy = CausalPolicy(tiny_model, temperature=0.7)
    with torch.no_grad():
        logp, _ = policy.token_logprobs(out.prompt_ids, out.prompt_mask, out.completion_ids)
    mask = out.completion_mask
    assert torch.allclose(logp * mask, out.logprobs * mask, atol=1e-5)


def test_completion_mask_stops_after_eos(tiny_model, tokenizer):
    out = _generate(tiny_model, tokenizer, PROMPTS * 8, list(range(32)))
    for row in range(32):
        n = int(out.lengths[row])
        ids = out.completion_ids[row].tolist()
        if not out.truncated[row]:
            assert ids[n - 1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in ids[: n - 1]
        assert all(t == tokenizer.pad_token_id for t in ids[n:])


def test_gumbel_sampling_matches_softmax_frequencies():
    # 20k draws of one categorical: empirical frequencies within 3 sigma of the probabilities.
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    u = uniform_noise(torch.arange(20_000), step=0, width=4)
    picks = (probs.log().double() - torch.log(-torch.log(u))).argmax(-1)
    freq = torch.bincount(picks, minlength=4).double() / 20_000
    sigma = (probs.double() * (1 - probs.double()) / 20_000).sqrt()
    assert ((freq - probs.double()).abs() < 3 * sigma + 1e-4).all()


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).log_softmax(-1)  # probs ~ .64 .24 .09 .03
    kept = torch.isfinite(top_p_filter(logits, 0.8))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[True, False, False, False]]
