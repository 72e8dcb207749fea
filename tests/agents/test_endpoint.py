"""The OpenAI-compatible endpoint: a black-box agent (openai client only, a tool, several turns)
trains on exactly the ids the engine sampled; history rewrites are counted as drift; the server
refuses requests without the run's token and survives malformed ones."""

import asyncio

import pytest
import torch
from _blackbox import TOOLS, reverse_agent

from rlvr.agents.agent_fn import AgentFnTask
from rlvr.agents.batch import to_rollouts
from rlvr.agents.collect import rollout_batch
from rlvr.agents.sessions import render
from rlvr.models.tokenizer import char_tokenizer

pytest.importorskip("fastapi")
pytest.importorskip("openai")

EXAMPLES = [{"prompt": "reverse abc", "answer": "cba"}, {"prompt": "reverse dog", "answer": "god"}]
COMPACT = '<tool_call>{"name":"reverse","arguments":{"text":"abc"}}</tool_call>'  # re-renders with spaces


@pytest.fixture
def chat_tok():
    return char_tokenizer()  # no chat template of its own: the endpoint's plain one (Hermes tool calls)


def _task(agent=reverse_agent, **kw):
    return AgentFnTask(agent, EXAMPLES, batch_wait_s=kw.pop("batch_wait_s", 5.0), **{"max_total_tokens": 2000, **kw})


def _roll(engine, tok, task, n):
    """`rollout_batch` of the first `n` examples through `task`'s endpoint (closed afterwards)."""
    try:
        return rollout_batch(engine, tok, task, _examples(task, n), torch.arange(n), temperature=1.0)
    finally:
        task.close()


def _examples(task, n):
    from rlvr.types import Example
    return [Example(e["prompt"], e["answer"]) for e in EXAMPLES][:n]


def test_blackbox_agent_trains_on_the_ids_the_engine_sampled(chat_tok, scripted):
    engine = scripted(chat_tok, [[COMPACT, "cba"], ["god"]])
    got = _roll(engine, chat_tok, _task(), 2)
    t0, t1 = got.trajectories
    assert [t0.reward, t1.reward] == [1.0, 1.0] and t0.success and not t0.drifted and not t1.drifted
    assert len(t0.turns) == 2 and len(t1.turns) == 1 and t0.counts["tool_calls"] == 1
    fed = {(row, turn): ids for row, turn, ids in engine.prompts}
    for row, t in enumerate(got.trajectories):
        for k, turn in enumerate(t.turns):
            sampled = t.ids[turn.start:turn.end]
            text = engine.script[row][k]
            assert sampled == chat_tok(text, add_special_tokens=False).input_ids + [chat_tok.eos_token_id]
            assert t.logprobs[turn.start:turn.end] == pytest.approx([engine.logprob(row, k, j)
                                                                     for j in range(len(sampled))])
            assert fed[(row, k)] == t.ids[:turn.start]  # the engine was fed the kept ids, nothing re-tokenised
            assert set(t.mask[turn.start:turn.end]) == {1}
    assert sum(t0.mask) == sum(turn.end - turn.start for turn in t0.turns)  # the tool's output is not trained
    tool_obs = chat_tok.decode(t0.ids[t0.turns[0].end:t0.turns[1].start])
    assert tool_obs == "\n<|tool|>cba\n<|assistant|>"
    # a message-level re-render would have trained on other ids: the sampled compact JSON comes back spaced
    again = chat_tok(render(chat_tok, [
        {"role": "system", "content": "answer with the reversed word"}, {"role": "user", "content": "reverse abc"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "reverse", "arguments": '{"text": "abc"}'}}]}], TOOLS, False), add_special_tokens=False).input_ids
    assert again[:t0.turns[0].end] != t0.ids[:t0.turns[0].end]
    r = to_rollouts(got.trajectories, chat_tok.pad_token_id)
    assert r.completion_mask.sum() == sum(sum(t.mask) for t in got.trajectories)


def test_a_rewritten_history_is_counted_as_drift_and_kept_out_of_the_loss(chat_tok, scripted):
    async def forgetful(client, example):  # drops its first exchange before the second call
        first = [{"role": "user", "content": example["prompt"]}]
        await client.chat.completions.create(model="m", messages=first)
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        return float(reply.choices[0].message.content == example["answer"])

    engine = scripted(chat_tok, [["x", "cba"]])
    got = _roll(engine, chat_tok, _task(forgetful), 1)
    (t,) = got.trajectories
    assert t.reward == 1.0 and t.drifted and got.metrics["agent/drifted"] == 1.0
    assert got.rollouts.completion_mask.sum() == 0  # drifted: out of the loss (train_drifted=False)
    assert chat_tok.decode(t.ids[:t.prompt_len]) == "<|user|>again\n<|assistant|>"  # the last chain


def test_a_crashing_or_hung_agent_fails_only_its_episode(chat_tok, scripted):
    async def flaky(client, example):
        if example["prompt"].endswith("dog"):
            await asyncio.sleep(60)  # hung
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        if reply.choices[0].message.content == "boom":
            raise RuntimeError("agent bug")
        return 1.0

    engine = scripted(chat_tok, [["boom"], ["ok"], ["fine"]])
    from rlvr.types import Example
    rows = [Example("reverse abc", "cba"), Example("reverse dog", "god"), Example("reverse abc", "cba")]
    task = AgentFnTask(flaky, EXAMPLES, episode_timeout_s=3.0, batch_wait_s=0.05, max_total_tokens=500)
    try:
        got = rollout_batch(engine, chat_tok, task, rows, torch.arange(3), temperature=1.0)
    finally:
        task.close()
    crashed, hung, fine = got.trajectories
    assert crashed.finish == hung.finish == "env_error" and fine.finish == "done" and fine.reward == 1.0
    assert "agent bug" in crashed.error and "TimeoutError" in hung.error and hung.counts["env_timeouts"] == 1


def _malformed(rng, url: str, token: str) -> list[tuple[str, dict, bytes]]:
    """100 bad requests: (url, headers, body)."""
    import json
    good = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    chat = url + "/chat/completions"
    bodies = [
        b"{", b"not json", b"\xff\xfe\x00", b"[]", b"3", b'"text"', b"null", b"{}",
        json.dumps({"messages": []}).encode(), json.dumps({"messages": "hi"}).encode(),
        json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(),
        json.dumps({"messages": [{"role": None, "content": "hi"}]}).encode(),
        json.dumps({"messages": [{"role": 5}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": {"a": 1}}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}).encode(),
        json.dumps({"messages": [{"role": "assistant", "content": "x"}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "stream_options": "yes"}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": "all"}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}).encode(),
        json.dumps({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # deep nesting
    ]
    out = []
    for i in range(100):
        kind = i % 5
        if kind == 0:  # no token, or a wrong one
            headers = {} if i % 10 else {"Authorization": "Bearer wrong"}
            out.append((chat, headers, json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()))
        elif kind == 1:  # a huge body
            out.append((chat, good, b'{"messages": "' + b"a" * (1 << 21) + b'"}'))
        elif kind == 2:  # fuzzed bytes
            out.append((chat, good, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))))
        elif kind == 3:  # wrong roles, wrong fields
            out.append((chat, good, bodies[rng.randrange(len(bodies))]))
        else:  # an episode that is not running, a completion without a prompt
            out.append((url.replace("/e/", "/e/0") + "/chat/completions", good,
                        json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode())
                       if i % 10 == 4 else (url + "/completions", good, b'{"prompt": 3}'))
    return out


def test_the_endpoint_refuses_malformed_requests_and_training_is_unchanged(chat_tok, scripted):
    import random

    import httpx

    statuses = []

    async def fuzzing_agent(client, example):  # attacks its own endpoint, then plays as usual
        async with httpx.AsyncClient(timeout=30) as http:
            for url, headers, body in _malformed(random.Random(0), str(client.base_url).rstrip("/"), client.api_key):
                statuses.append((await http.post(url, headers=headers, content=body)).status_code)
        return await reverse_agent(client, example)

    runs = []
    for agent in (reverse_agent, fuzzing_agent):
        engine = scripted(chat_tok, [[COMPACT, "cba"]])
        runs.append(_roll(engine, chat_tok, _task(agent), 1))
        runs[-1].prompts = engine.prompts
    assert len(statuses) == 100 and all(400 <= s < 500 for s in statuses), statuses
    assert {401, 413, 400, 404} <= set(statuses)
    (clean,), (fuzzed,) = runs[0].trajectories, runs[1].trajectories
    assert fuzzed.ids == clean.ids and fuzzed.logprobs == clean.logprobs and fuzzed.mask == clean.mask
    assert fuzzed.reward == clean.reward == 1.0 and runs[1].prompts == runs[0].prompts


def test_models_route_needs_the_token(chat_tok):
    import httpx

    task = _task()
    try:
        endpoint = task.endpoint.start()
        url = endpoint.url("x") + "/models"
        assert httpx.get(url).status_code == 401
        got = httpx.get(url, headers={"Authorization": f"Bearer {endpoint.token}"}).json()
        assert got["data"][0]["max_model_len"] == 2000
        assert endpoint.url("x").startswith("http://127.0.0.1:")
    finally:
        task.close()


def test_completions_extend_the_kept_ids_and_logprobs_come_back(chat_tok, scripted):
    seen = {}

    async def completer(client, example):
        first = await client.completions.create(model="m", prompt=example["prompt"], logprobs=1)
        text = example["prompt"] + first.choices[0].text + "<eos> more:"
        second = await client.completions.create(model="m", prompt=text)
        seen["first"], seen["second"] = first.model_dump(), second.model_dump()
        return 1.0

    engine = scripted(chat_tok, [["ab", "cd"]])
    got = _roll(engine, chat_tok, _task(completer), 1)
    (t,) = got.trajectories
    first, second = seen["first"], seen["second"]
    assert first["choices"][0]["token_ids"] == chat_tok("ab", add_special_tokens=False).input_ids + [2]
    assert [x["logprob"] for x in first["choices"][0]["logprobs"]["content"]] == pytest.approx(
        [engine.logprob(0, 0, j) for j in range(3)])
    # the second prompt is the first prompt, the sampled ids (EOS included) and the new text's ids
    assert second["prompt_token_ids"] == first["prompt_token_ids"] + first["choices"][0]["token_ids"] + \
        chat_tok(" more:", add_special_tokens=False).input_ids
    assert not t.drifted and sum(t.mask) == 6
    assert t.ids == second["prompt_token_ids"] + second["choices"][0]["token_ids"]


def test_trainer_runs_a_blackbox_agent_end_to_end(tmp_path):
    """`rlvr.Trainer` on an `AgentFnTask`: a fresh tiny model's two-turn episodes through the endpoint
    are trained on (both turns' ids in the loss), evaluated and logged."""
    from rlvr import Trainer

    async def two_turns(client, example):
        messages = [{"role": "user", "content": example["prompt"]}]
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "ok"}]
        second = await client.chat.completions.create(model="policy", messages=messages)
        return (second.choices[0].message.content or "").count("a") / 4

    task = AgentFnTask(two_turns, [{"prompt": f"say {w}"} for w in "abcdefgh"], max_turns=2, max_total_tokens=96,
                       batch_wait_s=2.0, heldout_size=2)
    try:
        final = Trainer("", train_dataset=task, overrides={
            "trainer.steps": 2, "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 4,
            "model.max_seq_len": 128, "trainer.eval_every": 0, "trainer.out_dir": str(tmp_path)}).train()
    finally:
        task.close()
    assert final["agent/turns_mean"] == 2.0 and final["agent/env_errors"] == 0.0 and final["agent/drifted"] == 0.0
    assert 2.0 <= final["agent/action_tokens_mean"] <= 8.0  # up to 4 sampled ids in each of the two turns


def test_a_streamed_chat_answer_reassembles_to_the_plain_one(chat_tok, scripted):
    got = {}

    async def streamer(client, example):
        messages = [{"role": "user", "content": example["prompt"]}]
        stream = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                      stream_options={"include_usage": True})
        content, calls, finish, usage = "", {}, None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for c in choice.delta.tool_calls or []:
                    calls.setdefault(c.index, {"id": c.id, "name": c.function.name, "arguments": ""})
                    calls[c.index]["arguments"] += c.function.arguments or ""
                finish = choice.finish_reason or finish
        got.update(content=content, calls=calls, finish=finish, usage=usage)
        messages.append({"role": "assistant", "content": content or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "cba"})
        final = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return float(final.choices[0].message.content == "cba")

    engine = scripted(chat_tok, [[COMPACT, "cba"]])
    (t,) = _roll(engine, chat_tok, _task(streamer), 1).trajectories
    assert got["finish"] == "tool_calls" and got["calls"][0]["name"] == "reverse" and got["content"] == ""
    assert got["calls"][0]["arguments"] == '{"text": "abc"}' and got["usage"].completion_tokens == len(COMPACT) + 1
    assert t.reward == 1.0 and not t.drifted and len(t.turns) == 2  # the streamed reply, echoed, extends the ids
