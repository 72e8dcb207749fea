"""Train an agent written against the `openai` client: `async def run(client, example) -> reward`.

`AgentFnTask(run, examples)` is an agent task whose episodes are calls of the user's function.
For each episode rlvr hands `run` an `openai.AsyncOpenAI` client pointed at its own endpoint
(`agents.endpoint`, loopback, the run's bearer token, this episode's URL) and the example as a
plain dict (`prompt`, `answer` and the example's `meta`); whatever the agent does in between (tools,
several turns, its own parsing) is its business, and what it returns is the episode's reward (a
number, None for 0, or a dict with `reward` and optionally `success`). The agent need not import
rlvr.

The thread that rolls out drives the engine (`Round.drive`): it waits until every running episode
has a call queued (or `batch_wait_s` passed since the first one: an agent busy in a slow tool does
not hold the others back), renders them token-exactly (`agents.sessions`), samples them in one
engine call with seeds `turn_seeds(episode seed, call index)` (arrival order never changes what a
call samples) and answers. Each agent runs in a daemon thread of its own with its own event loop,
so an agent that blocks stalls only itself. An agent that raises, or has not returned
`episode_timeout_s` seconds after the round began, ends its own episode (`env_error`, reward 0);
calls beyond `max_turns`, or whose prompt leaves no room under `max_total_tokens`, get a 400 the
agent may catch.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future

import torch

from rlvr.agents.endpoint import Endpoint
from rlvr.agents.rollout import Trajectory, turn_seeds
from rlvr.agents.sessions import (
    CallError,
    Episode,
    Record,
    begin_call,
    chat_prompt,
    completion_prompt,
    end_call,
    finish_episode,
    parse_tool_calls,
)
from rlvr.agents.task import AgentSettings, is_heldout_key
from rlvr.batch import left_pad
from rlvr.errors import ConfigError
from rlvr.types import Example


def example_dict(ex: Example) -> dict:
    """What the agent receives: plain data, no rlvr type."""
    return {**ex.meta, "prompt": ex.prompt, "answer": ex.answer}


class Round:
    """One batch of episodes served through the endpoint, driven from the calling thread."""

    def __init__(self, engine, tokenizer, examples: list[Example], seeds: torch.Tensor, temperature,
                 settings: AgentSettings, *, batch_wait_s: float, episode_timeout_s: float):
        self.engine, self.tokenizer, self.settings = engine, tokenizer, settings
        self.seeds, self.temperature = seeds, temperature
        self.batch_wait_s, self.episode_timeout_s = batch_wait_s, episode_timeout_s
        self.episodes = {uuid.uuid4().hex: Episode("", int(s), row) for row, s in enumerate(seeds.tolist())}
        for key, ep in self.episodes.items():
            ep.key = key
        self.examples = dict(zip(self.episodes, examples))
        self.outcomes: dict[str, object] = {}
        self.inbox: queue.Queue = queue.Queue()

    def submit(self, key: str, call: dict) -> Future | None:
        """Called from the server thread: queue a checked request; None for an episode not running."""
        ep = self.episodes.get(key)
        if ep is None or ep.closed:
            return None
        future: Future = Future()
        self.inbox.put(("call", key, call, future))
        return future

    def report(self, key: str, outcome) -> None:
        """Called from an agent's thread when it returns or raises."""
        self.inbox.put(("done", key, outcome, None))

    def drive(self) -> list[Trajectory]:
        """Serve calls until every episode has ended (or the deadline); the episodes' trajectories."""
        deadline = time.monotonic() + self.episode_timeout_s
        pending: list[tuple[str, dict, Future]] = []
        first_at = None
        live = set(self.episodes)
        while live:
            now = time.monotonic()
            if now > deadline:
                break
            wait = min(deadline - now, self.batch_wait_s - (now - first_at) if first_at else 1.0)
            try:
                items = [self.inbox.get(timeout=max(wait, 0.0))]
            except queue.Empty:
                items = []
            while not self.inbox.empty():
                items.append(self.inbox.get_nowait())
            for kind, key, payload, future in items:
                if kind == "call":
                    pending.append((key, payload, future))
                    first_at = first_at or time.monotonic()
                elif key in live:
                    self._close(key, payload)
                    live.discard(key)
            waiting = live - {key for key, _, _ in pending}
            if pending and (not waiting or time.monotonic() - first_at >= self.batch_wait_s):
                self._sample(pending)
                pending, first_at = [], None
        late = TimeoutError(f"did not return within {self.episode_timeout_s:g} s (episode_timeout_s)")
        for key in live:
            self._close(key, late)
        for _, _, future in pending:
            _answer(future, CallError(504, "timeout", "the episode ended (episode_timeout_s)"))
        blank = self.tokenizer("", add_special_tokens=True).input_ids or [self.tokenizer.pad_token_id]
        return [finish_episode(self.episodes[key], self.outcomes[key], blank) for key in self.episodes]

    def _close(self, key: str, outcome) -> None:
        self.episodes[key].closed = True
        self.outcomes[key] = outcome

    def _prompt(self, ep: Episode, call: dict) -> list[int] | CallError:
        if ep.calls >= self.settings.max_turns:
            return CallError(400, "turn_limit", f"this episode made its {self.settings.max_turns} calls (max_turns)")
        try:
            if call["kind"] == "chat":
                ids, kept = chat_prompt(ep, self.tokenizer, call["messages"], call["tools"])
            else:
                ids, kept = completion_prompt(ep, self.tokenizer, call["prompt"])
        except CallError as err:
            return err
        if len(ids) >= self.settings.max_total_tokens:
            return CallError(400, "context_length_exceeded", f"the prompt is {len(ids)} tokens; this run allows "
                             f"{self.settings.max_total_tokens} per episode (max_total_tokens), completion included")
        call["_kept"] = kept
        return ids

    def _sample(self, pending: list[tuple[str, dict, Future]]) -> None:
        rows = []
        for key, call, future in pending:
            ep = self.episodes[key]
            got = self._prompt(ep, call) if not (ep.closed or future.done()) else None
            if isinstance(got, list):
                rows.append((ep, call, future, got))
            elif got is not None:
                _answer(future, got)
        if not rows:
            return
        ids, mask = left_pad([r[3] for r in rows], self.tokenizer.pad_token_id)
        index = torch.tensor([ep.row for ep, *_ in rows])
        seeds = turn_seeds(self.seeds[index], torch.tensor([ep.calls for ep, *_ in rows]))
        temp = self.temperature[index] if isinstance(self.temperature, torch.Tensor) else self.temperature
        out = self.engine(ids, mask, seeds, temperature=temp)
        lengths = out.completion_mask.sum(-1).long().tolist()
        for row, (ep, call, future, prompt_ids) in enumerate(rows):
            new = out.completion_ids[row, :lengths[row]].tolist()
            logprobs = out.logprobs[row, :lengths[row]].tolist()
            _answer(future, self._record(ep, call, prompt_ids, new, logprobs))

    def _record(self, ep: Episode, call: dict, prompt_ids: list[int], new: list[int], logprobs: list[float]) -> dict:
        limit = min(call["max_tokens"] or len(new), self.settings.max_total_tokens - len(prompt_ids))
        cut = len(new) > limit
        new, logprobs = new[:limit], logprobs[:limit]
        ended = bool(new) and new[-1] == self.tokenizer.eos_token_id
        begin_call(ep, prompt_ids, call["_kept"])
        finish = end_call(ep, new, logprobs, ended=ended, cut=cut)
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        reply = None
        if call["kind"] == "chat":
            names = {t["function"]["name"] for t in call["tools"] or []}
            content, tool_calls = parse_tool_calls(text, names, f"call_{ep.key[:8]}_{ep.calls}")
            reply = {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}
            finish = "tool_calls" if tool_calls and ended else finish
        ep.records.append(Record(call.get("messages"), reply, prompt_ids + new))
        return _response(call, ep, reply, text, finish, prompt_ids, new, logprobs, self.tokenizer)


def _response(call, ep, reply, text, finish, prompt_ids, new, logprobs, tokenizer) -> dict:
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(new),
             "total_tokens": len(prompt_ids) + len(new)}
    lp = None
    if call["logprobs"]:
        lp = {"content": [{"token": f"token_id:{i}", "logprob": x, "bytes": None, "top_logprobs": []}
                          for i, x in zip(new, logprobs)]}
    choice = {"index": 0, "finish_reason": finish, "logprobs": lp, "token_ids": new}
    if reply is not None:
        choice["message"] = reply
        kind = "chat.completion"
    else:
        choice["text"] = text
        kind = "text_completion"
    return {"id": f"rlvr-{ep.key[:12]}-{ep.calls}", "object": kind, "created": int(time.time()), "model": "policy",
            "choices": [choice], "usage": usage, "prompt_token_ids": prompt_ids}


def _answer(future: Future, value) -> None:
    if not future.done():
        future.set_result(value)


def run_agent(agent, url: str, token: str, example: dict, *, timeout_s: float, report) -> threading.Thread:
    """Start `agent(client, example)` in a daemon thread with an event loop of its own; `report(outcome)`
    gets its return value or the exception that ended it."""
    import openai  # in the calling thread: agent threads importing it at once deadlock on the import lock

    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key=token, max_retries=0, timeout=timeout_s)
        try:
            return await asyncio.wait_for(agent(client, example), timeout_s)
        finally:
            await client.close()

    def target():
        try:
            outcome = asyncio.run(main())
        except (Exception, SystemExit, asyncio.CancelledError) as err:  # noqa: BLE001 - the agent's failure is its episode's
            outcome = err if isinstance(err, Exception) else RuntimeError(f"ended with {type(err).__name__}")
        report(outcome)

    thread = threading.Thread(target=target, daemon=True, name="rlvr-agent")
    thread.start()
    return thread


class AgentFnTask:
    """A task whose episodes are runs of `agent(client, example)` (see the module docstring).

    `examples`: a task (its `sample` and `heldout` give the examples) or a list of `Example`s or
    dicts with `prompt` (and `answer`); a list is split by a hash of the prompt, a tenth held out."""

    def __init__(self, agent, examples, *, max_turns: int = 4, max_total_tokens: int = 256,
                 episode_timeout_s: float = 120.0, batch_wait_s: float = 0.2, train_drifted: bool = False,
                 max_body_bytes: int = 1 << 20, heldout_size: int = 64):
        if not inspect.iscoroutinefunction(agent):
            raise ConfigError("agent: must be an `async def run(client, example)` function")
        if max_turns < 1 or max_total_tokens < 2 or episode_timeout_s <= 0 or batch_wait_s < 0:
            raise ConfigError("AgentFnTask: needs max_turns >= 1, max_total_tokens >= 2, episode_timeout_s > 0, "
                              "batch_wait_s >= 0")
        self.agent, self.source = agent, examples
        self.settings = AgentSettings(max_turns, max_total_tokens, 0.0, True, train_drifted, episode_timeout_s)
        self.batch_wait_s, self.episode_timeout_s = batch_wait_s, episode_timeout_s
        self.endpoint = Endpoint(max_body_bytes=max_body_bytes, call_timeout_s=episode_timeout_s,
                                 max_model_len=max_total_tokens)
        self._pool = None if hasattr(examples, "sample") else [_as_example(e) for e in examples]
        if self._pool is not None and not self._pool:
            raise ConfigError("examples: the list is empty")
        self.heldout_size = heldout_size

    def make_env(self):
        raise ConfigError("AgentFnTask: its episodes are an agent function's, there is no environment to play "
                          "demonstrations with; warm-start the model with `rlvr sft` on a text task instead")

    def sample(self, n: int, rng: random.Random | None = None) -> list[Example]:
        rng = rng or random.Random()
        if self._pool is None:
            return self.source.sample(n, rng)
        train = [e for e in self._pool if not _held(e)] or self._pool
        return [rng.choice(train) for _ in range(n)]

    def heldout(self) -> list[Example]:
        if self._pool is None:
            return self.source.heldout()
        return [e for e in self._pool if _held(e)][:self.heldout_size]

    def reward(self, prompt: str, completion: str, **example) -> float:
        raise ConfigError("AgentFnTask: rewards come from the agent function; there is no text verifier")

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.reward(example.prompt, completion)

    def rollout_episodes(self, engine, tokenizer, examples: list[Example], seeds: torch.Tensor, *,
                         temperature) -> list[Trajectory]:
        """One episode per example, each a run of the agent through the endpoint."""
        endpoint = self.endpoint.start()
        rnd = Round(engine, tokenizer, examples, seeds, temperature, self.settings, batch_wait_s=self.batch_wait_s,
                    episode_timeout_s=self.episode_timeout_s)
        endpoint.submit = rnd.submit
        try:
            for key, ex in rnd.examples.items():
                run_agent(self.agent, endpoint.url(key), endpoint.token, example_dict(ex),
                          timeout_s=self.episode_timeout_s, report=lambda out, key=key: rnd.report(key, out))
            return rnd.drive()
        finally:
            endpoint.submit = lambda episode, call: None

    def close(self) -> None:
        self.endpoint.close()


def _as_example(e) -> Example:
    if isinstance(e, Example):
        return e
    if not isinstance(e, dict) or not isinstance(e.get("prompt"), str):
        raise ConfigError(f"examples: each must be an Example or a dict with a string 'prompt', got {e!r:.80}")
    meta = {k: v for k, v in e.items() if k not in ("prompt", "answer")}
    return Example(e["prompt"], str(e.get("answer", "")), meta)


def _held(e: Example) -> bool:
    return is_heldout_key(hashlib.sha256(e.prompt.encode()).hexdigest())
