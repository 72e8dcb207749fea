"""Causal LMs: the tiny built-in Llama and any Hugging Face checkpoint (a local directory or a Hub id).

`load_causal_lm` is the one place that turns a model config into (model, tokenizer). The
trainer sees the result only through `CausalPolicy` (the PolicyModel seam).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlvr.errors import ConfigError
from rlvr.hub import HUB_ID, LOGIN, hf_command
from rlvr.models.tokenizer import char_tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_PREFIX = "rlvr:"
REQUIRED = "???"
"""`model.path` of a recipe that only makes sense with the user's model (a real-model recipe)."""


def hub_snapshot(repo: str) -> Path:
    """The snapshot directory of Hub model `org/name[@revision]`, downloaded into the Hugging Face
    cache unless it is there; only the cache is read when `HF_HUB_OFFLINE` is set (read at the call,
    not at import, so a process can set it late)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id, _, revision = repo.partition("@")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, local_files_only=offline))
    except LocalEntryNotFoundError:
        where = "with HF_HUB_OFFLINE set" if offline else "and the Hub cannot be reached"
        raise ConfigError(f"model.path: '{repo}' is no local directory and not in the Hugging Face cache {where}; "
                          f"download it once ({hf_command()} download {repo_id}) or pass a local directory") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"model.path: '{repo}' is no local directory and no Hub model (or a gated one: log in "
                          f"with {hf_command()} {LOGIN[hf_command()]}); check the id") from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"model.path: fetching '{repo}' from the Hub failed ({type(err).__name__}: {reason}); "
                          f"pass a local directory or set HF_HUB_OFFLINE=1 to use the cache") from None


def resolve_model_path(path: str) -> Path:
    """`rlvr:NAME` names a checkpoint shipped inside the package; `org/name` that is no local
    directory, a Hugging Face Hub model (through its cache: `hub_snapshot`); anything else a directory."""
    if path == REQUIRED:
        raise ConfigError("model.path: this recipe trains a model you supply; pass model.path=DIR "
                          "(a local directory written by save_pretrained, or a Hub id such as Qwen/Qwen2.5-0.5B)")
    resolved = ASSETS / path[len(BUILTIN_PREFIX):] if path.startswith(BUILTIN_PREFIX) else Path(path)
    if not resolved.exists() and HUB_ID.fullmatch(path):
        resolved = hub_snapshot(path)
    if not (resolved / "config.json").is_file():
        raise ConfigError(
            f"model.path: no Hugging Face model at '{path}' (missing config.json); "
            "give a directory written by save_pretrained, a Hub id (org/name), or leave model.path empty to build "
            "a tiny model"
        )
    return resolved


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
"""config.json fields that give a model's context length, by architecture family (GPT-2: n_positions)."""


def context_length(model) -> tuple[int, str] | None:
    """(positions the model can attend over, the config field that says so), or None if none does."""
    config = getattr(model, "config", None)
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:  # GPT-2's n_positions also answers to max_position_embeddings
            return value, getattr(config, "attribute_map", {}).get(name, name)
    return None


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
    with weights in `dtype` (`float32`, `bfloat16`, or `auto`: the checkpoint's, float32 when built)."""
    if dtype == "auto":
        weights = "auto" if path else torch.float32
    else:
        weights = getattr(torch, dtype)
    if not path:
        tokenizer = char_tokenizer()
        model = tiny_llama(len(tokenizer), seed=seed, **size)
        # Initialised in float32 and cast, so a bf16 tiny model is the fp32 one rounded.
        return (model if weights == torch.float32 else model.to(weights)), tokenizer
    from safetensors import SafetensorError

    directory = resolve_model_path(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=weights)
        tokenizer = AutoTokenizer.from_pretrained(directory)
    # json.JSONDecodeError is a ValueError; a truncated weights file a SafetensorError; weights of another
    # shape than config.json says (a smaller vocab_size) a RuntimeError "size mismatch"
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, RuntimeError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"model.path: '{path}' is not a loadable Hugging Face causal LM "
                          f"({type(err).__name__}: {reason}); check its config.json and tokenizer files") from None
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
