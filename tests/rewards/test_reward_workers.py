"""Reward functions and `is_correct` in worker processes: each sample under its own deadline and
memory budget. Hostile completions (one that holds the GIL in a backtracking regex, a sympy bomb,
a memory bomb, one that stalls a user function) cost their own sample, scored 0 and counted; the
honest ones are scored exactly as alone; the step ends about one deadline after it started; the
next step runs as usual."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import threading
import time

import pytest

from rlvr.rewards.forms import TASK_VERIFIER, batched, with_task
from rlvr.rewards.runner import RewardRunner, RewardSum
from rlvr.rewards.workers import WorkerPool
from rlvr.tasks.files import MathFileTask
from rlvr.trainer.scoring import scored
from rlvr.types import Example

DEADLINE = 3.0
HONEST = ["so \\boxed{72}", "I think \\boxed{71}", "#### 72", "\\boxed{\\frac{144}{2}}", "no idea",
          "\\boxed{72.0}", "\\boxed{7 2}", "<answer>72</answer>"]
HOSTILE = {  # class -> (completion, the metric that counts it)
    "gil": ("a" * 40 + "b", "user_check/timeouts"),
    "sympy": ("\\boxed{9^{9^{9^{9}}}}", "task/timeouts"),
    "memory": ("MEM \\boxed{13}", "user_check/memory"),
    "slow": ("SLOW \\boxed{13}", "user_check/timeouts"),
}


def user_check(prompt, completion, **example):
    """A user's reward with the flaws users write: a backtracking regex, an expansion, a call that can hang."""
    if completion.startswith("SLOW"):
        time.sleep(60)
    if completion.startswith("MEM"):
        return float(len(bytearray(8 << 30)))
    re.match(r"(a+)+$", completion)  # exponential on "aaa...b", inside C: holds the GIL
    return 0.5 if "72" in completion else 0.0


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": "72"}) + "\n" for i in range(4)))
    return MathFileTask(path=str(path), math_timeout_s=1.0)  # the symbolic check's own limit, inside the deadline


def _reward(task):
    return RewardSum(with_task([TASK_VERIFIER, user_check], task), [1.0, 1.0], timeout_s=DEADLINE, workers=2,
                     memory_mb=512)


def _group(n):
    return [Example(f"q{i}", "72", {}) for i in range(n)]


@pytest.mark.parametrize("count", [1, 4, 8])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_step_with_hostile_completions_costs_one_deadline(task, kind, count):
    reward = _reward(task)
    honest = [HONEST[i % len(HONEST)] for i in range(16 - count)]
    alone = [scored(reward, task, _group(1), [text]) for text in honest]
    start = time.monotonic()
    scored(reward, task, _group(16 - count), honest)  # warm, and the honest cost of the step
    honest_s = time.monotonic() - start
    completion, metric = HOSTILE[kind]
    texts = honest[:8] + [completion] * count + honest[8:]
    start = time.monotonic()
    out = scored(reward, task, _group(16), texts)
    elapsed = time.monotonic() - start
    hostile = range(min(8, len(honest)), min(8, len(honest)) + count)
    # k of them cost about one deadline, not k (one after another: 12 s for 4, 24 s for 8); the slack is for
    # a loaded machine, where the forks and the honest work wait for cores (bench/reward_bounds.py times it)
    assert elapsed < 2.5 * DEADLINE + honest_s, (elapsed, honest_s)
    assert out.metrics[metric] == count
    for i in hostile:
        assert out.rewards[i].item() == 0.0 and out.correct[i].item() == 0.0
    kept = [i for i in range(16) if i not in hostile]
    assert [out.rewards[i].item() for i in kept] == [a.rewards[0].item() for a in alone]
    assert [out.correct[i].item() for i in kept] == [a.correct[0].item() for a in alone]
    again = scored(reward, task, _group(len(honest)), honest)  # the run goes on
    assert again.rewards.tolist() == [a.rewards[0].item() for a in alone] and "user_check/timeouts" not in again.metrics


def test_honest_scores_match_the_trainers_own_process(task):
    inside = RewardSum(with_task([TASK_VERIFIER, user_check], task), [1.0, 1.0], timeout_s=DEADLINE)
    texts = HONEST * 2
    pooled, local = scored(_reward(task), task, _group(16), texts), scored(inside, task, _group(16), texts)
    assert pooled.rewards.tolist() == local.rewards.tolist() and pooled.correct.tolist() == local.correct.tolist()
    assert pooled.rewards.tolist()[:3] == [1.5, 0.0, 1.5]


def test_closures_batched_and_trl_forms_run_in_workers():
    seen = {"target": "72"}  # a closure over a dict: fork keeps it, no pickling

    def closure(prompt, completion, **ex):
        return float(completion == seen["target"]) + (os.getpid() != parent) * 10

    @batched
    def whole(prompts, completions, **cols):
        if any(c.startswith("SLOW") for c in completions):
            time.sleep(60 if len(completions) == 1 else DEADLINE * 2)  # alone, only the stalled one stalls
        return [float(c == "72") for c in completions]

    def trl(completions, **kwargs):
        return [len(re.findall(r"(x+x+)+y", c)) * 0.0 + float(c == "72") for c in completions]

    parent = os.getpid()
    texts = ["72", "SLOW", "7", "x" * 40]
    out = RewardRunner(closure, name="c", timeout_s=DEADLINE, workers=2)(["q"] * 4, texts, [{}] * 4)
    assert out.rewards == [11.0, 10.0, 10.0, 10.0]  # scored in another process, the closure intact
    out = RewardRunner(whole, name="b", timeout_s=DEADLINE, workers=2)(["q"] * 4, texts, [{}] * 4)
    assert out.rewards == [1.0, 0.0, 0.0, 0.0] and out.metrics["b/timeouts"] == 1.0  # only the stalled one
    out = RewardRunner(trl, name="t", timeout_s=DEADLINE, workers=2)(["q"] * 4, texts, [{}] * 4)
    assert out.rewards == [1.0, 0.0, 0.0, 0.0] and out.metrics["t/timeouts"] == 1.0  # the GIL holder alone


def test_a_crashing_worker_is_one_sample_and_errors_stay_errors():
    def fragile(prompt, completion, **ex):
        if completion == "die":
            os._exit(3)
        if completion == "raise":
            raise ValueError("bad row")
        return 1.0

    out = RewardRunner(fragile, name="f", timeout_s=DEADLINE, workers=1)(["q"] * 4, ["a", "die", "raise", "b"],
                                                                         [{}] * 4)
    assert out.rewards[:2] == [1.0, 0.0] and math.isnan(out.rewards[2]) and out.rewards[3] == 1.0
    assert out.metrics["f/crashes"] == 1.0 and out.errors[2] == "ValueError: bad row"


def test_a_worker_keeps_state_it_changes_to_itself():
    """Documented: a worker is a fork, so a reward's own globals change in the worker only."""
    calls = []

    def counting(prompt, completion, **ex):
        calls.append(completion)
        return float(len(calls))

    out = RewardRunner(counting, timeout_s=DEADLINE, workers=1)(["q"] * 2, ["a", "b"], [{}] * 2)
    assert out.rewards == [1.0, 2.0] and calls == []


def test_the_pool_replaces_a_stalled_worker_keeps_one_past_a_memory_error_and_counts():
    pool = WorkerPool({"f": user_check}, size=1, memory_mb=256)
    results = pool.run("f", [(("p", "MEM"), {}), (("p", "72"), {}), (("p", "a" * 40 + "b"), {}), (("p", "0"), {})],
                       1.0)
    assert [r[0] for r in results] == [None, 0.5, None, 0.0]
    assert results[0][1].startswith("RewardMemory") and results[2][1].startswith("RewardTimeout")
    assert pool.stats.memory == 1 and pool.stats.timeouts == 1
    assert pool.stats.forks == 2  # the first worker, and the one after the timeout; a MemoryError costs none
    pool.close()


def test_workers_leave_ctrl_c_and_sigterm_to_the_trainer():
    """A signal to the process group stops the trainer after its step; the step's rewards are still scored."""
    import signal

    def dispositions(prompt, completion, **ex):
        ignored = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (signal.SIG_IGN,) * 2
        return float(ignored and os.getpid() != parent)

    parent = os.getpid()
    assert RewardRunner(dispositions, timeout_s=DEADLINE, workers=1)(["q"], ["a"], [{}]).rewards == [1.0]


class _Refusing(MathFileTask):
    def is_correct(self, completion, example):
        raise AssertionError("asked although its reward call answers it")


def test_a_file_tasks_correctness_is_read_off_its_reward_call(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "72"}) + "\n")
    task = _Refusing(path=str(path), math_timeout_s=1.0)
    runner = RewardRunner(task.reward, name="task", timeout_s=DEADLINE, workers=2, verifies=task)
    texts = ["\\boxed{72}", "\\boxed{71}", HOSTILE["sympy"][0], "#### 72"]
    out = scored(runner, task, _group(4), texts)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 1.0] and out.correct.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert out.metrics["task/timeouts"] == 1.0
    asked = scored(RewardRunner(task.reward, name="task", timeout_s=DEADLINE, workers=2), task, _group(2), texts[:2])
    assert asked.correct.tolist() == [0.0, 0.0]  # not its own verifier: asked, and an error is "not correct"


def sleepy(prompt, completion, **example):
    """A reward that never returns (on every sample): a step must cost one deadline, not one per sample."""
    time.sleep(3600)


async def sleepy_async(prompt, completion, **example):
    await asyncio.sleep(3600)


async def blocking_async(prompt, completion, **example):
    if completion == "block":
        time.sleep(3600)  # blocks its event loop: no wait_for can fire
    return 1.0


@pytest.mark.parametrize("workers, form, deadlines", [(2, "sync", 1), (0, "sync", 2), (0, "async", 1)])
def test_a_reward_that_never_returns_costs_one_deadline_a_step(workers, form, deadlines):
    fn = sleepy if form == "sync" else sleepy_async
    runner = RewardRunner(fn, name="s", timeout_s=2.0, workers=workers)
    steps = []
    for _ in range(2):  # a step, and the run goes on to the next
        start = time.monotonic()
        out = runner(["q"] * 64, [str(i) for i in range(64)], [{}] * 64)
        steps.append(time.monotonic() - start)
        assert out.rewards == [0.0] * 64 and out.metrics["s/timeouts"] == 64.0
    # one deadline per sample would be 128 s; one per wave of the pool's 18 workers, 8 s. The slack is for the
    # forks (the zygote's, and 18 workers', up to 0.3 s each on a loaded machine), the best step for the load
    assert min(steps) < deadlines * 2.0 + 3.0, steps


def test_honest_samples_beside_stalled_ones_in_the_trainers_process_keep_their_scores():
    def mixed(prompt, completion, **example):
        if completion.startswith("SLOW"):
            time.sleep(3600)
        return float(completion == "72")

    texts = ["SLOW", "72", "7", "SLOW", "72", "SLOW"]  # the first stalls: the rest run side by side
    start = time.monotonic()
    out = RewardRunner(mixed, name="m", timeout_s=1.0, workers=0)(["q"] * 6, texts, [{}] * 6)
    assert out.rewards == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0] and out.metrics["m/timeouts"] == 3.0
    assert time.monotonic() - start < 3.5


def test_an_async_reward_that_blocks_its_loop_ends_the_step_at_the_deadline():
    runner = RewardRunner(blocking_async, name="a", timeout_s=1.0)
    start = time.monotonic()
    out = runner(["q"] * 4, ["72", "block", "72", "72"], [{}] * 4)
    assert time.monotonic() - start < 3.0
    assert out.rewards[1] == 0.0 and out.metrics["a/timeouts"] >= 1.0  # samples behind it on its loop may too


class _SpinsInACopy(set):
    """Stands in for loguru's lock set as a fork from a thread can copy it: in a forked copy, the walk in
    the child's own after-fork hook passes, and every later walk (the copy's own forks) spins."""

    def __init__(self, owner: int):
        super().__init__()
        self.owner, self.walks = owner, 0

    def __iter__(self):
        if os.getpid() != self.owner:
            self.walks += 1
            while self.walks > 1:
                time.sleep(0.01)
        return super().__iter__()


def test_the_zygote_walks_fresh_lock_sets_in_loguru_fork_hooks(monkeypatch):
    """vLLM imports loguru, whose fork hooks walk two lock sets; the zygote is forked from a trainer thread
    and its copies can be mid-walk, so every later fork of the zygote would spin: it starts fresh ones."""
    machinery = pytest.importorskip("loguru._locks_machinery")
    monkeypatch.setattr(machinery, "handler_locks", _SpinsInACopy(os.getpid()))
    pool, done = WorkerPool({"f": user_check}, size=1), []
    caller = threading.Thread(target=lambda: done.append(pool.run("f", [(("p", "72"), {})], 5.0)), daemon=True)
    caller.start()
    caller.join(60)
    assert done == [[(0.5, None)]], "the zygote's first fork of a worker spun in loguru's fork hook"
    pool.close()



def _length(prompt, completion, **example):
    return float(len(completion))


def test_a_zygote_that_stops_answering_fails_its_batch_only_and_is_replaced():
    """A stopped zygote (SIGSTOP: as if stuck) cannot fork: that step's samples score 0 as crashes,
    counted, within the deadline plus the fork bound, and the next step runs on a fresh zygote."""
    import signal

    runner = RewardRunner(_length, name="z", timeout_s=5.0, workers=2)
    runner.pool.fork_s = 1.0
    texts = ["a", "bb", "ccc", "dddd"]
    assert runner(["q"] * 4, texts, [{}] * 4).rewards == [1.0, 2.0, 3.0, 4.0]
    stopped = runner.pool._procs.zygote[1]
    os.kill(stopped, signal.SIGSTOP)
    for worker in runner.pool._procs.idle:  # the next step needs new workers from the zygote
        worker.kill()
    runner.pool._procs.idle.clear()
    start = time.monotonic()
    out = runner(["q"] * 4, texts, [{}] * 4)
    assert time.monotonic() - start < 5.0 + runner.pool.fork_s  # never past the deadline plus the fork bound
    assert out.rewards == [0.0] * 4 and out.metrics["z/crashes"] == 4.0
    assert all(e.startswith("RewardCrash") and "within 1s" in e for e in out.errors)
    with pytest.raises(ProcessLookupError):  # killed, not left stopped
        os.kill(stopped, 0)
    assert runner(["q"] * 4, texts, [{}] * 4).rewards == [1.0, 2.0, 3.0, 4.0]
    assert runner.pool._procs.zygote[1] != stopped
    runner.pool.close()


HANGING_PRELOAD = """
import os, time
def preload():  # a module-level preload stuck while the marker file is there
    while os.path.exists(os.path.join(os.path.dirname(__file__), "hang")):
        time.sleep(0.05)
def triple(x):
    return 3 * x
"""


def test_a_spawned_zygote_stuck_in_its_preload_is_bounded_by_the_startup_bound(tmp_path, monkeypatch):
    (tmp_path / "stuck_preload.py").write_text(HANGING_PRELOAD)
    (tmp_path / "hang").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    pool = WorkerPool({"f": "stuck_preload:triple"}, size=1, spawn=True)
    pool.start_s = 3.0
    start = time.monotonic()
    results = pool.run("f", [((i,), {}) for i in range(3)], 1.0)
    assert time.monotonic() - start < pool.start_s + 5.0  # the startup bound (and the kill), not 120 s
    assert [e.split(":")[0] for _, e in results] == ["RewardCrash"] * 3 and "within 3s" in results[0][1]
    (tmp_path / "hang").unlink()
    assert pool.run("f", [((i,), {}) for i in range(3)], 5.0) == [(3 * i, None) for i in range(3)]
    assert pool.stats.crashes == 3
    pool.close()


GARBAGE_SOCKETS_AT_THE_FORK = """
import gc, socket
from rlvr.rewards.workers import WorkerPool
gc.disable()  # keeps the cycles below uncollected until the fork, as a busy trainer's next collection would
for _ in range(8):
    ends = list(socket.socketpair())
    ends.append(ends)  # a cycle: only the collector frees these socket objects (and closes their fds)
del ends
def collects(x):
    gc.collect()
    return x + 1
pool = WorkerPool({"f": collects}, size=1)
print(pool.run("f", [((i,), {}) for i in range(4)], 5.0), flush=True)
pool.close()
"""


def test_sockets_the_trainer_left_for_the_collector_cannot_close_a_workers_socket(tmp_path):
    """The zygote frees the fd numbers of the sockets it inherited and reuses them for its workers; an inherited
    socket object in an uncollected cycle would close that number again when a worker collects."""
    done = _in_a_fresh_interpreter(GARBAGE_SOCKETS_AT_THE_FORK, tmp_path)
    assert done.stdout.strip() == str([(i + 1, None) for i in range(4)]), (done.stdout, done.stderr[-2000:])


PIPE_REMADE_IN_EVERY_CHILD = """
import os
from rlvr.rewards.workers import WorkerPool
class Wakeup:  # a library's self-pipe, closed and made anew in every forked child
    def __init__(self):
        self.fds = os.pipe()
    def remake(self):
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = os.pipe()
wakeup = Wakeup()
os.register_at_fork(after_in_child=wakeup.remake)
pool = WorkerPool({"f": lambda x: x + 1}, size=1)
print(pool.run("f", [((i,), {}) for i in range(4)], 5.0), flush=True)
pool.close()
"""


def test_a_pipe_a_fork_hook_remakes_in_every_child_cannot_close_a_workers_socket(tmp_path):
    """The zygote lets go of the trainer's pipes; their numbers must not be reused for a worker's socket,
    which a library's after-fork hook would then close in that worker."""
    done = _in_a_fresh_interpreter(PIPE_REMADE_IN_EVERY_CHILD, tmp_path)
    assert done.stdout.strip() == str([(i + 1, None) for i in range(4)]), (done.stdout, done.stderr[-2000:])


def _in_a_fresh_interpreter(script: str, folder):
    """Runs `script` in its own Python: the fork hooks and leftovers it sets up stay out of the test process."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=folder)
