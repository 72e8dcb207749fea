"""A tiny sequence-classification reward model with its own chat template, built in memory or
saved to a folder that `reward.fn` can name: shared by the reward-model, agent and Ray tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlvr.models.tokenizer import char_tokenizer

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"


def tiny_reward_model(seed: int = 0):
    torch.manual_seed(seed)
    tokenizer = char_tokenizer()
    tokenizer.chat_template = TEMPLATE  # the reward model's own, not the policy's
    # Llama, not Qwen2: a Qwen2 config.json makes AutoTokenizer load a Qwen2Tokenizer over the character vocabulary
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    return LlamaForSequenceClassification(config).eval(), tokenizer


def save_tiny_reward_model(path):
    """`tiny_reward_model()` and its tokenizer saved in `path` (a folder `reward.fn` can name)."""
    model, tokenizer = tiny_reward_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
