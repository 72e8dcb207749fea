"""Chat messages given as data (a prompt column of ``{"role", "content"}`` dicts, an ``sft.data``
row's ``messages``): checked where they come in, so a role the chat template does not know
("wizard"), a plain string for a message, missing or non-text content and an empty conversation are
one line naming the row and the message, not a template error, a crash or a run that trains on them.

>>> message_problem([{"role": "user", "content": "2+2?"}]) is None
True
>>> message_problem([{"role": "wizard", "content": "hi"}])
"message 1 has role 'wizard'; roles are system, user, assistant, tool"
>>> message_problem([])
'the conversation is empty'
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROLES", "message_problem"]

ROLES = ("system", "user", "assistant", "tool")


def _content_problem(content: Any) -> str | None:
    """Text, or TRL's multimodal form: a list of typed parts (``{"type": "text", "text": ...}``)."""
    if isinstance(content, str):
        return None
    if isinstance(content, list) and content and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                                                     for p in content):
        return None
    return f"content is {type(content).__name__ if content is not None else 'missing'}, not text"


def message_problem(messages: Any) -> str | None:
    """What is wrong with `messages` as a conversation, or None: a non-empty list of dicts, each with a
    role of `ROLES` and text content (or a list of typed content parts)."""
    if not isinstance(messages, list):
        return f"expected a list of {{\"role\", \"content\"}} messages, got {type(messages).__name__}"
    if not messages:
        return "the conversation is empty"
    for i, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            return f"message {i} is a {type(message).__name__}, not a {{\"role\", \"content\"}} dict"
        if message.get("role") not in ROLES:
            return f"message {i} has role {message.get('role')!r}; roles are {', '.join(ROLES)}"
        problem = _content_problem(message.get("content"))
        if problem:
            return f"message {i}'s {problem}"
    return None
