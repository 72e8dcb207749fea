"""Partial rollouts in the own sampler: weights swapped between chunks of tokens, the cache
recomputed under the new weights, each token's version and behaviour log-prob recorded."""

from __future__ import annotations

import copy

import torch
from _teacher_forced import teacher_forced

from rlvr.engines.torch_ar import Swaps, generate
from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer

EOS, PAD = 2, 0


def _models():
    tokenizer = char_tokenizer()
    old = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     max_seq_len=64, seed=0)
    new = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     max_seq_len=64, seed=1)
    prompt = torch.randint(3, len(tokenizer), (4, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0  # one left-padded prompt
    return old, new, prompt, mask


def _sample(model, prompt, mask, swaps=None, max_new_tokens=20):
    return generate(model, prompt, mask, torch.arange(4), max_new_tokens=max_new_tokens, eos_id=EOS, pad_id=PAD,
                    temperature=1.0, swaps=swaps)


def test_no_swap_is_the_plain_sampler_bit_for_bit():
    old, _, prompt, mask = _models()
    plain = _sample(old, prompt, mask)
    chunked = _sample(old, prompt, mask, Swaps(lambda: 3, every=4))
    assert torch.equal(plain.completion_ids, chunked.completion_ids)
    assert torch.equal(plain.logprobs, chunked.logprobs)
    assert plain.versions is None
    assert torch.equal(chunked.versions, torch.where(chunked.completion_mask > 0, 3, -1))


def test_a_swap_mid_generation_records_each_tokens_version_and_logprob():
    old, new, prompt, mask = _models()
    live = copy.deepcopy(old)
    polls = []

    def poll() -> int:  # the learner publishes version 8 after the first chunk of 6 tokens
        polls.append(1)
        if len(polls) == 2:
            live.load_state_dict(new.state_dict())
        return 7 if len(polls) < 2 else 8

    out = _sample(live, prompt, mask, Swaps(poll, every=6))
    first = _sample(old, prompt, mask, max_new_tokens=6)
    valid = out.completion_mask > 0
    assert (out.lengths > 6).any(), "the test needs completions that cross the swap"
    # tokens before the swap are the old weights' samples; the versions split at token 6
    sampled = first.completion_mask > 0
    assert torch.equal(out.completion_ids[:, :6][sampled], first.completion_ids[sampled])
    expected = torch.where(torch.arange(out.completion_ids.shape[1]) < 6, 7, 8).expand_as(valid)
    assert torch.equal(out.versions, torch.where(valid, expected, -1))
    # each token's behaviour log-prob is its own version's on the whole prefix (cache recomputed)
    under_old, under_new = teacher_forced(old, out), teacher_forced(new, out)
    want = torch.where(out.versions == 7, under_old, under_new) * valid
    assert torch.allclose(out.logprobs, want, atol=1e-5)
    assert not torch.allclose(under_old[:, 6:] * valid[:, 6:], under_new[:, 6:] * valid[:, 6:], atol=1e-2)
