"""Inputs that once trained something other than what the user meant, without a word: each now
refuses with the field and the fix, or warns and does the meant thing. Each test first shows the
old reading (a canary) where it can be shown without the fix."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.errors import ConfigError, RewardError
from rlvr.rewards.runner import RewardRunner
from rlvr.tasks.dataset import DatasetTask
from rlvr.tasks.files import MathFileTask
from rlvr.types import Example

TINY = ["model.path=", "model.hidden_size=16", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=32", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "task.heldout_size=2", "trainer.threads=1", "trainer.steps=1",
        "trainer.eval_every=0", "trainer.save_every=1"]


def test_a_side_metric_named_mean_is_refused():
    """{"reward": r, "mean": m} once replaced reward/<fn>/mean, the reported mean, by m."""
    runner = RewardRunner(lambda p, c, **ex: {"reward": 1.0, "mean": 0.0}, name="user")
    with pytest.raises(RewardError, match=r"dict reward key 'mean' is the name of rlvr's own metric "
                                          r"reward/user/mean; rename that key"):
        runner(["p", "q"], ["a", "b"], [{}, {}])
    fine = RewardRunner(lambda p, c, **ex: {"reward": 1.0, "format": 0.0}, name="user")(["p"], ["a"], [{}])
    assert fine.metrics["user/mean"] == 1.0 and fine.metrics["user/format"] == 0.0


def _task(correct_fn) -> DatasetTask:
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    return DatasetTask(rows, reward=lambda *a, **k: 1.0, correct_fn=correct_fn, heldout_size=2)


def test_correct_fn_returning_a_score_is_refused():
    assert bool(0.5)  # canary: what `bool(correct_fn(...))` made of a graded score: correct
    example = Example("q1", "1", {})
    with pytest.raises(ConfigError, match=r"correct_fn: returned '0.5', not True or False"):
        _task(lambda p, c, **k: 0.5).is_correct("x", example)
    with pytest.raises(ConfigError, match="correct_fn: returned 'None'"):
        _task(lambda p, c, **k: None).is_correct("x", example)
    assert _task(lambda p, c, **k: c == "1").is_correct("1", example) is True
    assert _task(lambda p, c, **k: 0).is_correct("1", example) is False


def _data(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(("line", "words"), [
    ('{"question": "1+1?", "answer": "2", "answer": "3"}', "key 'answer' given twice in one row"),
    ('{"question": "1+1?", "answer": NaN}', "NaN is not a JSON value"),
    ('{"question": "1+1?", "answer": Infinity}', "Infinity is not a JSON value"),
])
def test_data_rows_python_reads_silently_are_refused(line, words, tmp_path):
    assert json.loads(line)  # canary: Python's json reads it (the last key wins; NaN is a float)
    path = _data(tmp_path / "d.jsonl", ['{"question": "2+2?", "answer": "4"}', line])
    with pytest.raises(ConfigError, match=f"d.jsonl:2: {words}"):
        MathFileTask(path=str(path), heldout_size=1)


def test_a_held_out_file_equal_to_the_training_file_is_refused(tmp_path):
    rows = [json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) for i in range(6)]
    train = _data(tmp_path / "train.jsonl", rows)
    copy = shutil.copy(train, tmp_path / "copy.jsonl")
    for heldout in (train, copy):
        with pytest.raises(ConfigError, match="task.math_file.heldout_path: every held-out prompt is also a "
                                              "training prompt"):
            MathFileTask(path=str(train), heldout_path=str(heldout))
    other = _data(tmp_path / "other.jsonl", [json.dumps({"question": "9+9?", "answer": "18"})])
    assert len(MathFileTask(path=str(train), heldout_path=str(other)).heldout()) == 1


def test_a_named_pipe_as_data_file_is_refused_without_hanging(tmp_path):
    """Once read once by the loader, then opened again by the manifest's fingerprint: forever."""
    fifo = tmp_path / "d.jsonl"
    os.mkfifo(fifo)
    out = {}

    def load():
        try:
            MathFileTask(path=str(fifo), heldout_size=1)
        except ConfigError as err:
            out["err"] = str(err)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "loading a named pipe as a data file hung"
    assert "is a named pipe, not a regular file" in out["err"] and "task.math_file.path" in out["err"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    assert main(["train", *TINY, f"trainer.out_dir={root}", "trainer.name=r"]) == 0
    return root / "r"


def test_a_resume_that_changes_the_sampler_starts_it_fresh(trained, tmp_path, capsys):
    """The checkpoint holds the uniform sampler's state ({}): loading it into VADE was a KeyError."""
    run = Path(shutil.copytree(trained, tmp_path / "r"))
    capsys.readouterr()
    code = main(["train", "--resume", str(run), "--allow-config-change", "trainer.steps=2", "sampler.name=vade"])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    assert "the checkpoint holds no sampler state that fits this config" in err
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "reward/mean" in m] == [1, 2]
    assert not math.isnan(lines[-1]["reward/mean"])


def test_a_resume_that_changes_the_learning_rate_trains_with_it(trained, tmp_path, capsys):
    """The saved optimizer and schedule held the old rate: `optim.lr` changed on resume was recorded
    in run.json and then ignored (step 2 trained at 3e-5, the old 1e-4's warmup)."""
    run = Path(shutil.copytree(trained, tmp_path / "r"))
    assert main(["train", "--resume", str(run), "--allow-config-change", "trainer.steps=2", "optim.lr=1e-2"]) == 0
    lines = {m["step"]: m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert lines[1]["actor/lr"] == pytest.approx(2e-5)  # step 1: 1e-4 in a 10-step warmup (2/10)
    assert lines[2]["actor/lr"] == pytest.approx(3e-3)  # step 2: the new 1e-2, same warmup (3/10)


def test_a_resume_that_changes_a_fixed_kl_coefficient_trains_with_it(trained, tmp_path):
    """The checkpoint's coefficient (0, KL off) replaced the new fixed one; only an adaptive
    coefficient (`algo.kl_target`) is state to restore."""
    run = Path(shutil.copytree(trained, tmp_path / "r"))
    assert main(["train", "--resume", str(run), "--allow-config-change", "trainer.steps=2", "algo.kl_coef=0.05"]) == 0
    lines = {m["step"]: m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert lines[2].get("kl/coef") == 0.05
