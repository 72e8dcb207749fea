"""Chat SFT: conversations in TRL's `messages` format, rendered with the tokenizer's chat
template, the loss on assistant tokens only (causal models).

A row is ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}``.
The conversation is rendered once; each assistant turn's tokens are found by rendering the
conversation up to that turn: its span runs from the end of the turns before it with the
generation prompt (``add_generation_prompt=True``) to the end of the turn itself, so the
template's end-of-turn marker is trained and the role header is not (TRL's
``assistant_only_loss``). A template whose shorter renderings are not token prefixes of the
whole cannot be masked this way and is refused with the conversation's row.

The model sees one sequence per conversation: the tokens before the first assistant token are
the "prompt" and the rest the "completion", whose mask is 1 on assistant tokens and 0 on the
user, system and tool turns between them (they condition, untrained), as the agents' masked
SFT does.
"""

from __future__ import annotations

import random

import torch

from rlvr.batch import Rollouts, left_pad
from rlvr.errors import ConfigError
from rlvr.tasks.files import load_rows
from rlvr.tasks.messages import ROLES, message_problem

__all__ = ["chat_rollouts", "chat_tokens", "load_conversations"]

def load_conversations(path: str) -> list[list[dict]]:
    """The `messages` lists of a data file's rows (any format `task.path` reads)."""
    out = []
    for row, where in load_rows(path, field="sft.data"):
        messages = row.get("messages")
        problem = message_problem(messages)
        if problem is None and not all(isinstance(m["content"], str) for m in messages):
            problem = "a message's content is a list of parts; chat SFT trains on text content"
        if problem:
            raise ConfigError(f"sft.data: {where}: \"messages\": {problem}; expected a list of "
                              f"{{\"role\", \"content\"}} with roles {', '.join(ROLES)}")
        if not any(m["role"] == "assistant" for m in messages):
            raise ConfigError(f"sft.data: {where}: no assistant message to train on")
        out.append(messages)
    return out


def _ids(tokenizer, messages: list[dict], *, generation_prompt: bool = False) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_tokens(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask) of one conversation: mask 1 on each assistant turn's tokens."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("sft.data: the model's tokenizer has no chat template; set tokenizer.chat_template "
                          "(saved in tokenizer_config.json) or train on a task's solutions without sft.data")
    ids = _ids(tokenizer, messages)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _ids(tokenizer, messages[:i], generation_prompt=True)
        end = _ids(tokenizer, messages[:i + 1])
        if ids[:len(start)] != start or ids[:len(end)] != end:
            raise ConfigError("sft.data: the chat template renders a conversation's turns differently from the "
                              "whole (its shorter renderings are not token prefixes), so the assistant tokens "
                              "cannot be found; use a template that renders earlier turns unchanged")
        mask[len(start):len(end)] = [1] * (len(end) - len(start))
    return ids, mask


def check_conversations_fit(tokenizer, conversations: list[list[dict]], model) -> None:
    """Refuse (one line) a conversation that renders to more tokens than the model has positions
    (`max_position_embeddings`): past them it would train on positions without an embedding."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int):
        return
    for i, messages in enumerate(conversations):
        if (n := len(_ids(tokenizer, messages))) > limit:
            raise ConfigError(f"sft.data: conversation {i + 1} is {n} tokens, over the model's {limit} positions; "
                              f"shorten or drop it, or use a model with more (model.max_seq_len for a fresh tiny "
                              f"model)")


def chat_rollouts(tokenizer, conversations: list[list[dict]]) -> Rollouts:
    """B conversations as prompt (before the first assistant token, left-padded) and completion
    (the rest, right-padded, `completion_mask` 1 on assistant tokens)."""
    prompts, completions, masks = [], [], []
    for messages in conversations:
        ids, mask = chat_tokens(tokenizer, messages)
        first = mask.index(1)
        prompts.append(ids[:first])
        completions.append(ids[first:])
        masks.append(mask[first:])
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    width = max(len(c) for c in completions)
    completion_ids = torch.tensor([c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions])
    completion_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    zeros = torch.zeros_like(completion_mask)
    return Rollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, zeros,
                    torch.zeros(len(conversations), dtype=torch.bool))


def sample_conversations(conversations: list[list[dict]], n: int, rng: random.Random) -> list[list[dict]]:
    """`n` conversations drawn with replacement."""
    return [conversations[rng.randrange(len(conversations))] for _ in range(n)]
