"""The tiny asynchronous runs the async and score-ahead tests share: one `rlvr train` call, its
metric lines, and the bit-for-bit comparison of a synchronous run with an asynchronous one."""

from __future__ import annotations

import json

from rlvr.cli import main

TINY = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "task.heldout_size=4", "trainer.eval_every=0"]  # with trainer.threads (1 unless a test needs 2)
# Keys that measure wall-clock or memory (the async side holds a second copy of the weights).
CLOCK = ("time/", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/peak_rss_mb")
# Keys only the asynchronous loop logs: its own, and the per-token staleness of its batches.
ASYNC_ONLY = ("async/", "rollout/staleness_")


def _lines(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _run(tmp_path, capsys, name: str, *args: str):
    code = main(["train", *args, f"trainer.out_dir={tmp_path}", f"trainer.name={name}", "trainer.save_every=0"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return tmp_path / name


def _without_clock(line: dict) -> dict:
    return {k: v for k, v in line.items() if not k.startswith(CLOCK) and not k.startswith(ASYNC_ONLY)}


def _assert_same_run(sync_run, async_run):
    sync_lines, async_lines = _lines(sync_run), _lines(async_run)
    assert len(sync_lines) == len(async_lines) > 1
    for s, a in zip(sync_lines, async_lines):
        assert _without_clock(s) == _without_clock(a)  # exact float equality, key for key
        assert {k for k in a if k not in s} <= {k for k in a if k.startswith(ASYNC_ONLY)}
    assert (sync_run / "samples.jsonl").read_text() == (async_run / "samples.jsonl").read_text()
