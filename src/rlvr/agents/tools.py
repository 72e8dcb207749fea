"""Tools: plain Python functions called by name, their JSON schema derived from the type hints,
and the parsing of tool calls out of an action's text. No torch here.

Two call syntaxes are understood, so one environment serves both model families:
- tags, for the tiny character models: `<calc>37*58</calc>` calls `calc` with its first
  parameter set to the body (or with keyword arguments if the body is a JSON object);
  `<answer>2146</answer>` is the final answer;
- Hermes-style JSON, what chat templates with `tools=` teach: `<tool_call>{"name": "calc",
  "arguments": {"expression": "37*58"}}</tool_call>`.

A call runs under a wall-clock timeout in a daemon thread: a tool that hangs or raises becomes
an error `ToolResult` (the episode goes on), never an exception in the rollout.
"""

from __future__ import annotations

import bisect
import inspect
import json
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""


@dataclass(frozen=True)
class ToolResult:
    text: str
    ok: bool
    error: str | None = None  # "timeout", "raised", "bad_arguments", "unknown_tool"


@dataclass(frozen=True)
class ParsedAction:
    """One action: tool calls, a final answer, or neither (`malformed`)."""

    calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    malformed: bool = False


def schema(fn: Callable) -> dict:
    """The OpenAI/`apply_chat_template(tools=...)` function schema of `fn`: name, the first
    docstring line as description, and JSON types from the type hints (unhinted = string)."""
    hints = typing.get_type_hints(fn)
    params, required = {}, []
    for name, p in inspect.signature(fn).parameters.items():
        params[name] = {"type": _JSON_TYPES.get(hints.get(name, str), "string")}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    return {"type": "function", "function": {"name": fn.__name__, "description": doc,
                                             "parameters": {"type": "object", "properties": params,
                                                            "required": required}}}


def _coerce(value, json_type: str):
    if json_type == "integer":
        return int(value)
    if json_type == "number":
        return float(value)
    if json_type == "boolean":
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    return value if json_type in ("array", "object") else str(value)


@dataclass
class ToolRegistry:
    """Named tools with a per-call wall-clock limit. Counts calls, errors and timeouts."""

    tools: dict[str, Callable] = field(default_factory=dict)
    timeout_s: float = 2.0

    @classmethod
    def of(cls, *fns: Callable, timeout_s: float = 2.0) -> ToolRegistry:
        return cls({fn.__name__: fn for fn in fns}, timeout_s)

    def schemas(self) -> list[dict]:
        return [schema(fn) for fn in self.tools.values()]

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def call(self, call: ToolCall) -> ToolResult:
        fn = self.tools.get(call.name)
        if fn is None:
            return ToolResult(f"unknown tool {call.name}; valid: {', '.join(sorted(self.tools))}", False,
                              "unknown_tool")
        props = schema(fn)["function"]["parameters"]
        try:
            kwargs = {k: _coerce(v, props["properties"][k]["type"]) for k, v in call.arguments.items()}
            missing = [k for k in props["required"] if k not in kwargs]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
        except (KeyError, ValueError, TypeError) as err:
            return ToolResult(f"bad arguments: {err}", False, "bad_arguments")
        return _run_with_timeout(fn, kwargs, self.timeout_s)


def _run_with_timeout(fn: Callable, kwargs: dict, timeout_s: float) -> ToolResult:
    """Run `fn(**kwargs)` in a daemon thread; a thread still running after `timeout_s` is left
    to finish on its own (Python cannot kill a thread) and the call is an error."""
    box: dict = {}

    def target():
        try:
            box["out"] = str(fn(**kwargs))
        except Exception as err:  # noqa: BLE001 - any tool failure becomes an observation
            box["err"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s if timeout_s > 0 else None)
    if thread.is_alive():
        return ToolResult(f"timeout after {timeout_s:g}s", False, "timeout")
    if "err" in box:
        return ToolResult(f"error {box['err']}", False, "raised")
    return ToolResult(box["out"], True)


_OPEN = re.compile(r"<([a-z_][a-z0-9_]*+)>")
_CLOSE = re.compile(r"</([a-z_][a-z0-9_]*+)>")


def _hermes_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) of each ``<tool_call>…</tool_call>`` left to right, the body ending at the first
    closing; linear: once an opening has no closing after it, no later one has."""
    blocks, pos = [], 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        close = text.find("</tool_call>", start + 11)
        if close < 0:
            break
        blocks.append((start, close + 12))
        pos = close + 12
    return blocks


def _tags(text: str) -> list[tuple[str, str]]:
    """(name, body) of each ``<name>…</name>`` left to right, as a backreferencing pattern would
    find them, in O(n log n): the first closing after each opening is looked up, never scanned for."""
    closings: dict[str, list[int]] = {}
    for m in _CLOSE.finditer(text):
        closings.setdefault(m.group(1), []).append(m.start())
    found, end = [], 0
    for m in _OPEN.finditer(text):
        ends = closings.get(m.group(1), [])
        i = bisect.bisect_left(ends, m.end())
        if m.start() < end or i == len(ends):
            continue  # inside the last block, or never closed
        found.append((m.group(1), text[m.end():ends[i]]))
        end = ends[i] + len(m.group(1)) + 3
    return found


def parse_action(text: str, registry: ToolRegistry, *, answer_tag: str = "answer") -> ParsedAction:
    """Tool calls (Hermes JSON, or tags named after registered tools) and the final answer tag.

    A Hermes block that is not valid JSON, or a text with no recognised tag, is `malformed`. Model
    text is hostile: both scans are (near) linear, so unclosed tags cannot stall the loop."""
    calls: list[ToolCall] = []
    blocks = _hermes_blocks(text)
    for start, end in blocks:
        body = text[start + 11:end - 12]
        try:
            obj = json.loads(body)
            calls.append(ToolCall(str(obj["name"]), dict(obj.get("arguments") or {}), body))
        except (ValueError, KeyError, TypeError, AttributeError):
            return ParsedAction(malformed=True)
    rest = "".join(text[a:b] for a, b in zip([0] + [e for _, e in blocks], [s for s, _ in blocks] + [len(text)]))
    answer = None
    for name, body in _tags(rest):
        if name == answer_tag:
            answer = body.strip()
        elif name in registry:
            calls.append(ToolCall(name, _tag_arguments(registry.tools[name], body), body))
    if not calls and answer is None:
        return ParsedAction(malformed=True)
    return ParsedAction(tuple(calls), answer)


def _tag_arguments(fn: Callable, body: str) -> dict:
    stripped = body.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
    first = next(iter(inspect.signature(fn).parameters), None)
    return {first: body} if first else {}
