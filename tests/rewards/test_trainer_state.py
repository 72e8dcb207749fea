"""TRL-form rewards' `trainer_state` is the step whose batch they score, in the synchronous loop,
with asynchronous rollouts, and on Ray reward workers (each call carries the step, so a worker in
another process, or a restarted one, knows it)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rlvr.backends.ray import RayReward, _RewardWorker
from rlvr.cli import main
from rlvr.rewards.runner import RewardSum

TINY = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "task.heldout_size=4", "trainer.eval_every=0", "trainer.save_every=0", "trainer.steps=4"]
STEP_REWARD = ("def score(prompt, completion, **example):\n"
               "    return (completion.count('+') + len(set(completion))) / 8\n"
               "def at(completions, trainer_state, **kwargs):\n"
               "    return [trainer_state.global_step + trainer_state.max_steps / 100] * len(completions)\n")


def _step_rewards(tmp_path, capsys, name, *args) -> list[float]:
    (tmp_path / "r.py").write_text(STEP_REWARD)
    spec = f"reward.fn={tmp_path / 'r.py'}:score, 0*{tmp_path / 'r.py'}:at"  # weight 0: logged, not trained on
    code = main(["train", *TINY, spec, *args, f"trainer.out_dir={tmp_path}", f"trainer.name={name}"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [line["reward/at/mean"] for line in lines if line["step"] > 0]


@pytest.mark.parametrize("schedule", [pytest.param([], id="sync"),
                                      pytest.param(["trainer.max_staleness=1", "trainer.threads=2"], id="async")])
def test_trainer_state_is_the_scored_step(tmp_path, capsys, schedule):
    # step s scores after s - 1 optimizer steps, of 4: global_step + max_steps / 100
    assert _step_rewards(tmp_path, capsys, "run", *schedule) == pytest.approx([0.04, 1.04, 2.04, 3.04])


def _spy_reward(_tokenizer):
    def at(completions, trainer_state, **kwargs):
        return [trainer_state.global_step * 10 + trainer_state.max_steps] * len(completions)
    return RewardSum([at])


def test_a_reward_worker_takes_the_step_with_each_call():
    worker = _RewardWorker(_spy_reward, tokenizer=None)
    assert worker.score(["p"], ["c"], [{}]).rewards == [0.0]  # no step sent yet
    assert worker.score(["p"], ["c"], [{}], (3, 10)).rewards == [30.0]  # 2 steps done, of 10


class _Ref:
    def __init__(self, value):
        self.value = value


class _FakeRay:
    """Ray's calls as RayReward makes them, run in this process: `.remote` calls the actor at once."""

    def wait(self, refs, num_returns, timeout):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref, timeout):
        return ref.value


class _Actor:
    def __init__(self, worker):
        self.score = type("Method", (), {"remote": staticmethod(lambda *a: _Ref(worker.score(*a)))})()


def test_ray_reward_sends_the_step_to_every_worker():
    reward = RayReward.__new__(RayReward)  # the scheduling only: no Ray started
    reward.ray, reward.progress = _FakeRay(), None
    reward.workers = [_Actor(_RewardWorker(_spy_reward, None)) for _ in range(2)]
    reward.on_step_begin(5, 8)
    out = reward(["p"] * 4, ["a", "b", "c", "d"], [{}] * 4)  # four chunks over two workers
    assert out.rewards == [48.0] * 4


class _Stalling:
    """A task whose `is_correct` does not return on a hostile completion (a verifier a completion can
    stall) until the test sets `release`: the spinning thread would otherwise slow every later test."""

    def __init__(self):
        self.release = threading.Event()

    def is_correct(self, completion, example):
        while completion == "stall" and not self.release.is_set():
            pass  # holds the GIL between bytecodes only
        return completion == "72"


def _plain(_tokenizer):
    return RewardSum([lambda p, c, **ex: float(c == "72")])


@pytest.mark.parametrize("workers", [0, 2])
def test_ray_reward_asks_is_correct_under_the_drivers_per_sample_deadlines(workers):
    from rlvr.types import Example

    reward = RayReward.__new__(RayReward)  # the scheduling only: no Ray started
    reward.ray, reward.progress = _FakeRay(), None
    reward.workers = [_Actor(_RewardWorker(_plain, None)) for _ in range(2)]
    reward.local = RewardSum([lambda p, c, **ex: 0.0], timeout_s=1.0, workers=workers)
    texts, task = ["72", "stall", "7", "72"], _Stalling()
    reward.judged(task, [Example("q", "72", {})], ["72"], [{}])  # the workers' zygote started
    start = time.monotonic()
    try:
        out, correct = reward.judged(task, [Example("q", "72", {})] * 4, texts, [{}] * 4)
    finally:
        task.release.set()
    assert time.monotonic() - start < 3.0  # unbounded, the driver would wait for ever
    assert out.rewards == [1.0, 0.0, 0.0, 1.0] and correct == [True, False, False, True]
