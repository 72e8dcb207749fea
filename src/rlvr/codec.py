"""Text <-> token batches: prompts to left-padded ids, rollouts back to answer strings."""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts, left_pad


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> left-padded (ids, mask); a BOS token is prepended when the tokenizer has one
    and the prompt does not already start with it (a chat template with `{{ bos_token }}`)."""
    unique = list(dict.fromkeys(prompts))  # a GRPO batch repeats each prompt G times: tokenise once
    ids = {p: _with_bos(tokenizer, i) for p, i in zip(unique, tokenizer(unique, add_special_tokens=False).input_ids)}
    return left_pad([ids[p] for p in prompts], tokenizer.pad_token_id)


def encode_examples(tokenizer, examples) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Examples -> left-padded (ids, mask) and the engine's keywords for them: {} for text; a
    vision-language model's `VisionPrompts` adds {"vision": VisionRows} of the examples' images."""
    encode = getattr(tokenizer, "encode_examples", None)
    if encode is not None:
        return encode(examples)
    return (*encode_prompts(tokenizer, [ex.prompt for ex in examples]), {})


def prompt_lengths(tokenizer, prompts: list[str]) -> list[int]:
    """Each prompt's length in tokens as `encode_prompts` gives it to the model (BOS included)."""
    return [len(_with_bos(tokenizer, ids)) for ids in tokenizer(prompts, add_special_tokens=False).input_ids]


def _with_bos(tokenizer, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    return ids if bos is None or ids[:1] == [bos] else [bos, *ids]


def decode_completions(tokenizer, rollouts: Rollouts) -> list[str]:
    """Each row's answer text: its tokens up to its length, cut at the first EOS.

    The cut matters for masked-diffusion rollouts with `rollout.window=full`, whose length is the
    whole window: tokens the sampler committed after the EOS are scored but are not the answer.
    """
    eos = tokenizer.eos_token_id
    texts = []
    for ids, n in zip(rollouts.completion_ids.tolist(), rollouts.lengths.long().tolist()):
        ids = ids[:n]
        if eos is not None and eos in ids:
            ids = ids[:ids.index(eos)]
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


def completion_batch(tokenizer, completions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions + EOS, right-padded: (ids (B, Tc), mask (B, Tc) float)."""
    encoded = [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for text in completions]
    ids, mask = left_pad([seq[::-1] for seq in encoded], tokenizer.pad_token_id)  # pad left, then flip = pad right
    return ids.flip(-1), mask.flip(-1).float()


def completion_token_ids(tokenizer, rollouts: Rollouts) -> list[list[int]]:
    """Each row's completion token ids up to and including its first EOS (TRL's `completion_ids`:
    the tokens the loss sees; a row without EOS keeps its whole length)."""
    eos = tokenizer.eos_token_id
    rows = []
    for ids, n in zip(rollouts.completion_ids.tolist(), rollouts.lengths.long().tolist()):
        ids = ids[:n]
        rows.append(ids[:ids.index(eos) + 1] if eos is not None and eos in ids else ids)
    return rows
