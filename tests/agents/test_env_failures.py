"""An environment that hangs, exits or breaks ends its own episode (`env_error`), never the run
silently; a batch whose every episode broke stops the run with one line; an environment whose
only problem is held out is one line, not an endless draw. Each hang is bounded by the test (a
thread joined with a timeout) so a regression fails instead of hanging the suite."""

from __future__ import annotations

import random
import re
import sys
import threading
import time

import pytest
import torch

from rlvr.agents.collect import check_some_ran
from rlvr.agents.env import FinishReason
from rlvr.agents.envs.calculator import CalculatorEnv
from rlvr.agents.render import TagRenderer
from rlvr.agents.rollout import Limits, run_episodes
from rlvr.agents.task import AgentTask, ToolEnv, is_heldout_key
from rlvr.errors import ConfigError

RELEASE = threading.Event()  # never set while a test runs: what a stuck step waits on


def _bounded(fn, seconds: float = 30.0):
    """fn() in a thread, failing the test if it has not returned after `seconds`."""
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s: the loop hung"
    return out["value"]


def _run(engine, envs, tok, limits):
    return run_episodes(engine, TagRenderer(tok), envs, list(range(len(envs))), torch.arange(len(envs)),
                        temperature=1.0, limits=limits, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)


class _Stuck(CalculatorEnv):
    """With `stuck`, its step never returns (a remote call without a timeout)."""

    def __init__(self, stuck: bool, **kw):
        self.stuck = stuck
        super().__init__(**kw)

    def step(self, action_text):
        if self.stuck:
            RELEASE.wait()
        return super().step(action_text)


class _Exits(CalculatorEnv):
    def step(self, action_text):
        sys.exit(3)


class _BadReset(CalculatorEnv):
    def reset(self, seed):
        raise RuntimeError("no such level")


def _answers(n: int) -> list[list[str]]:
    keys = [CalculatorEnv().reset(i).strip() for i in range(n)]
    return [[f"<answer>{eval(k)}</answer>"] for k in keys]  # noqa: S307 - test-side reference


def test_a_step_that_never_returns_ends_its_episode(tokenizer, scripted):
    envs = [_Stuck(stuck=i == 1) for i in range(3)]
    start = time.monotonic()
    trajs = _bounded(lambda: _run(scripted(tokenizer, _answers(3)), envs, tokenizer, Limits(2, 96, 0.5)))
    assert time.monotonic() - start < 10
    assert [t.finish for t in trajs] == [FinishReason.DONE, FinishReason.ENV_ERROR, FinishReason.DONE]
    assert trajs[1].counts == {"env_errors": 1, "env_timeouts": 1} and trajs[1].reward == 0.0
    assert "EnvTimeout: did not return within 0.5 s" in trajs[1].error
    assert trajs[0].success and trajs[2].success  # the others were not held up


def test_sys_exit_in_a_step_ends_its_episode_not_the_run(tokenizer, scripted):
    trajs = _run(scripted(tokenizer, _answers(2)), [_Exits(), CalculatorEnv()], tokenizer, Limits(2, 96))
    assert [t.finish for t in trajs] == [FinishReason.ENV_ERROR, FinishReason.DONE]
    assert "sys.exit(3)" in trajs[0].error


def test_a_batch_whose_every_episode_broke_is_one_line(tokenizer, scripted):
    trajs = _run(scripted(tokenizer, _answers(2)), [_Exits(), _Exits()], tokenizer, Limits(2, 96))
    with pytest.raises(ConfigError, match=r"environment: failed on all 2 episodes of this step; first error: "
                                          r"step: RuntimeError: called sys.exit\(3\)"):
        check_some_ran(trajs)
    check_some_ran(trajs[:1] + _run(scripted(tokenizer, _answers(1)), [CalculatorEnv()], tokenizer, Limits(2, 96)))


class _BadResetTask(AgentTask):
    env_class = _BadReset


def test_an_exception_in_reset_while_sampling_becomes_an_env_error_episode():
    """The task draws its prompts with `reset`; that reset raising once escaped from `sample`."""
    examples = _BadResetTask(heldout_size=0).sample(3, random.Random(0))
    assert len(examples) == 3 and all(ex.prompt == "" and ex.meta["key"].startswith("env_error:")
                                      for ex in examples)


class _OneProblem(ToolEnv):
    """Every reset gives the same problem, whose key hashes into the held-out bucket."""

    KEY = next(f"p{i}" for i in range(1000) if is_heldout_key(f"p{i}"))

    def _generate(self, rng):
        return "what is 1+1?", 2, self.KEY


class _OneProblemTask(AgentTask):
    env_class = _OneProblem


def test_one_held_out_problem_is_an_error_not_an_endless_draw():
    task = _OneProblemTask(heldout_size=1)
    err = _bounded(lambda: _caught(lambda: task.sample(2, random.Random(0))))
    assert isinstance(err, ConfigError)
    assert re.search(r"every problem \(key 'p\d+'\) is in the held-out bucket.*heldout_size=0", str(err)), err
    assert len(_OneProblemTask(heldout_size=0).sample(2, random.Random(0))) == 2  # the fix the line names


def _caught(fn):
    """fn()'s error as a value (raised in a helper thread, it is checked in the test's own)."""
    try:
        return fn()
    except ConfigError as err:
        return err


def test_env_timeout_is_a_config_field_passed_to_the_loop():
    from rlvr.agents.collect import _limits
    from rlvr.builder.build import build_task
    from rlvr.config import load_config

    config = load_config(None, ["task.name=agent_calculator", "task.agent_calculator.env_timeout_s=7"])
    assert _limits(build_task(config, None)).env_timeout_s == 7
