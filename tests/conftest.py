import pytest
import torch

from rlvr.models.causal_lm import tiny_llama
from rlvr.models.tokenizer import char_tokenizer


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_seq_len=64, seed=0)
