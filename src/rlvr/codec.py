"""Text <-> token batches: prompts to left-padded ids, rollouts back to answer strings."""

from __future__ import annotations

import torch

from rlvr.batch import Rollouts, left_pad


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> left-padded (ids, mask); a BOS token is prepended when the tokenizer has one."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    unique = list(dict.fromkeys(prompts))  # a GRPO batch repeats each prompt G times: tokenise once
    ids = dict(zip(unique, tokenizer(unique, add_special_tokens=False).input_ids))
    return left_pad([bos + ids[p] for p in prompts], tokenizer.pad_token_id)


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
