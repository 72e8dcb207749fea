"""A black-box agent written against the `openai` client only (it imports nothing from rlvr): it
may call a `reverse` tool, feeds the tool's output back, and is rewarded for answering with the
reversed word. Its replies are echoed back with `model_dump(exclude_none=True)`, as agents do."""

import json

TOOLS = [{"type": "function", "function": {
    "name": "reverse", "description": "Reverse a word.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]


async def reverse_agent(client, example):
    messages = [{"role": "system", "content": "answer with the reversed word"},
                {"role": "user", "content": example["prompt"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float((message.content or "").strip() == example["answer"])
        for call in message.tool_calls:
            text = json.loads(call.function.arguments).get("text", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(text)[::-1]})
    return 0.0
