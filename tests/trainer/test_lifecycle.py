"""The run lifecycle: SIGTERM/SIGINT end a run cleanly (run.json `interrupted` with the signal,
exit 143/130, a checkpoint that --resume continues from), never leaving `status: running`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = ["model.path=", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "task.heldout_size=4", "trainer.threads=1"]


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for_a_step(run: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.exists() and any(json.loads(line).get("step", 0) >= 1
                                    for line in metrics.read_text().splitlines() if line.strip()):
            return
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no training step was logged in time")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_run_cleanly_and_resume_continues(tmp_path, sig, code):
    run = tmp_path / "run"
    proc = _cli("train", *TINY, "trainer.steps=200", f"trainer.out_dir={tmp_path}", "trainer.name=run")
    _wait_for_a_step(run, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert f"stopped by {sig.name} after step" in out and "Traceback" not in out
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["signal"] == sig.name and info["exit_status"] == code
    stopped_at = info["final"]["step"]
    assert stopped_at >= 1 and (run / "checkpoints" / f"step_{stopped_at:06d}").is_dir()

    resumed = _cli("train", "--resume", str(run), f"trainer.steps={stopped_at + 1}")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["final"]["step"] == stopped_at + 1
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(stopped_at + 2))  # 0 (warm start) .. stopped_at + 1, none twice


def test_handlers_are_restored_after_training(tmp_path):
    from rlvr.config import load_config
    from rlvr.tracking.run_dir import RunDir
    from rlvr.trainer.sync import train

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    config = load_config(None, [*TINY, "trainer.steps=1"])
    train(config, RunDir(tmp_path / "run"), command=["test"], echo=lambda *a: None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
