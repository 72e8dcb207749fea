"""Environments and tools: seeded, picklable, held-out disjoint; schemas from type hints;
failures as observations."""

import gc
import pickle
import random
import sys
import threading
import time

import pytest

from rlvr.agents.env import GymAdapter, StepResult
from rlvr.agents.envs.calculator import Calculator, CalculatorEnv, calc
from rlvr.agents.envs.guess import GuessEnv, GuessNumber
from rlvr.agents.tools import ToolCall, ToolRegistry, parse_action, schema


def lookup(key: str, hops: int = 1, exact: bool = False) -> str:
    """Look a key up."""
    return f"{key}:{hops}:{exact}"


def test_schema_from_type_hints():
    s = schema(lookup)["function"]
    assert s["name"] == "lookup" and s["description"] == "Look a key up."
    assert s["parameters"]["properties"] == {"key": {"type": "string"}, "hops": {"type": "integer"},
                                             "exact": {"type": "boolean"}}
    assert s["parameters"]["required"] == ["key"]


def test_registry_calls_by_name_and_reports_errors():
    reg = ToolRegistry.of(lookup, calc, timeout_s=1.0)
    assert reg.call(ToolCall("lookup", {"key": "a", "hops": "2"})).text == "a:2:False"  # coerced
    assert reg.call(ToolCall("nope", {})).error == "unknown_tool"
    assert reg.call(ToolCall("lookup", {})).error == "bad_arguments"
    assert reg.call(ToolCall("lookup", {"key": "a", "hops": "x"})).error == "bad_arguments"
    assert reg.call(ToolCall("calc", {"expression": "__import__('os')"})).error == "raised"
    assert calc("(12+3)*4-5") == "55"


def test_parse_tags_and_hermes_json():
    reg = ToolRegistry.of(lookup, calc)
    p = parse_action("<calc>2*3</calc>", reg)
    assert p.calls == (ToolCall("calc", {"expression": "2*3"}, "2*3"),) and p.answer is None
    p = parse_action('<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>', reg)
    assert p.calls[0].name == "lookup" and p.calls[0].arguments == {"key": "k"}
    assert parse_action("<answer> 7 </answer>", reg).answer == "7"
    assert parse_action("<tool_call>{not json</tool_call>", reg).malformed
    assert parse_action("just text", reg).malformed
    assert parse_action("<other>1</other>", reg).malformed


def test_envs_are_seeded_and_picklable():
    for env in (CalculatorEnv(), GuessEnv()):
        first = env.reset(123)
        clone = pickle.loads(pickle.dumps(env))
        assert clone.reset(123) == first and clone.answer == env.answer
        assert env.reset(124) != first or env.answer != CalculatorEnv().reset(123)


def test_heldout_is_disjoint_from_training_draws():
    task = Calculator(heldout_size=50)
    held = {ex.meta["key"] for ex in task.heldout()}
    assert len(held) == 50
    train = {ex.meta["key"] for ex in task.sample(2000, random.Random(0))}
    assert not held & train
    assert task.heldout() == Calculator(heldout_size=50).heldout()  # fixed


def test_guess_feedback_and_scripted_bisection():
    env = GuessEnv(high=64)
    env.reset(5)
    policy = env.scripted(True, random.Random(0))
    obs, turns = "", 0
    while True:
        obs, reward, done, info = env.step(policy(obs))
        turns += 1
        if done:
            break
    assert reward > 0 and turns <= 7
    task = GuessNumber(heldout_size=4)
    assert len(task.heldout()) == 4


def test_calculator_without_tools_refuses_the_call():
    env = CalculatorEnv(tools=False)
    env.reset(0)
    obs, reward, done, info = env.step(f"<calc>{env.key}</calc>")
    assert info["tool_errors"] == 1 and not done and reward == 0
    assert Calculator(tools=False).settings.max_turns == 1


def test_a_tool_with_latency_answers_the_same_after_its_wait():
    plain, slow = CalculatorEnv(), CalculatorEnv(latency_s=0.2)
    for env in (plain, slow):
        env.reset(3)
    assert slow.registry.schemas() == plain.registry.schemas()  # the same name and signature to the model
    t0 = time.perf_counter()
    answer = slow.step(f"<calc>{slow.key}</calc>")
    assert time.perf_counter() - t0 >= 0.2
    assert answer == plain.step(f"<calc>{plain.key}</calc>")
    assert Calculator(tool_latency_s=0.2).make_env().latency_s == 0.2
    with pytest.raises(ValueError, match="tool_latency_s"):
        Calculator(tool_latency_s=-1.0)


class _Cycle:
    """Cyclic garbage with a finaliser: the collector runs Python code, where the GIL may pass."""

    def __init__(self):
        self.me = self

    def __del__(self):
        sum(range(50))


def test_calc_gives_the_same_answer_from_many_threads_at_once():
    """Episodes step their tools in threads of their own. CPython < 3.13 counts the AST
    conversion's recursion depth in module-wide state, so two parses at once with the collector
    switching threads mid-parse raised `SystemError: AST constructor recursion depth mismatch`
    (a valid call became an error observation, depending on timing). Without the parse lock this
    fails ~50 calls of 2400 on 3.11 in a tenth of a second."""
    expression, expected = "(12*34+5)*(6-7)*891", str((12 * 34 + 5) * (6 - 7) * 891)
    answers: list[str] = []
    errors: list[BaseException] = []

    def work():
        for _ in range(300):
            _Cycle()
            try:
                answers.append(calc(expression))
            except Exception as err:  # noqa: BLE001 -- the failure under test
                errors.append(err)

    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(5)
    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*threshold)
    assert errors == [] and answers == [expected] * 2400


class _GymLike:
    """gymnasium>=0.26 signatures: reset(seed=) -> (obs, info); step -> 5-tuple."""

    def reset(self, seed=None):
        self.n = seed
        return f"start {seed}", {}

    def step(self, action):
        return f"got {action}", 1.0, action == "stop", False, {"x": 1}


def test_gym_adapter():
    env = GymAdapter(_GymLike())
    assert env.reset(3) == "start 3"
    out = env.step("go")
    assert isinstance(out, StepResult) and out == StepResult("got go", 1.0, False, {"x": 1})
    assert env.step("stop").done


@pytest.mark.parametrize("bad", [dict(heldout_size=-1), dict(max_turns=0), dict(demo_tool_rate=2.0)])
def test_bad_knobs_raise(bad):
    with pytest.raises(ValueError):
        Calculator(**bad)


def test_lookup_needs_every_hop():
    from rlvr.agents.envs.lookup import LookupEnv

    env = LookupEnv(keys=10, hops=3)
    first = env.reset(4)
    start = first.split()[0]
    obs1 = env.step(f"<lookup>{start}</lookup>").observation
    obs2 = env.step(f"<lookup>{obs1}</lookup>").observation
    obs3 = env.step(f"<lookup>{obs2}</lookup>").observation
    assert obs3 == env.answer
    assert env.step(f"<answer>{obs3}</answer>").reward == 1.0
    assert pickle.loads(pickle.dumps(env)).reset(4) == first


def test_countdown_python_tool_runs_in_the_sandbox():
    from rlvr.tasks.countdown_python import CountdownPythonEnv

    env = CountdownPythonEnv(tool_timeout_s=20.0, wall_s=5.0)
    env.reset(0)
    obs, _, done, info = env.step("<python>print(6*7)</python>")
    assert obs == "42" and not done and info["tool_calls"] == 1
    obs, _, _, info = env.step("<python>import sys; sys.exit(3)</python>")
    assert not obs.startswith("42")  # a failing program is reported, not raised
    solution = env.countdown.solution(env.example)
    assert env.step(f"<answer>{solution}</answer>").reward == 1.0


def test_turn_tensors_survive_row_selection_and_concat():
    import torch

    from rlvr.agents.batch import TurnTensors

    a = TurnTensors(torch.tensor([[0, 0, 1]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[5, 6]]),
                    torch.tensor([[True, True]]))
    b = TurnTensors(torch.tensor([[0]]), torch.tensor([[1.0]]), torch.tensor([[5]]), torch.tensor([[True]]))
    c = TurnTensors.concat([a, b]).select(torch.tensor([1, 0]))
    assert c.turn_index.tolist() == [[0, -1, -1], [0, 0, 1]]
    assert c.states.tolist() == [[5, -1], [5, 6]] and c.valid.tolist() == [[True, False], [True, True]]


def test_parse_action_finds_what_a_backreferencing_pattern_finds_without_its_cost():
    import re

    from rlvr.agents import tools

    hermes, tag = re.compile(r"<tool_call>(.*?)</tool_call>", re.S), re.compile(r"<([a-z_][a-z0-9_]*)>(.*?)</\1>", re.S)
    rng = random.Random(0)
    parts = ["<a>", "</a>", "<ab>", "</ab>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "x", "<", "/"]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        blocks = tools._hermes_blocks(text)
        assert [text[s + 11:e - 12] for s, e in blocks] == hermes.findall(text)
        assert tools._tags(hermes.sub("", text)) == tag.findall(hermes.sub("", text))
    hostile = "<calc>" * 200_000 + "<tool_call>" * 50_000  # unclosed: a lazy pattern rescans to the end each time
    assert parse_action(hostile, ToolRegistry.of(calc)).malformed
