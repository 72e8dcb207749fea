"""The environments of a turn's episodes step at once: their waits overlap, the trajectories are
the serial loop's, a failing step stays its own episode's, a waiting step gives its core back."""

import functools
import random
import threading
import time

import torch

from rlvr.agents.collect import rollout_batch
from rlvr.agents.env import FinishReason, GymAdapter
from rlvr.agents.envs.calculator import Calculator, CalculatorEnv
from rlvr.agents.render import TagRenderer
from rlvr.agents.rollout import Limits, run_episodes
from rlvr.engines.torch_ar import generate
from rlvr.runtime.rows import CoreLease

N = 4
LIMITS = Limits(3, 96)


def _run(engine, envs, tok, limits=LIMITS):
    return run_episodes(engine, TagRenderer(tok), envs, list(range(len(envs))), torch.arange(len(envs)),
                        temperature=1.0, limits=limits, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)


def _calc_then_answer(n: int) -> list[list[str]]:
    keys = [CalculatorEnv().reset(i).strip() for i in range(n)]
    return [[f"<calc>{k}</calc>", f"<answer>{eval(k)}</answer>"] for k in keys]  # noqa: S307 - test-side reference


class _Meeting(CalculatorEnv):
    """A step that returns only once all N steps of its turn are inside `step` at the same time
    (serial steps would break the barrier); it records when it entered and left."""

    def __init__(self, barrier: threading.Barrier, log: list, **kw):
        self.barrier, self.log = barrier, log
        super().__init__(**kw)

    def step(self, action_text: str):
        entered = time.monotonic()
        self.barrier.wait(timeout=20)
        out = super().step(action_text)
        self.log.append((entered, time.monotonic(), threading.current_thread().name))
        return out


def test_the_steps_of_one_turn_run_at_the_same_time(tokenizer, scripted):
    barrier, log = threading.Barrier(N), []
    envs = [_Meeting(barrier, log, latency_s=0.01) for _ in range(N)]
    trajs = _run(scripted(tokenizer, _calc_then_answer(N)), envs, tokenizer)
    assert [t.finish for t in trajs] == [FinishReason.DONE] * N  # no barrier broke (that would be env_error)
    assert all(t.success and t.counts == {"tool_calls": 1} for t in trajs)
    assert len(log) == 2 * N
    first_turn = sorted(log)[:N]  # every step of turn 1 entered before any of them left
    assert max(enter for enter, _, _ in first_turn) < min(leave for _, leave, _ in first_turn)
    assert all(name.startswith("rlvr-env") for _, _, name in log)


class _Jittered(CalculatorEnv):
    """Steps of lower episodes wait longer, so they finish in reverse episode order; episode 2 raises."""

    def __init__(self, index: int, **kw):
        self.index = index
        super().__init__(**kw)

    def step(self, action_text: str):
        time.sleep(0.002 * (N + 2 - self.index))
        if self.index == 2:
            raise RuntimeError("step failed")
        return super().step(action_text)


def test_trajectories_equal_the_serial_loops_and_a_failure_stays_in_its_episode(tokenizer, scripted):
    script = _calc_then_answer(N + 2)
    script[1] = ["no tags", "<calc>2*</calc>", "<answer>0</answer>"]  # malformed, a tool error, a wrong answer
    script[3][0] = "<calc>1*2</calc><calc>3*4"  # one call, the second tag unclosed

    def envs(concurrent: bool):
        made = [_Jittered(i) for i in range(N + 2)]
        for env in made:
            env.concurrent_steps = concurrent
        return made

    together = _run(scripted(tokenizer, script), envs(True), tokenizer)
    serial = _run(scripted(tokenizer, script), envs(False), tokenizer)
    assert together == serial  # every field: ids, masks, log-probs, turns, counts, rewards, finish
    assert [t.finish for t in together].count(FinishReason.ENV_ERROR) == 1
    assert together[2].finish == FinishReason.ENV_ERROR and together[2].counts == {"env_errors": 1}
    assert together[1].counts == {"malformed": 1, "tool_calls": 1, "tool_errors": 1}
    assert all(t.success for i, t in enumerate(together) if i not in (1, 2))


def test_a_sampled_batch_is_the_serial_loops_bit_for_bit(tokenizer, tiny_model, monkeypatch):
    task = Calculator(heldout_size=4, tool_latency_s=0.001)
    engine = functools.partial(generate, tiny_model, max_new_tokens=12, eos_id=tokenizer.eos_token_id,
                               pad_id=tokenizer.pad_token_id, engine="eager")
    examples = task.sample(8, random.Random(0))

    def batch():
        return rollout_batch(engine, tokenizer, task, examples, torch.arange(8), temperature=1.0)

    together = batch()
    monkeypatch.setattr(CalculatorEnv, "concurrent_steps", False, raising=False)
    serial = batch()
    assert together.trajectories == serial.trajectories
    assert together.texts == serial.texts and together.metrics == serial.metrics
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs", "truncated"):
        assert torch.equal(getattr(together.rollouts, name), getattr(serial.rollouts, name))
    assert together.rollouts.completion_mask.sum() > 0


class _Game:
    """A gymnasium-style game that records which thread stepped it, and when."""

    def __init__(self, threads: list, spans: list | None = None):
        self.threads, self.spans = threads, spans if spans is not None else []

    def reset(self, seed=None):
        return "go"

    def step(self, action):
        begin = time.monotonic()
        self.threads.append(threading.current_thread())
        time.sleep(0.02)
        self.spans.append((begin, time.monotonic()))
        return "", 1.0, True, {}


def test_a_wrapped_third_party_env_is_stepped_one_at_a_time(tokenizer, scripted):
    """Serial, in episode order (each in a helper thread, which the step deadline needs)."""
    threads, spans = [], []
    envs = [GymAdapter(_Game(threads, spans)) for _ in range(3)]
    trajs = _run(scripted(tokenizer, [["x"]] * 3), envs, tokenizer)
    assert [t.reward for t in trajs] == [1.0] * 3
    assert len(spans) == 3 and all(spans[i][1] <= spans[i + 1][0] for i in range(2))  # no two overlap
    threads.clear()
    _run(scripted(tokenizer, [["x"]] * 3), [GymAdapter(_Game(threads), concurrent_steps=True) for _ in range(3)],
         tokenizer)
    assert len(threads) == 3 and threading.current_thread() not in threads


def test_the_rollout_side_lends_its_core_while_its_environments_step(tokenizer, scripted):
    """With one core held by the rollout thread, every step sees it free (given back for the turn,
    the workers holding none); after the turn the rollout thread holds it again."""
    lease, seen, lock = CoreLease(1), [], threading.Lock()

    class Lending(CalculatorEnv):
        def step(self, action_text: str):
            with lock:  # one probe at a time: a probe borrows the core for an instant
                taken = lease.borrow(1)
                seen.append(taken)
                lease._give_back(taken)
            return super().step(action_text)

    with lease.held():
        trajs = _run(scripted(tokenizer, _calc_then_answer(3)), [Lending() for _ in range(3)], tokenizer)
        assert lease.borrow(1) == 0  # taken back once the environments answered
    assert seen == [1] * 6 and all(t.success for t in trajs)
    assert lease.borrow(1) == 1
