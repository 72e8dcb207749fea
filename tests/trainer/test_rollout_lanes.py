"""Rollout lanes (`trainer.rollout_lanes`): the asynchronous rollout side rolls several batches out
side by side, each lane with its own copy of the weights. Every batch's draws and version are taken
in step order, so on the exact schedule two lanes train on the very batches one lane does; the
lanes overlap (one samples while another's tools answer); what cannot draw ahead is refused."""

from __future__ import annotations

import threading
import time

import pytest
from _async_runs import TINY, _lines, _run, _without_clock

from rlvr.cli import main
from rlvr.trainer import async_loop

AGENT = ["recipes/agent_calculator.yaml", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "task.heldout_size=8", "trainer.eval_every=0", "trainer.threads=2", "algo.rollout_correction=true",
         "trainer.thread_mode=ops"]
EXACT = [*AGENT, "trainer.steps=4", "trainer.max_staleness=1", "trainer.staleness=exact"]


def _traced(monkeypatch) -> list[tuple[int, str, float, float]]:
    """(step, thread, start, end) of every batch's rollout, as the lanes run them."""
    spans: list[tuple[int, str, float, float]] = []
    real = async_loop.roll

    def roll(c, drawn, step, version):
        t0 = time.perf_counter()
        produced = real(c, drawn, step, version)
        spans.append((step, threading.current_thread().name, t0, time.perf_counter()))
        return produced

    monkeypatch.setattr(async_loop, "roll", roll)
    return spans


def test_two_lanes_train_on_the_batches_one_lane_does_and_overlap(tmp_path, capsys, monkeypatch):
    """A calculator agent whose tool answers after 50 ms: with 2 lanes on the exact schedule the
    metrics (clock keys aside) and samples equal the one-lane run's, the batches of steps 1 and 2
    (both admitted at version 0) roll out at once, and the staleness is the schedule's."""
    tools = "task.agent_calculator.tool_latency_s=0.05"
    one = _run(tmp_path, capsys, "one", *EXACT, tools)
    spans = _traced(monkeypatch)
    two = _run(tmp_path, capsys, "two", *EXACT, tools, "trainer.rollout_lanes=2")
    assert [_without_clock(x) for x in _lines(two)] == [_without_clock(x) for x in _lines(one)]
    assert (two / "samples.jsonl").read_text() == (one / "samples.jsonl").read_text()
    steps = [line for line in _lines(two) if line["step"] > 0]
    assert [line["async/policy_version"] for line in steps] == [0, 0, 1, 2]
    at = {step: (start, end) for step, _, start, end in spans}
    assert sorted(at) == [1, 2, 3, 4]
    assert at[2][0] < at[1][1] and at[1][0] < at[2][1]  # batches 1 and 2 in rollout at the same time
    assert len({thread for _, thread, _, _ in spans}) == 2
    assert all(0 <= line["async/rollout_idle_frac"] <= 1 for line in steps)


def test_two_lanes_on_the_bounded_schedule_keep_the_staleness_bound(tmp_path, capsys):
    run = _run(tmp_path, capsys, "bounded", *AGENT, "trainer.max_staleness=2", "trainer.steps=5",
               "trainer.rollout_lanes=2", "task.agent_calculator.tool_latency_s=0.02")
    steps = [line for line in _lines(run) if line["step"] > 0]
    assert len(steps) == 5
    assert all(0 <= line["step"] - 1 - line["async/policy_version"] <= 2 for line in steps)


def _error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("extra, why", [
    ([], "needs trainer.max_staleness >= 1"),
    (["trainer.max_staleness=0"], "needs trainer.max_staleness >= 1"),
    (["trainer.max_staleness=1", "trainer.backend=ray"], "on Ray set trainer.rollout_workers"),
    (["trainer.max_staleness=1", "algo.max_sampling_rounds=3"], "refill rounds"),
    (["trainer.max_staleness=1", "sampler.name=mopps"], "a prompt sampler that reads rewards"),
    (["trainer.max_staleness=1", "rollout.engine=vllm"], "an engine with its own weights"),
])
def test_lanes_that_cannot_draw_ahead_are_refused_in_one_line(tmp_path, capsys, extra, why):
    err = _error(capsys, ["train", *TINY, "trainer.rollout_lanes=2", *extra, f"trainer.out_dir={tmp_path}"])
    assert "trainer.rollout_lanes" in err and why in err
