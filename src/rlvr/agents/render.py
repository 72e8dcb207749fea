"""Renderers: the token side of a conversation. They turn the first observation into prompt ids,
an observation into the ids appended after an action (the token-in/token-out delta, template
glue included), and re-render a whole conversation for the drift check. No torch here.

- `TagRenderer` (tokenizers without a chat template, e.g. the character tokenizer): the prompt is
  BOS + the observation text; an action is the sampled ids (EOS included); an observation is
  `<r>text</r>`. Tool descriptions are not rendered (the tiny models learn the tags from
  demonstrations).
- `ChatRenderer`: the tokenizer's own chat template with `tools=` (schemas from the registry).
  The observation delta is the text the template adds after the kept conversation when the
  tool (or user) message is appended, computed on text and tokenised on its own. Templates that
  rewrite history (drop earlier `<think>` blocks, say) or tokenisers that merge across the seam
  make the kept ids differ from a full re-render; the drift check catches exactly that.
"""

from __future__ import annotations


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids) if text else []


class TagRenderer:
    """Plain-text conversations for the character models."""

    def __init__(self, tokenizer, *, obs_open: str = "<r>", obs_close: str = "</r>"):
        self.tokenizer = tokenizer
        self.obs_open, self.obs_close = obs_open, obs_close

    def start(self, observation: str) -> list[int]:
        bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        return bos + _encode(self.tokenizer, observation)

    def action_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def action_ids(self, text: str) -> list[int]:
        """The ids a scripted action would have been sampled as (EOS appended)."""
        return _encode(self.tokenizer, text) + [self.tokenizer.eos_token_id]

    def observation(self, kept_ids: list[int], messages: list[dict]) -> tuple[list[int], bool]:
        """(ids appended for the last message of `messages`, whether that was exact)."""
        return _encode(self.tokenizer, f"{self.obs_open}{messages[-1]['content']}{self.obs_close}"), True

    def rerender(self, messages: list[dict]) -> list[int]:
        """The conversation rendered from its texts: what a message-level (re-tokenising) loop
        would have trained on."""
        ids = self.start(messages[0]["content"])
        for m in messages[1:]:
            if m["role"] == "assistant":
                ids += _encode(self.tokenizer, m["content"]) + ([self.tokenizer.eos_token_id] if m.get("ended") else [])
            else:
                ids += self.observation(ids, [m])[0]
        return ids


class ChatRenderer:
    """Conversations through `tokenizer.apply_chat_template(messages, tools=...)`."""

    def __init__(self, tokenizer, *, tools: list[dict] | None = None, system: str | None = None):
        self.tokenizer, self.tools, self.system = tokenizer, tools or None, system

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        head = [{"role": "system", "content": self.system}] if self.system else []
        return self.tokenizer.apply_chat_template(head + plain, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def start(self, observation: str) -> list[int]:
        # Special tokens come from the template text itself (its BOS, role markers).
        return _encode(self.tokenizer, self._render([{"role": "user", "content": observation}], True))

    def action_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def action_ids(self, text: str) -> list[int]:
        return _encode(self.tokenizer, text) + [self.tokenizer.eos_token_id]

    def observation(self, kept_ids: list[int], messages: list[dict]) -> tuple[list[int], bool]:
        """The template's text after the kept conversation once the last message (tool or user)
        is appended, generation prompt included, tokenised on its own. Not exact (False) when the
        template does not extend the kept text: it rewrote history."""
        kept = self.tokenizer.decode(kept_ids, skip_special_tokens=False)
        full = self._render(messages, True)
        if full.startswith(kept):
            return _encode(self.tokenizer, full[len(kept):]), True
        before = self._render(messages[:-1], False)
        return _encode(self.tokenizer, full[len(before):] if full.startswith(before) else full), False

    def rerender(self, messages: list[dict]) -> list[int]:
        """The whole conversation rendered at once (message-level) and tokenised at once."""
        return _encode(self.tokenizer, self._render(messages, messages[-1]["role"] != "assistant"))


def make_renderer(tokenizer, tools: list[dict] | None = None):
    """The chat template when the tokenizer has one, else the plain tag format."""
    if getattr(tokenizer, "chat_template", None):
        return ChatRenderer(tokenizer, tools=tools)
    return TagRenderer(tokenizer)
