"""Chat templates for the character tokenizer, so the chat-template path (`ChatRenderer`,
`apply_chat_template(..., tools=...)`) is tested on the default install. Each ends an
assistant message with the tokenizer's EOS, the token the sampler stops on, so the sampled EOS
and the template's end-of-turn are the same id.

- `chatml`: `<|role|>content` lines, tool schemas as JSON in a leading system line.
- `llama3`: header-delimited messages (`<|start_header_id|>role<|end_header_id|>`), BOS first.
"""

from __future__ import annotations

CHAT_TEMPLATES = {
    "chatml": (
        "{%- if tools %}<|system|>tools: {{ tools | tojson }}\n{% endif %}"
        "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
        "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\n{{ tools | tojson }}{{ eos_token }}{% endif %}"
        "{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
}
