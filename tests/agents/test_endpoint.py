"""The OpenAI-compatible endpoint: a black-box agent (openai client only, a tool, several turns)
trains on exactly the ids the engine sampled; history rewrites are counted as drift; the server
refuses requests without the run's token and survives malformed ones."""

import asyncio

import pytest
import torch
from _blackbox import reverse_agent
from _chat_templates import HERMES

from rlvr.agents.agent_fn import AgentFnTask
from rlvr.agents.batch import to_rollouts
from rlvr.agents.collect import rollout_batch
from rlvr.models.tokenizer import char_tokenizer

pytest.importorskip("fastapi")
pytest.importorskip("openai")

EXAMPLES = [{"prompt": "reverse abc", "answer": "cba"}, {"prompt": "reverse dog", "answer": "god"}]
COMPACT = '<tool_call>{"name":"reverse","arguments":{"text":"abc"}}</tool_call>'  # re-renders with spaces


@pytest.fixture
def chat_tok():
    tok = char_tokenizer()
    tok.chat_template = HERMES
    return tok


def _task(agent=reverse_agent, **kw):
    return AgentFnTask(agent, EXAMPLES, batch_wait_s=kw.pop("batch_wait_s", 5.0), **{"max_total_tokens": 2000, **kw})


def _examples(task, n):
    from rlvr.types import Example
    return [Example(e["prompt"], e["answer"]) for e in EXAMPLES][:n]


def test_blackbox_agent_trains_on_the_ids_the_engine_sampled(chat_tok, scripted):
    engine = scripted(chat_tok, [[COMPACT, "cba"], ["god"]])
    task = _task()
    try:
        got = rollout_batch(engine, chat_tok, task, _examples(task, 2), torch.arange(2), temperature=1.0)
    finally:
        task.close()
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
    again = chat_tok(chat_tok.apply_chat_template([
        {"role": "system", "content": "answer with the reversed word"}, {"role": "user", "content": "reverse abc"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "reverse", "arguments": {"text": "abc"}}}]}], tools=None, tokenize=False),
        add_special_tokens=False).input_ids
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
    task = _task(forgetful)
    try:
        got = rollout_batch(engine, chat_tok, task, _examples(task, 1), torch.arange(1), temperature=1.0)
    finally:
        task.close()
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
