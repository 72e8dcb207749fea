"""Causal LMs: the tiny built-in Llama and any local Hugging Face checkpoint.

`load_causal_lm` is the one place that turns a model config into (model, tokenizer). The
trainer sees the result only through `CausalPolicy` (the PolicyModel seam).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlvr.errors import ConfigError
from rlvr.models.tokenizer import char_tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_PREFIX = "rlvr:"


def resolve_model_path(path: str) -> Path:
    """`rlvr:NAME` names a checkpoint shipped inside the package; anything else is a directory."""
    resolved = ASSETS / path[len(BUILTIN_PREFIX):] if path.startswith(BUILTIN_PREFIX) else Path(path)
    if not (resolved / "config.json").is_file():
        raise ConfigError(
            f"model.path: no Hugging Face model at '{path}' (missing config.json); "
            "give a directory written by save_pretrained, or leave model.path empty to build a tiny model"
        )
    return resolved


def tiny_llama(vocab_size: int, *, hidden_size: int, num_layers: int, num_heads: int,
               intermediate_size: int, max_seq_len: int, seed: int) -> LlamaForCausalLM:
    """A Llama-architecture model built from a config: no download, deterministic init."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_seq_len,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def load_causal_lm(path: str | None, *, seed: int, dtype: str = "float32", **size):
    """(model, tokenizer) from a local directory, a packaged checkpoint, or a fresh tiny config,
    with weights in `dtype` (`float32` or `bfloat16`)."""
    weights = getattr(torch, dtype)
    if not path:
        tokenizer = char_tokenizer()
        model = tiny_llama(len(tokenizer), seed=seed, **size)
        # Initialised in float32 and cast, so a bf16 tiny model is the fp32 one rounded.
        return (model if weights == torch.float32 else model.to(weights)), tokenizer
    directory = resolve_model_path(path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=weights)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def enable_checkpointing(model) -> bool:
    """Make `model`'s layers recompute activations in the backward pass (non-reentrant); False if
    it has no such switch. transformers 5.19 (the release vLLM's CPU build accepts) names it
    `gradient_checkpointing_enable`; later releases `activation_checkpointing_enable`."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        return False
    return True
