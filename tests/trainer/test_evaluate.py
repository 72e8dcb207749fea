"""Decoding rollouts into the answer text the verifier sees."""

import torch

from rlvr.models.tokenizer import char_tokenizer
from rlvr.rollout.torch_ar import Rollouts
from rlvr.trainer.evaluate import decode_completions


def _rollouts(rows, lengths):
    ids = torch.tensor(rows)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).float()
    empty = torch.zeros(len(rows), 1, dtype=torch.long)
    return Rollouts(empty, empty, ids, mask, torch.zeros_like(mask), torch.zeros(len(rows), dtype=torch.bool))


def test_answer_ends_at_the_first_eos_even_when_the_window_goes_on():
    tok = char_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    enc = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    full_window = enc("3+5") + [eos] + enc("7") + [eos]      # diffusion `full`: post-EOS token committed
    causal = enc("3*5") + [eos] + [pad] * 2                   # autoregressive: length stops at the EOS
    truncated = enc("1+2+3+")                                 # no EOS at all
    got = decode_completions(tok, _rollouts([full_window, causal, truncated], [6, 4, 6]))
    assert got == ["3+5", "3*5", "1+2+3+"]
