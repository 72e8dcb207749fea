"""The multi-turn rollout: exact ids and masks, limits, failures counted, drift caught."""

import dataclasses
import random
import threading

import pytest
import torch
from _chat_templates import CHAT_TEMPLATES

from rlvr.agents.batch import agent_metrics, to_rollouts, turn_tensors
from rlvr.agents.env import FinishReason, StepResult
from rlvr.agents.envs.calculator import CalculatorEnv
from rlvr.agents.render import ChatRenderer, TagRenderer
from rlvr.agents.rollout import Limits, run_episodes
from rlvr.agents.task import ToolEnv
from rlvr.models.tokenizer import char_tokenizer

DEFAULT = Limits(3, 96)


def _run(engine, renderer, envs, tok, limits=DEFAULT):
    return run_episodes(engine, renderer, envs, list(range(len(envs))), torch.arange(len(envs)),
                        temperature=1.0, limits=limits, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)


def test_mask_is_one_exactly_on_sampled_ids_and_logprobs_align(tokenizer, scripted):
    envs = [CalculatorEnv(), CalculatorEnv()]
    keys = [CalculatorEnv().reset(i).strip() for i in range(2)]
    answers = [str(eval(k)) for k in keys]  # noqa: S307 - test-side reference
    script = [[f"<calc>{keys[0]}</calc>", f"<answer>{answers[0]}</answer>"], [f"<answer>{answers[1]}</answer>"]]
    engine = scripted(tokenizer, script)
    trajs = _run(engine, TagRenderer(tokenizer), envs, tokenizer)
    t = trajs[0]
    text = tokenizer.decode(t.ids, skip_special_tokens=False)
    assert text == f"<bos>{keys[0]}\n<calc>{keys[0]}</calc><eos><r>{answers[0]}</r><answer>{answers[0]}</answer><eos>"
    sampled = [tokenizer(s, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for s in script[0]]
    trained = [i for i, m in zip(t.ids, t.mask) if m]
    assert trained == sampled[0] + sampled[1]
    assert sum(t.mask) == sum(len(s) for s in sampled)
    assert len(t.ids) == len(t.mask) == len(t.logprobs) == len(t.turn_index)
    first, second = t.turns
    assert t.mask[first.start:first.end] == [1] * len(sampled[0])
    assert t.mask[first.end:first.obs_end] == [0] * len(tokenizer(f"<r>{answers[0]}</r>").input_ids)
    assert t.logprobs[first.start:first.end] == pytest.approx([engine.logprob(0, 0, j) for j in range(len(sampled[0]))])
    second_lp = [engine.logprob(0, 1, j) for j in range(len(sampled[1]))]
    assert t.logprobs[second.start:second.end] == pytest.approx(second_lp)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if not m)
    assert t.turn_index[first.end:first.obs_end] == [0] * (first.obs_end - first.end)
    assert (t.reward, t.success, t.finish) == (1.0, True, FinishReason.DONE)
    # each turn's engine prompt is a prefix of the final sequence (token in, token out)
    for row, _turn, prompt in engine.prompts:
        assert trajs[row].ids[:len(prompt)] == prompt
    r = to_rollouts(trajs, tokenizer.pad_token_id)
    assert r.completion_mask.sum().item() == sum(sum(t.mask) for t in trajs)
    assert torch.equal(r.logprobs * (1 - r.completion_mask), torch.zeros_like(r.logprobs))
    tt = turn_tensors(trajs)
    assert tt.valid.tolist() == [[True, True], [True, False]]
    assert tt.rewards.tolist() == [[0.0, 1.0], [1.0, 0.0]]


def test_sampled_ids_are_kept_not_reencoded_and_drift_is_flagged(tokenizer, scripted):
    """The engine samples a <pad> inside an action: decode drops it, so re-rendering differs."""
    env = CalculatorEnv()
    key = CalculatorEnv().reset(0).strip()
    raw = tokenizer(f"<calc>{key}</calc>", add_special_tokens=False).input_ids
    raw = raw[:3] + [tokenizer.pad_token_id] + raw[3:] + [tokenizer.eos_token_id]
    engine = scripted(tokenizer, [["", "<answer>1</answer>"]], raw={(0, 0): raw})
    (t,) = _run(engine, TagRenderer(tokenizer), [env], tokenizer)
    assert t.ids[t.turns[0].start:t.turns[0].end] == raw
    assert t.drifted
    r = to_rollouts([t], tokenizer.pad_token_id)
    assert r.completion_mask.sum() == 0  # left out of the loss by default
    assert to_rollouts([t], tokenizer.pad_token_id, train_drifted=True).completion_mask.sum() == sum(t.mask)
    assert agent_metrics([t])["agent/drifted"] == 1.0
    clean = dataclasses.replace(t, drifted=False)
    assert agent_metrics([t, clean, clean, clean])["agent/drifted"] == 0.25  # the share of trajectories


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATES))
def test_round_trip_through_each_shipped_chat_template(name, scripted):
    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATES[name]
    env = CalculatorEnv()
    key = CalculatorEnv().reset(0).strip()
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "' + key + '"}}</tool_call>'
    engine = scripted(tok, [[call, f"<answer>{eval(key)}</answer>"]])  # noqa: S307
    renderer = ChatRenderer(tok, tools=env.registry.schemas())
    (t,) = _run(engine, renderer, [env], tok, Limits(3, 2000))
    assert t.success and t.counts["tool_calls"] == 1
    assert not t.drifted
    full = tok(tok.apply_chat_template(
        [{"role": "user", "content": f"{key}\n"}, {"role": "assistant", "content": call},
         {"role": "tool", "content": str(eval(key))},  # noqa: S307
         {"role": "assistant", "content": f"<answer>{eval(key)}</answer>"}],  # noqa: S307
        tools=env.registry.schemas(), tokenize=False), add_special_tokens=False).input_ids
    assert full[:len(t.ids)] == t.ids  # the kept ids are the template's own rendering
    assert '"calc"' in tok.decode(t.ids[:t.prompt_len])  # tools= reached the prompt


def test_a_template_that_rerenders_differently_is_caught(scripted):
    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATES["chatml"].replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    env = CalculatorEnv()
    key = CalculatorEnv().reset(0).strip()
    engine = scripted(tok, [[f"<calc>{key}</calc> ", f"<answer>{eval(key)}</answer>"]])  # noqa: S307
    (t,) = _run(engine, ChatRenderer(tok), [env], tok, Limits(3, 2000))
    assert t.drifted  # the sampled trailing space is gone from the re-render


def test_history_rewriting_template_is_caught(scripted):
    tok = char_tokenizer()
    # drops every assistant message but the last one (like templates that strip old reasoning)
    tok.chat_template = CHAT_TEMPLATES["chatml"].replace(
        "{%- for m in messages %}", "{%- for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
    ).replace("{% endfor %}", "{% endif %}{% endfor %}")
    engine_script = [["<calc>1*2</calc>", "<calc>2*3</calc>", "<answer>6</answer>"]]
    (t,) = _run(scripted(tok, engine_script), ChatRenderer(tok), [CalculatorEnv()], tok, Limits(3, 2000))
    assert t.drifted


RELEASE, HANG_RETURNED = threading.Event(), threading.Event()  # the hanging tool's gate


class _Broken(ToolEnv):
    def __init__(self, fail_at: str, **kw):
        self.fail_at = fail_at
        super().__init__(**kw)

    def _tools(self):
        def boom(x: str) -> str:
            """Raises."""
            raise RuntimeError("boom")

        def hang(x: str) -> str:
            """Hangs."""
            RELEASE.wait(30)
            HANG_RETURNED.set()
            return x

        return (boom, hang)

    def _generate(self, rng: random.Random):
        if self.fail_at == "reset":
            raise RuntimeError("reset failed")
        return "go\n", 1, "go"

    def step(self, action_text: str) -> StepResult:
        if self.fail_at == "step":
            raise RuntimeError("step failed")
        return super().step(action_text)


def test_failures_are_counted_and_the_batch_goes_on(tokenizer, scripted):
    envs = [_Broken("none", tool_timeout_s=0.2), _Broken("none", tool_timeout_s=0.2), _Broken("reset"),
            _Broken("step"), _Broken("none"), CalculatorEnv()]
    script = [["<boom>1</boom>", "<answer>1</answer>"], ["<hang>1</hang>", "<answer>1</answer>"], ["x"],
              ["<answer>1</answer>"], ["no tags here", "<answer>1</answer>"], ["<calc>2*</calc>", "<answer>0</answer>"]]
    RELEASE.clear()
    HANG_RETURNED.clear()
    trajs = _run(scripted(tokenizer, script), TagRenderer(tokenizer), envs, tokenizer, Limits(3, 300))
    assert not HANG_RETURNED.is_set()  # the hanging tool did not hold the batch: it is still running
    RELEASE.set()
    boom, hang, reset, step, malformed, bad_call = trajs
    assert boom.counts["tool_errors"] == 1 and boom.turns[0].finish == FinishReason.TOOL_ERROR and boom.success
    assert "RuntimeError: boom" in tokenizer.decode(boom.ids)
    assert hang.counts["tool_timeouts"] == 1 and "timeout" in tokenizer.decode(hang.ids) and hang.success
    assert reset.finish == FinishReason.ENV_ERROR and reset.counts["env_errors"] == 1 and sum(reset.mask) == 0
    assert step.finish == FinishReason.ENV_ERROR and step.reward == 0.0
    assert malformed.counts["malformed"] == 1 and malformed.turns[0].finish == FinishReason.MALFORMED
    assert bad_call.counts["tool_errors"] == 1 and bad_call.finish == FinishReason.DONE
    m = agent_metrics(trajs)
    assert m["agent/env_errors"] == pytest.approx(2 / 6) and m["agent/tool_timeouts"] == pytest.approx(1 / 6)
    r = to_rollouts(trajs, tokenizer.pad_token_id)
    assert r.completion_ids.shape[0] == 6


def test_limits_turns_tokens_and_per_turn_length(tokenizer, scripted):
    envs = [CalculatorEnv(), CalculatorEnv(), CalculatorEnv()]
    script = [["<calc>1*2</calc>"] * 3, ["<calc>1*2</calc>"] * 3, ["<calc>12345|", "<answer>1</answer>"]]
    trajs = _run(scripted(tokenizer, script), TagRenderer(tokenizer), envs, tokenizer, Limits(2, 60))
    turns, budget, length = trajs
    assert turns.finish == FinishReason.TURN_LIMIT and len(turns.turns) == 2
    assert turns.turns[-1].obs_end == turns.turns[-1].end  # no observation after the last allowed action
    assert length.turns[0].finish == FinishReason.LENGTH
    trajs = _run(scripted(tokenizer, script[:1]), TagRenderer(tokenizer), envs[:1], tokenizer, Limits(5, 40))
    (budget,) = trajs
    assert budget.finish == FinishReason.TOKEN_BUDGET and len(budget.ids) <= 40


def test_state_keys_recur_across_a_group(tokenizer, scripted):
    """Every episode starts in the same state; a malformed action leaves it unchanged."""
    from rlvr.agents.envs.guess import GuessEnv

    envs = [GuessEnv(high=64) for _ in range(3)]
    script = [["<guess>32</guess>", "x"], ["oops", "<guess>32</guess>"], ["<guess>10</guess>", "x"]]
    trajs = run_episodes(scripted(tokenizer, script), TagRenderer(tokenizer), envs, [7, 7, 7], torch.arange(3),
                         temperature=1.0, limits=Limits(2, 200), pad_id=tokenizer.pad_token_id,
                         eos_id=tokenizer.eos_token_id)
    states = [[turn.state_key for turn in t.turns] for t in trajs]
    assert states[0][0] == states[1][0] == states[1][1] == states[2][0] == (1, 64)
    assert states[0][1] != states[2][1]
