"""Checks of a saved model folder rlvr did not just write (a reward model, a judge, a LoRA adapter,
a checkpoint's config.json), made before `transformers` or `peft` reads it: a damaged folder is one
line naming the file and what is wrong, never a JSONDecodeError or SafetensorError traceback, and a
folder of the wrong kind (a causal LM where a classifier is named) is refused before a random head
is bolted on.

>>> head_names({"architectures": ["LlamaForSequenceClassification"]}), head_names({"architectures": "x"})
(['LlamaForSequenceClassification'], [])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["TOKENIZER_FILES", "WEIGHTS", "check_loading", "check_tokenizer", "check_weights",
           "head_names", "read_json"]

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def read_json(path: Path, who: str, fix: str) -> dict[str, Any]:
    """The JSON object in `path` (a config.json, adapter_config.json or shard index); `who: ...` one
    line when it is missing, not UTF-8 JSON, or not an object."""
    if not path.is_file():
        raise ConfigError(f"{who}: '{path.parent}' has no {path.name}; {fix}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ConfigError(f"{who}: {path} is not valid JSON ({reason}); {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{who}: {path} holds a JSON {type(data).__name__}, not an object of settings; {fix}")
    return data


def check_weights(folder: Path, who: str, fix: str, names: tuple[str, ...] = WEIGHTS) -> None:
    """A weights file of `names` is in `folder`, and every safetensors file (a sharded index's too)
    has a readable header that covers the whole file (a truncated download fails here)."""
    present = [folder / n for n in names if (folder / n).is_file()]
    if not present:
        raise ConfigError(f"{who}: '{folder}' has no weights (none of {', '.join(names)}); {fix}")
    files = [p for p in present if p.suffix == ".safetensors"]
    for index in (p for p in present if p.name.endswith(".safetensors.index.json")):
        shards = read_json(index, who, fix).get("weight_map")
        if not isinstance(shards, dict):
            raise ConfigError(f"{who}: {index} has no weight_map of shard files; {fix}")
        files += [folder / str(s) for s in sorted(set(shards.values()))]
    from safetensors import SafetensorError, safe_open

    for file in files:
        if not file.is_file():
            raise ConfigError(f"{who}: '{folder}' lacks the weights shard {file.name}; {fix}")
        try:
            with safe_open(str(file), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            reason = str(err).splitlines()[0][:120]
            raise ConfigError(f"{who}: {file} is damaged or cut short ({reason}); {fix}") from None


def check_tokenizer(folder: Path, who: str) -> None:
    """The folder holds a tokenizer of its own (a scorer reads text with its own vocabulary)."""
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        raise ConfigError(f"{who}: '{folder}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                          f"tokenizer beside the weights (tokenizer.save_pretrained(DIR))")


def head_names(config: dict[str, Any]) -> list[str]:
    """The model classes config.json's `architectures` names ([] when none is named)."""
    heads = config.get("architectures") or []
    return [h for h in heads if isinstance(h, str)] if isinstance(heads, list) else []


def check_loading(info: dict, folder: Path, who: str, fix: str) -> None:
    """`from_pretrained(..., output_loading_info=True, ignore_mismatched_sizes=True)`'s report: weights
    the model needs that the folder lacks, or holds in another shape (a 2-label head where one score
    is read), would start at random, which is refused, never scored with."""
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ())
    if mismatched:
        raise ConfigError(f"{who}: the weights in '{folder}' hold {mismatched[0]} in another shape than the model "
                          f"needs (a head with another number of outputs); {fix}")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:2]) + (", ..." if len(missing) > 2 else "")
        raise ConfigError(f"{who}: the weights in '{folder}' lack {shown}, which would start at random; {fix}")
