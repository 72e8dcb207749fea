"""Model loading: fresh tiny config, a local Hugging Face directory, the character tokenizer."""

import pytest
import torch
from transformers import AutoTokenizer

from rlvr.errors import ConfigError
from rlvr.models.causal_lm import load_causal_lm
from rlvr.models.policy import CausalPolicy, head_outputs
from rlvr.models.tokenizer import char_tokenizer

SIZE = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_seq_len=64)


def test_char_tokenizer_round_trips_and_reloads(tmp_path):
    tok = char_tokenizer()
    text = "3 5 2>13:(3+5)*2\nx = y"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text, add_special_tokens=False).input_ids == ids
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id) == (0, 1, 2)


def test_local_directory_loads_the_same_model(tmp_path):
    model, tok = load_causal_lm(None, seed=3, **SIZE)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = load_causal_lm(str(tmp_path), seed=0, **SIZE)
    ids = torch.tensor([tok("1 2 3>6:1+2+3", add_special_tokens=False).input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert tok2.padding_side == "left"


def test_fresh_model_is_deterministic_in_seed():
    a, _ = load_causal_lm(None, seed=1, **SIZE)
    b, _ = load_causal_lm(None, seed=1, **SIZE)
    c, _ = load_causal_lm(None, seed=2, **SIZE)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="model.path"):
        load_causal_lm(str(tmp_path / "absent"), seed=0, **SIZE)


def test_packaged_warm_start_loads():
    model, tok = load_causal_lm("rlvr:countdown-warmstart", seed=0, **SIZE)
    assert tok.eos_token_id == 2 and sum(p.numel() for p in model.parameters()) > 0


def test_chunked_logprobs_equal_log_softmax():
    logits = torch.randn(3, 5, 50, dtype=torch.float64)
    tokens = torch.randint(0, 50, (3, 5))
    expected = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.allclose(head_outputs(logits, tokens, chunk_size=7)[0], expected, atol=1e-12)
    assert torch.allclose(head_outputs(logits, tokens)[0], expected, atol=1e-12)


def test_policy_logprobs_are_left_padding_invariant():
    model, tok = load_causal_lm(None, seed=0, **SIZE)
    policy = CausalPolicy(model)
    prompt = torch.tensor([[1] + tok("12>3:", add_special_tokens=False).input_ids])
    completion = torch.tensor([tok("1+2", add_special_tokens=False).input_ids + [2]])
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], -1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(prompt)], -1)
    with torch.no_grad():
        a, _ = policy.token_logprobs(prompt, torch.ones_like(prompt), completion)
        b, _ = policy.token_logprobs(padded, mask, completion)
    assert torch.allclose(a, b, atol=1e-5)
