"""Reward functions that cannot stop or fool the run: non-finite numbers, SystemExit and other
BaseExceptions, calls that hang past reward.timeout_s; KeyboardInterrupt still stops it."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time

import pytest

from rlvr.config import load_config
from rlvr.errors import ConfigError, RewardError
from rlvr.rewards.runner import RewardRunner, RewardSum, batched

PROMPTS, COMPLETIONS = ["q1", "q2", "q3"], ["ok", "inf", "nan"]
EXAMPLES = [{}, {}, {}]


def nonfinite(prompt, completion, **ex):
    return {"ok": 1.0, "inf": math.inf, "nan": math.nan}[completion]


@pytest.mark.parametrize("timeout_s", [0.0, 5.0])
def test_nonfinite_rewards_are_counted_errors(timeout_s):
    out = RewardRunner(nonfinite, name="f", timeout_s=timeout_s)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[0] == 1.0 and math.isnan(out.rewards[1]) and math.isnan(out.rewards[2])
    assert out.errors[0] is None and out.errors[1].startswith("NonFiniteReward") and "inf" in out.errors[1]
    assert out.metrics["f/errors"] == 2.0 and out.metrics["f/nonfinite"] == 2.0 and out.metrics["f/mean"] == 1.0
    assert "f/timeouts" not in out.metrics
    dict_form = RewardRunner(lambda p, c, **e: {"reward": -math.inf, "len": math.nan} if c == "inf" else 0.5,
                             name="d")(PROMPTS, COMPLETIONS, EXAMPLES)
    assert dict_form.metrics["d/nonfinite"] == 1.0 and "d/len" not in dict_form.metrics


def test_every_sample_nonfinite_stops_the_run():
    with pytest.raises(RewardError) as err:
        RewardRunner(lambda p, c, **e: math.inf, name="blowup")(PROMPTS, COMPLETIONS, EXAMPLES)
    assert "blowup" in str(err.value) and "NonFiniteReward" in str(err.value) and "\n" not in str(err.value)


def test_nonfinite_never_reaches_the_sum():
    out = RewardSum([nonfinite, lambda p, c, **e: 1.0], timeout_s=5)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[0] == 2.0 and all(math.isnan(r) for r in out.rewards[1:])


class Custom(BaseException):
    pass


def exits(prompt, completion, **ex):
    if completion == "inf":
        sys.exit(3)
    if completion == "nan":
        raise Custom("not an Exception")
    return 1.0


@pytest.mark.parametrize("timeout_s", [0.0, 5.0])
def test_system_exit_and_base_exceptions_are_sample_errors(timeout_s):
    out = RewardRunner(exits, timeout_s=timeout_s)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[0] == 1.0 and out.errors[1] == "SystemExit: 3" and out.errors[2].startswith("Custom")

    async def async_exits(prompt, completion, **ex):
        return exits(prompt, completion)
    out = RewardRunner(async_exits, timeout_s=timeout_s)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards[0] == 1.0 and out.errors[1] == "SystemExit: 3" and out.errors[2].startswith("Custom")

    @batched
    def batch_exit(prompts, completions, **cols):
        raise SystemExit("bye")
    with pytest.raises(RewardError, match="SystemExit: bye"):
        RewardRunner(batch_exit, timeout_s=timeout_s)(PROMPTS, COMPLETIONS, EXAMPLES)


@pytest.mark.parametrize("timeout_s", [0.0, 5.0])
def test_keyboard_interrupt_still_stops(timeout_s):
    def interrupted(prompt, completion, **ex):
        raise KeyboardInterrupt

    async def async_interrupted(prompt, completion, **ex):
        raise KeyboardInterrupt
    for fn in (interrupted, async_interrupted):
        with pytest.raises(KeyboardInterrupt):
            RewardRunner(fn, timeout_s=timeout_s)(PROMPTS, COMPLETIONS, EXAMPLES)


def test_sync_timeout_is_a_counted_error_and_the_runner_moves_on():
    release, finished = threading.Event(), threading.Event()

    def slow(prompt, completion, **ex):
        if completion == "inf":
            release.wait(30)
            finished.set()
        return 1.0
    runner = RewardRunner(slow, name="slow", timeout_s=0.2)
    out = runner(PROMPTS, COMPLETIONS, EXAMPLES)
    assert not finished.is_set()  # the hung call was abandoned (still running), not waited for
    release.set()
    assert out.rewards == [1.0, 0.0, 1.0]  # a stalled sample earns nothing; the others are scored
    assert out.errors[1].startswith("RewardTimeout") and "reward.timeout_s=0.2s" in out.errors[1]
    assert out.metrics["slow/timeouts"] == 1.0 and out.metrics["slow/errors"] == 1.0


def test_a_function_raising_timeout_error_is_not_a_timeout():
    def raises(prompt, completion, **ex):
        if completion == "inf":
            raise TimeoutError("its own")
        return 0.0
    out = RewardRunner(raises, name="r", timeout_s=5)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.errors[1] == "TimeoutError: its own" and "r/timeouts" not in out.metrics


def test_async_and_batched_timeouts():
    finished = []

    async def slow(prompt, completion, **ex):
        await asyncio.sleep(30 if completion == "inf" else 0)
        finished.append(completion)
        return 1.0
    out = RewardRunner(slow, name="a", timeout_s=0.2)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.metrics["a/timeouts"] == 1.0 and out.rewards == [1.0, 0.0, 1.0]
    assert sorted(finished) == ["nan", "ok"]  # the hung coroutine was cancelled, not awaited

    @batched
    def slow_batch(prompts, completions, **cols):
        time.sleep(3)
        return [1.0] * len(completions)
    # in the trainer's process a batched call is one call: past its deadline every sample earns 0,
    # and the run goes on (a timeout is the samples' fault, not the function's)
    out = RewardRunner(slow_batch, name="b", timeout_s=0.2)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards == [0.0] * 3 and out.metrics["b/timeouts"] == 3.0

    async def slow_async_batch(prompts, completions, **cols):
        await asyncio.sleep(3)
    slow_async_batch.batched = True
    out = RewardRunner(slow_async_batch, name="ab", timeout_s=0.2)(PROMPTS, COMPLETIONS, EXAMPLES)
    assert out.rewards == [0.0] * 3 and out.metrics["ab/timeouts"] == 3.0


def test_worker_config_is_checked():
    r = load_config(None, []).reward
    assert (r.workers, r.worker_memory_mb, r.math_workers, r.math_memory_mb) == (2, 2048, 2, 1024)
    for override, rule in (("reward.workers=-1", ">= 0"), ("reward.math_workers=0", ">= 1"),
                           ("reward.worker_memory_mb=-5", ">= 0")):
        with pytest.raises(ConfigError, match=f"^{override.split('=')[0]}: must be {rule}"):
            load_config(None, [override])
    with pytest.raises(ConfigError, match="reward.workers"):
        RewardRunner(nonfinite, workers=-1)


def test_timeout_config_is_checked():
    assert load_config(None, []).reward.timeout_s == 10.0
    assert load_config(None, ["reward.timeout_s=0"]).reward.timeout_s == 0.0
    with pytest.raises(ConfigError, match=r"^reward.timeout_s: must be .*>= 0"):
        load_config(None, ["reward.timeout_s=-1"])
    with pytest.raises(ConfigError, match="reward.timeout_s"):
        RewardRunner(nonfinite, timeout_s=-2)


def test_samples_jsonl_holds_null_for_an_unscorable_reward(tmp_path, monkeypatch):
    """A run whose reward is NaN for some samples writes valid JSON (null), never bare NaN."""
    from rlvr.builder.run import train
    from rlvr.tracking.run_dir import RunDir

    rewards = tmp_path / "rw.py"
    rewards.write_text("import itertools\n"
                       "calls = itertools.count()\n"
                       "def half(prompt, completion, **ex):\n"
                       "    return None if next(calls) % 2 else 1.0\n")
    config = load_config(None, ["model.path=", "trainer.steps=1", "rollout.prompts_per_step=2",
                                "rollout.group_size=4", "rollout.max_new_tokens=3", "task.heldout_size=4",
                                "trainer.samples_per_step=8", f"reward.fn={rewards}:half"])
    run = RunDir(tmp_path / "run")
    train(config, run, command=["test"], echo=lambda *a: None)
    lines = (run.path / "samples.jsonl").read_text().splitlines()
    assert lines and all("NaN" not in line and "Infinity" not in line for line in lines)
    records = [json.loads(line) for line in lines]
    assert all(r["reward"] is None or math.isfinite(r["reward"]) for r in records)
