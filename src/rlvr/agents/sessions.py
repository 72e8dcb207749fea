"""Episodes of a black-box agent, kept token-exact: each call the agent makes to the endpoint
(`agents.endpoint`) becomes prompt ids, is sampled by the run's engine, and joins its episode's
`Trajectory` (sampled ids with mask 1 and their behaviour log-probs; everything else mask 0).

Token in, token out. The first call of an episode renders its messages with the tokenizer's chat
template. A later call whose messages start with the previous call's messages plus the reply rlvr
returned is an *extension*: its prompt is the kept ids (previous prompt + the ids actually
sampled) followed by the ids of what the template appends for the new messages (tool results, a
user turn, the generation prompt), tokenised on their own. So the engine is fed exactly the ids
the trajectory trains on, and a sampled tool call that the template would re-render differently
(spaces in its JSON, say) never changes the tokens. The delta is `render(messages) -
render(history)`, both with the template; the template's glue after the end-of-turn token (a
newline after `<|im_end|>`, say) is inserted after the sampled EOS.

Drift: a call that is not an extension (the agent rewrote or dropped history, or the template is
not append-only for it) starts a new chain from a full render and flags the episode `drifted`,
counted in `agent/drifted` and left out of the loss unless the task's `train_drifted` is set, as
the agent loop does. The episode trains on its last chain.

Completions (`/v1/completions`): a prompt that starts with the decoded kept ids extends them by
the ids of the rest; otherwise a new chain (drift), as above.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from rlvr.agents.env import FinishReason
from rlvr.agents.rollout import Trajectory, Turn
from rlvr.agents.tools import _hermes_blocks


class CallError(Exception):
    """A request the endpoint answers with a 4xx: (HTTP status, OpenAI error code, one-line message)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids) if text else []


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates expect them: text parts joined, `developer` as `system`, tool-call
    arguments as objects (the OpenAI wire format sends them as JSON strings)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": content or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def _template_call(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            pass  # a template that needs an object gets the string: its problem, shown as a 400
    return {"type": "function", "id": call.get("id"), "function": fn}


def normalized(messages: list[dict]) -> list[dict]:
    """Messages compared for the prefix test: empty fields dropped (an agent echoing a reply with
    `model_dump(exclude_none=True)` or with `content: null` is still the same message)."""
    return [{k: v for k, v in template_messages([m])[0].items() if v not in (None, "", [])} for m in messages]


# For tokenizers without a chat template (the character models): role-tagged messages, tool calls in
# Hermes blocks, the tools' schemas in a leading system line, a newline after each message.
PLAIN_TEMPLATE = (
    "{%- if tools %}<|system|>tools: {{ tools | tojson }}{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{%- for c in m.get('tool_calls') or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{%- endfor %}"
    "{%- if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def render(tokenizer, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
    template = None if getattr(tokenizer, "chat_template", None) else PLAIN_TEMPLATE
    try:
        return tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, tokenize=False,
                                             add_generation_prompt=generation, chat_template=template)
    except Exception as err:  # noqa: BLE001 - a template refusing the messages is the request's fault
        raise CallError(400, "invalid_request_error", f"messages: the chat template refused them: "
                        f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]) from None


def parse_tool_calls(text: str, tool_names: set[str], prefix: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a sampled reply: Hermes `<tool_call>{"name", "arguments"}</tool_call>`
    blocks naming a requested tool become OpenAI tool calls, the rest stays content. Model text
    is hostile: a block that is not such JSON stays text."""
    calls, kept, pos = [], [], 0
    for start, end in _hermes_blocks(text):
        try:
            obj = json.loads(text[start + 11:end - 12])
            name, args = str(obj["name"]), obj.get("arguments") or {}
            if name not in tool_names or not isinstance(args, dict):
                continue
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[pos:start])
        pos = end
        calls.append({"id": f"{prefix}_{len(calls)}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}})
    content = ("".join(kept) + text[pos:]).strip() if calls else text
    return (content or None) if calls else content, calls


@dataclass
class Record:
    """One answered call: what the agent sent, the prompt the engine was fed, what it sampled."""

    messages: list[dict] | None   # chat: the request's messages; completions: None
    reply: dict | None            # chat: the assistant message returned
    kept_ids: list[int]           # prompt + sampled ids: what the next call must extend


@dataclass
class Episode:
    """The state of one agent episode (touched only by the thread that drives the engine)."""

    key: str
    seed: int
    row: int
    records: list[Record] = field(default_factory=list)
    traj: Trajectory | None = None
    chains: int = 0
    drifts: int = 0
    closed: bool = False

    @property
    def calls(self) -> int:
        return len(self.records)


def chat_prompt(ep: Episode, tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], int]:
    """(prompt ids, how many of them are already in the episode's kept ids); 0 kept: a new chain."""
    last = ep.records[-1] if ep.records else None
    if last is not None and last.messages is not None:
        history = last.messages + [last.reply]
        if len(messages) > len(history) and normalized(messages[:len(history)]) == normalized(history):
            before = render(tokenizer, history, tools, False)
            after = render(tokenizer, messages, tools, True)
            if after.startswith(before):
                glue = _glue(tokenizer, before, ended=last.kept_ids[-1:] == [tokenizer.eos_token_id])
                return last.kept_ids + glue + _encode(tokenizer, after[len(before):]), len(last.kept_ids)
    return _encode(tokenizer, render(tokenizer, messages, tools, True)), 0


def _glue(tokenizer, before: str, *, ended: bool) -> list[int]:
    """The ids the template writes after the assistant's end-of-turn token (none when it ends the
    text); with the EOS itself first when the reply was cut before sampling it."""
    eos = tokenizer.eos_token or ""
    at = before.rfind(eos) if eos else -1
    if at < 0:
        return []
    return ([] if ended else [tokenizer.eos_token_id]) + _encode(tokenizer, before[at + len(eos):])


def completion_prompt(ep: Episode, tokenizer, prompt: str) -> tuple[list[int], int]:
    last = ep.records[-1] if ep.records else None
    if last is not None:
        kept = tokenizer.decode(last.kept_ids, skip_special_tokens=False)
        if prompt.startswith(kept) and len(prompt) > len(kept):
            return last.kept_ids + _encode(tokenizer, prompt[len(kept):]), len(last.kept_ids)
    return _encode(tokenizer, prompt), 0


def begin_call(ep: Episode, prompt_ids: list[int], kept: int) -> None:
    """Grow the episode's trajectory to `prompt_ids` (the inserted ids mask 0), or start a new chain."""
    if kept == 0:
        drifted = ep.traj is not None  # a history the kept ids cannot extend
        ep.drifts += drifted
        ep.traj = Trajectory(ids=[], prompt_len=len(prompt_ids), drifted=drifted)
        ep.traj.add(prompt_ids, None, trained=False, turn=-1)
        ep.chains += 1
        return
    t = ep.traj
    delta = prompt_ids[kept:]
    t.add(delta, None, trained=False, turn=len(t.turns) - 1)


def end_call(ep: Episode, ids: list[int], logprobs: list[float], *, ended: bool, cut: bool) -> str:
    """Append the sampled ids; the OpenAI finish reason (`stop` or `length`)."""
    t = ep.traj
    begin = len(t.ids)
    t.add(ids, logprobs, trained=True, turn=len(t.turns))
    finish = FinishReason.TOKEN_BUDGET if cut else (FinishReason.STOP if ended else FinishReason.LENGTH)
    t.turns.append(Turn(begin, len(t.ids), len(t.ids), finish, 0.0, ("call", len(t.turns))))
    return "stop" if ended else "length"


def finish_episode(ep: Episode, outcome: float | dict | Exception | None, pad_prompt: list[int]) -> Trajectory:
    """The episode's trajectory with its reward (the agent's return value) or its failure."""
    t = ep.traj
    if t is None:  # the agent never called the model: nothing was sampled, nothing to train
        t = Trajectory(ids=[], prompt_len=len(pad_prompt), drifted=False)
        t.add(pad_prompt, None, trained=False, turn=-1)
    t.done = True
    if ep.drifts:
        t.count("drifts", ep.drifts)  # history rewrites: each one began a new chain
    if isinstance(outcome, Exception):
        t.count("env_errors")
        if isinstance(outcome, TimeoutError):
            t.count("env_timeouts")
        t.finish, t.reward, t.success = FinishReason.ENV_ERROR, 0.0, False
        t.error = f"agent: {type(outcome).__name__}: {str(outcome).splitlines()[0] if str(outcome) else ''}"[:300]
        return t
    try:
        reward, success = _outcome(outcome)
    except (TypeError, ValueError) as err:
        return finish_episode(ep, ValueError(f"returned {outcome!r:.80}, not a reward ({err})"), pad_prompt)
    t.reward, t.success = reward, success
    t.finish = FinishReason.DONE
    if t.turns:
        t.turns[-1].reward = reward
    t.count("tool_calls", sum(len((r.reply or {}).get("tool_calls") or []) for r in ep.records))
    return t


def _outcome(outcome) -> tuple[float, bool]:
    """(reward, success) from what the agent returned: a number, None (0), or a dict with `reward`
    and optionally `success` (default: reward > 0)."""
    if outcome is None:
        return 0.0, False
    reward = float(outcome.get("reward", 0.0) if isinstance(outcome, dict) else outcome)
    if not math.isfinite(reward):
        raise ValueError("not finite")
    return reward, bool(outcome.get("success", reward > 0) if isinstance(outcome, dict) else reward > 0)
