"""An OpenAI-compatible HTTP endpoint in front of the run's rollout engine, for black-box agents.

The server (FastAPI under uvicorn, the optional `serve` extra, imported here only) runs in a
daemon thread on 127.0.0.1 at a free port and answers, per episode, under
`http://127.0.0.1:PORT/e/<episode>/v1`:

- `POST /chat/completions`: `messages` (system, developer, user, assistant with `tool_calls`,
  tool), `tools` (passed to the chat template), `logprobs`, `max_tokens` |
  `max_completion_tokens`; a reply's Hermes `<tool_call>` blocks come back as `tool_calls`.
- `POST /completions`: a text `prompt`.
- `GET /models`.

Every answer carries the exact ids (`prompt_token_ids`, `choices[0].token_ids`, as vLLM's
`return_token_ids` does). `stream: true` (chat) gets the same answer as server-sent events once it
is sampled: a role chunk, the content, the tool calls, the finish reason, a usage chunk when
`stream_options.include_usage` asks, `[DONE]`. What the engine samples is the run's business:
the run's temperature and per-call token limit apply, the request's sampling fields
(`temperature`, `top_p`, `seed`, `stop`) are ignored, so the behaviour log-probs are the ones the
trainer corrects for. `n` > 1 is refused. The work itself (rendering, batching, the engine)
happens in the thread that drives the rollout (`agents.agent_fn`); the handlers only check and
queue.

Hostile input: the run's bearer token is required (401 without it; compared in constant time);
bodies over `max_body_bytes` get 413 without being read past the limit; anything not a
well-formed request gets 400 with one line; a call for an episode that is not running gets 404;
a call not answered within `call_timeout_s` gets 504. None of these touches an episode.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' `Request` annotations at runtime.
import asyncio
import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from rlvr.agents.sessions import CallError

ROLES = ("system", "developer", "user", "assistant", "tool")
Submit = Callable[[str, dict], "Future | None"]  # (episode, checked request) -> the answer's future; None: unknown


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise CallError(400, "invalid_request_error", message)


def _content_ok(content) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)


def _check_message(i: int, m) -> None:
    _need(isinstance(m, dict), f"messages[{i}]: must be an object with a role")
    _need(m.get("role") in ROLES, f"messages[{i}].role: must be one of {', '.join(ROLES)}, got {m.get('role')!r:.40}")
    _need(_content_ok(m.get("content")), f"messages[{i}].content: must be a string or a list of text parts")
    calls = m.get("tool_calls")
    if calls is not None:
        _need(m["role"] == "assistant" and isinstance(calls, list), f"messages[{i}].tool_calls: only an assistant "
              f"message has tool_calls, a list")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            _need(isinstance(fn, dict) and isinstance(fn.get("name"), str)
                  and isinstance(fn.get("arguments", ""), str | dict),
                  f"messages[{i}].tool_calls[{j}]: must be {{type: function, function: {{name, arguments}}}}")
    for key in ("tool_call_id", "name"):
        _need(m.get(key) is None or isinstance(m[key], str), f"messages[{i}].{key}: must be a string")


def _common(body: dict) -> dict:
    _need(body.get("n", 1) == 1, "n: only n=1 is served (one sample per call; run the call again for more)")
    options = body.get("stream_options") or {}
    _need(isinstance(options, dict), "stream_options: must be an object")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    _need(limit is None or isinstance(limit, int) and not isinstance(limit, bool) and limit > 0,
          "max_tokens: must be a positive integer")
    return {"max_tokens": limit, "logprobs": bool(body.get("logprobs")), "stream": bool(body.get("stream")),
            "usage_chunk": bool(options.get("include_usage"))}


def check_chat(body) -> dict:
    """The fields of a chat request rlvr uses, checked; `CallError` (400) names the first bad one."""
    _need(isinstance(body, dict), "body: must be a JSON object")
    messages = body.get("messages")
    _need(isinstance(messages, list) and messages, "messages: must be a non-empty list")
    for i, m in enumerate(messages):
        _check_message(i, m)
    _need(messages[-1]["role"] != "assistant", "messages: the last one must not be the assistant's (nothing to "
          "continue; prefill is not served)")
    tools = body.get("tools")
    _need(tools is None or isinstance(tools, list) and all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in tools), "tools: must be a list of {type: function, function: {name, parameters}}")
    return {"kind": "chat", "messages": messages, "tools": tools or None, **_common(body)}


def check_completion(body) -> dict:
    _need(isinstance(body, dict), "body: must be a JSON object")
    _need(isinstance(body.get("prompt"), str) and body["prompt"], "prompt: must be a non-empty string")
    _need(not body.get("stream"), "stream: served for chat completions only; send stream=false")
    return {"kind": "completion", "prompt": body["prompt"], **_common(body)}


def sse_chunks(answer: dict, usage_chunk: bool) -> list[str]:
    """A whole chat answer as the server-sent events of a stream (one delta per part)."""
    choice, head = answer["choices"][0], {k: answer[k] for k in ("id", "created", "model")}
    message = choice["message"]

    def chunk(delta: dict, finish=None, **extra) -> str:
        body = {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}
        return f"data: {json.dumps(body)}\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(chunk({"content": message["content"]}, logprobs=choice["logprobs"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, choice["finish_reason"], token_ids=choice["token_ids"]))
    if usage_chunk:
        usage = {**head, "object": "chat.completion.chunk", "choices": [], "usage": answer["usage"],
                 "prompt_token_ids": answer["prompt_token_ids"]}
        out.append(f"data: {json.dumps(usage)}\n\n")
    return [*out, "data: [DONE]\n\n"]


def error_body(code: str, message: str) -> dict:
    return {"error": {"message": message, "type": code, "code": code, "param": None}}


def make_app(token: str, submit: Submit, *, max_body_bytes: int, call_timeout_s: float, model_name: str,
             max_model_len: int):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    bearer = f"Bearer {token}".encode()

    def fail(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse(error_body(code, message), status_code=status)

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
            raise CallError(413, "request_too_large", f"body: over {max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise CallError(413, "request_too_large", f"body: over {max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def serve(request: Request, episode: str, check: Callable[[object], dict]):
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), bearer):
            return fail(401, "invalid_api_key", "authorization: send the run's token as 'Bearer <token>'")
        try:
            raw = await read_body(request)
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):
                raise CallError(400, "invalid_request_error", "body: not valid JSON") from None
            call = check(body)
            future = submit(episode, call)
            if future is None:
                return fail(404, "not_found", f"episode {episode[:40]!r}: not running")
            try:
                answer = await asyncio.wait_for(asyncio.wrap_future(future), call_timeout_s)
            except TimeoutError:
                future.cancel()
                return fail(504, "timeout", f"no answer within {call_timeout_s:g} s")
        except CallError as err:
            return fail(err.status, err.code, str(err))
        if isinstance(answer, CallError):
            return fail(answer.status, answer.code, str(answer))
        if call["stream"] and call["kind"] == "chat":
            return StreamingResponse(iter(sse_chunks(answer, call["usage_chunk"])), media_type="text/event-stream")
        return JSONResponse(answer)

    @app.post("/e/{episode}/v1/chat/completions")
    async def chat(episode: str, request: Request):
        return await serve(request, episode, check_chat)

    @app.post("/e/{episode}/v1/completions")
    async def completions(episode: str, request: Request):
        return await serve(request, episode, check_completion)

    @app.get("/e/{episode}/v1/models")
    async def models(episode: str, request: Request):
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), bearer):
            return fail(401, "invalid_api_key", "authorization: send the run's token as 'Bearer <token>'")
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "rlvr",
                                            "max_model_len": max_model_len}]}

    return app


class Endpoint:
    """The server, started once and reused by every rollout of a run. `submit` is set per rollout."""

    def __init__(self, *, max_body_bytes: int = 1 << 20, call_timeout_s: float = 120.0, model_name: str = "policy",
                 max_model_len: int = 0):
        self.token = secrets.token_urlsafe(32)
        self.submit: Submit = lambda episode, call: None
        self.max_body_bytes, self.call_timeout_s = max_body_bytes, call_timeout_s
        self.model_name, self.max_model_len = model_name, max_model_len
        self.port, self._server, self._thread = 0, None, None

    def url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{episode}/v1"

    def start(self) -> "Endpoint":
        if self._thread is not None:
            return self
        try:
            import fastapi  # noqa: F401 - imported in this thread, not first in the server's
            import uvicorn
        except ImportError:
            raise ImportError("the agent endpoint needs fastapi and uvicorn: pip install -e '.[serve]'") from None
        app = make_app(self.token, lambda episode, call: self.submit(episode, call),
                       max_body_bytes=self.max_body_bytes, call_timeout_s=self.call_timeout_s,
                       model_name=self.model_name, max_model_len=self.max_model_len)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # loopback only: agents run on this machine
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30,
                                limit_concurrency=1024, h11_max_incomplete_event_size=64 * 1024)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="rlvr-endpoint")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agent endpoint did not start (see the log above)")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server, self._thread = None, None
