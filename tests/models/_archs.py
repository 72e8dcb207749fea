"""The tiny architectures (`rlvr.models.tiny_archs`) under the name the model tests and
`bench/gpu_check.py` import, with the repository's root."""

from pathlib import Path

from rlvr.models.tiny_archs import (  # noqa: F401  re-exported
    ARCHS,
    BOS,
    CHAT_TEMPLATE,
    QWEN2_05B,
    bpe_tokenizer,
    build_model_dir,
    model_config,
    parameter_count,
)

ROOT = Path(__file__).resolve().parents[2]
BOS_CHAT_TEMPLATE = "{{ bos_token }}" + CHAT_TEMPLATE
"""Llama-3 style: the template itself emits the BOS token."""
