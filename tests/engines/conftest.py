"""A tiny Llama and four prompts, shared by the sampling-option tests."""

from __future__ import annotations

import pytest
import torch

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer


@pytest.fixture(scope="module")
def model_and_prompts():
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_seq_len=64, seed=0)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, len(tokenizer), (4, 6), generator=generator)
    return model, tokenizer, prompt, torch.ones_like(prompt), torch.arange(4)
