"""One writer per run directory: a second `train` of a run being written is refused, two new runs
of one name get a directory each, a killed run's lock frees itself, and the commands that write
(report, export, runs compare/plot, sft) refuse paths inside a run, changing nothing.

The concurrent runs are real `python -m rlvr.cli` processes (one thread each) whose reward
function waits for a gate file, so the test decides when a run may step past its first rollout.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_runs import make_run

import rlvr
from rlvr.cli import main
from rlvr.tracking.lock import DirLock
from rlvr.tracking.run_dir import LOCK_FILE
from rlvr.trainer.checkpoint import save_checkpoint

SRC = Path(rlvr.__file__).resolve().parents[1]
TINY = ["trainer.eval_every=0", "task.heldout_size=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "trainer.threads=1", "trainer.save_every=1", "reward.timeout_s=0", "seed=1"]
GATED_REWARD = """import os, time

def score(prompt, completion, **example):
    while not os.path.exists({gate!r}):  # the test opens the gate when this run may go on
        time.sleep(0.02)
    return float(len(completion) % 3 == 0)
"""


@pytest.fixture
def gate(tmp_path) -> Path:
    """The gate file (open = it exists) and a reward function that waits for it."""
    gate = tmp_path / "gate"
    (tmp_path / "gated.py").write_text(GATED_REWARD.format(gate=str(gate)))
    gate.touch()
    return gate


def _config(tmp_path: Path, name: str) -> list[str]:
    return [*TINY, f"reward.fn={tmp_path / 'gated.py'}:score", f"trainer.out_dir={tmp_path / 'runs'}",
            f"trainer.name={name}"]


def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _holder(run: Path, timeout: float = 60.0) -> int:
    """The pid recorded in the run's lock file, once a process holds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads((run / LOCK_FILE).read_text())["pid"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    raise AssertionError(f"no process took the lock of {run} in {timeout}s")


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path -> sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_resume_of_a_run_being_written_is_refused_and_the_metrics_stay_whole(tmp_path, gate, capsys):
    run = tmp_path / "runs" / "r"
    assert main(["train", *_config(tmp_path, "r"), "trainer.steps=2"]) == 0, capsys.readouterr().err
    before = (run / "metrics.jsonl").read_text()
    gate.unlink()  # the resume that takes the run stops at its first reward, holding it
    procs = [_spawn("--resume", str(run), "trainer.steps=4") for _ in range(2)]
    try:
        holder = _holder(run)
        winner, loser = sorted(procs, key=lambda p: p.pid != holder)
        out, err = loser.communicate(timeout=120)
        assert loser.returncode == 2, out + err
        assert err.count("\n") == 1 and err.startswith(f"error: run directory '{run}' is being written by "
                                                       f"process {winner.pid} on "), err
        assert "cli.py train --resume" in err and "Traceback" not in err
        assert winner.poll() is None  # the holder was not disturbed
    finally:
        gate.touch()
    out, err = winner.communicate(timeout=120)
    assert winner.returncode == 0, out + err
    assert _steps(run) == [0, 1, 2, 3, 4]  # each step once, in order
    assert (run / "metrics.jsonl").read_text().startswith(before)
    assert not (run / LOCK_FILE).exists()  # released on the way out


def test_sft_refuses_an_out_folder_another_sft_is_writing(tmp_path, capsys):
    out = tmp_path / "warm"
    lock = DirLock(tmp_path / ".warm.lock")  # what a running `rlvr sft --out warm` holds
    lock.acquire("test")
    try:
        code = main(["sft", "model.path=", "sft.steps=1", "--out", str(out)])
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --out '{out}' is being written by process {os.getpid()} on "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, the lock file removed


def test_two_runs_of_one_name_started_at_once_get_a_directory_each(tmp_path, gate):
    procs = [_spawn(*_config(tmp_path, "same"), "trainer.steps=2") for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted((tmp_path / "runs").iterdir())
    assert [r.name for r in runs] == ["same", "same-2"]
    named = sorted(line.split(": ", 1)[1] for out, _ in outputs for line in out.splitlines()
                   if line.startswith("run directory: "))
    assert named == [str(r) for r in runs]  # each process wrote the directory it named
    for r in runs:
        assert _steps(r) == [0, 1, 2]
        info = json.loads((r / "run.json").read_text())
        assert info["status"] == "finished" and info["final"]["step"] == 2
        assert sorted(p.name for p in (r / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_the_lock_of_a_killed_run_does_not_stop_the_next_resume(tmp_path, gate, capsys):
    run = tmp_path / "runs" / "k"
    assert main(["train", *_config(tmp_path, "k"), "trainer.steps=2"]) == 0, capsys.readouterr().err
    gate.unlink()
    victim = _spawn("--resume", str(run), "trainer.steps=4")
    assert _holder(run) == victim.pid
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == victim.pid  # left behind, naming a dead process
    gate.touch()
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 0, capsys.readouterr().err
    assert _steps(run) == [0, 1, 2, 3, 4]
    assert not (run / LOCK_FILE).exists()


@pytest.mark.parametrize("argv", [
    ["report", "{run}", "--out", "{run}/metrics.jsonl"],
    ["report", "{run}", "--out", "{run}/checkpoints/report.html"],
    ["report", "{run}", "--out", "{other}/report.html"],
    ["export", "{run}", "{run}", "--force"],
    ["export", "{run}", "{run}/checkpoints", "--force"],
    ["export", "{run}", "{root}", "--force"],
    ["export", "{run}", "{other}/hf"],
    ["runs", "compare", "{run}", "--out", "{run}"],
    ["runs", "plot", "{run}", "--out", "{run}/metrics.jsonl"],
    ["sft", "model.path=", "sft.steps=1", "--out", "{run}/checkpoints", "--overwrite"],
], ids=lambda argv: " ".join(argv))
def test_commands_refuse_to_write_inside_a_run_and_change_nothing(argv, tmp_path, capsys, tiny_model, tokenizer):
    root = tmp_path / "runs"
    run, other = make_run(root, "a_s0", seed=0, steps=4), make_run(root, "b_s0", seed=0, steps=4)
    save_checkpoint(run / "checkpoints", 4, tiny_model, tokenizer, {"optimizer": {}}, keep_last=1)  # exportable
    before = _snapshot(tmp_path)
    code = main([a.format(run=run, other=other, root=root) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert "inside the run directory" in err or "holds the run directory" in err, err
    assert _snapshot(tmp_path) == before


def test_the_report_still_goes_into_its_own_run_by_default(tmp_path, capsys):
    run = make_run(tmp_path / "runs", "a_s0", seed=0, steps=4)
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    assert main(["report", str(run), "--out", str(run / "report.html")]) == 0, capsys.readouterr().err
    assert (run / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
