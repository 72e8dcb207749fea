"""Score-ahead (`collect.produce_ahead`): under asynchronous rollouts a batch is scored in a pool
while the rollout side samples the next one; the staleness bound still holds (a batch counts from
when its sampling started), η = 0 still equals the synchronous loop bit for bit, and a verifier
that reads the step scores each batch at its own step."""

from __future__ import annotations

import time

from _async_runs import TINY, _assert_same_run, _lines, _run

from rlvr.trainer import async_loop

WAITING = """import time

from rlvr.rewards.runner import batched


@batched
def judge(prompts, completions, **columns):
    time.sleep({latency!r})  # a remote judge's round trip: a wait, no computation here
    return [completion.count('+') / max(1, len(completion)) for completion in completions]
"""


def _waiting_reward(tmp_path, latency: float) -> str:
    (tmp_path / "judge.py").write_text(WAITING.format(latency=latency))
    return f"reward.fn={tmp_path / 'judge.py'}:judge"


def _traced(monkeypatch) -> list[tuple[str, int, float, float]]:
    """(what, step, start, end) of every batch's sampling and scoring, as the rollout side runs them."""
    events: list[tuple[str, int, float, float]] = []
    real = async_loop.produce_ahead

    def produce_ahead(c, step, version):
        t0 = time.perf_counter()
        job, sample_s = real(c, step, version)
        events.append(("sampled", step, t0, time.perf_counter()))

        def scoring():
            t1 = time.perf_counter()
            produced = job()
            events.append(("scored", step, t1, time.perf_counter()))
            return produced

        return scoring, sample_s

    monkeypatch.setattr(async_loop, "produce_ahead", produce_ahead)
    return events


def test_the_next_batch_samples_while_the_last_is_scored(tmp_path, capsys, monkeypatch):
    events = _traced(monkeypatch)
    run = _run(tmp_path, capsys, "eta1", *TINY, _waiting_reward(tmp_path, 0.4), "trainer.steps=3",
               "trainer.threads=2", "trainer.max_staleness=1", "optim.lr=1e-2")
    at = {(what, step): (start, end) for what, step, start, end in events}
    assert {step for _, step in at} == {1, 2, 3}
    scored_1, sampled_2 = at[("scored", 1)], at[("sampled", 2)]
    assert scored_1[0] <= sampled_2[0] < scored_1[1]  # batch 2 began sampling while batch 1 was being scored
    steps = [line for line in _lines(run) if line["step"] > 0]
    assert all(line["step"] - 1 - line["async/policy_version"] <= 1 for line in steps)


def test_scoring_ahead_keeps_the_staleness_bound(tmp_path, capsys, monkeypatch):
    """η = 2 and a verifier slower than the learner: batches are scored 2 at a time, each trained
    at most 2 versions after the one that sampled it, and the sampling of step k starts only once
    version k-1-η is published."""
    events = _traced(monkeypatch)
    run = _run(tmp_path, capsys, "eta2", *TINY, _waiting_reward(tmp_path, 0.3), "trainer.steps=6",
               "trainer.threads=2", "trainer.max_staleness=2", "optim.lr=1e-2")
    steps = [line for line in _lines(run) if line["step"] > 0]
    staleness = [line["async/staleness"] for line in steps]
    assert all(line["step"] - 1 - line["async/policy_version"] == s for line, s in zip(steps, staleness))
    assert max(staleness) == 2 and min(staleness) >= 0
    scoring = sorted((start, end) for what, _, start, end in events if what == "scored")
    assert any(b[0] < a[1] for a, b in zip(scoring, scoring[1:]))  # two batches in scoring at once


def test_staleness_zero_with_a_waiting_verifier_is_the_synchronous_loop(tmp_path, capsys, monkeypatch):
    events = _traced(monkeypatch)
    common = [*TINY, _waiting_reward(tmp_path, 0.05), "trainer.steps=4", "trainer.threads=2", "optim.lr=1e-2"]
    sync_run = _run(tmp_path, capsys, "sync", *common)
    async_run = _run(tmp_path, capsys, "async", *common, "trainer.max_staleness=0")
    assert len([e for e in events if e[0] == "scored"]) == 4  # the η = 0 run scored through the pool
    _assert_same_run(sync_run, async_run)


TRL_FORM = """import time


def at_step(completions, trainer_state, **kwargs):
    global_step = trainer_state.global_step
    time.sleep(0.1)  # long enough for the next batch to set its step if the two were scored at once
    return [float(trainer_state.global_step == global_step)] * len(completions)
"""


def test_a_verifier_that_reads_the_step_scores_each_batch_at_its_own(tmp_path, capsys):
    (tmp_path / "trl_reward.py").write_text(TRL_FORM)
    run = _run(tmp_path, capsys, "trl", *TINY, f"reward.fn={tmp_path / 'trl_reward.py'}:at_step",
               "trainer.steps=5", "trainer.threads=2", "trainer.max_staleness=2")
    assert [line["reward/mean"] for line in _lines(run) if line["step"] > 0] == [1.0] * 5


def test_a_reward_with_a_time_limit_scores_concurrent_batches_at_once():
    """`reward.timeout_s` runs calls in a worker thread: one per calling thread, so two batches
    scored ahead at once wait 0.3 s together, not one after the other."""
    from concurrent.futures import ThreadPoolExecutor

    from rlvr.rewards.runner import RewardRunner, batched

    @batched
    def slow(prompts, completions, **columns):
        time.sleep(0.3)
        return [1.0] * len(completions)

    runner = RewardRunner(slow, timeout_s=5.0)
    with ThreadPoolExecutor(2) as pool:
        t0 = time.perf_counter()
        batches = list(pool.map(lambda _: runner(["p"], ["c"], [{}]), range(2)))
        took = time.perf_counter() - t0
    assert [b.rewards for b in batches] == [[1.0], [1.0]]
    assert 0.3 <= took < 0.55
